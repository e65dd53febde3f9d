"""The layer rule, as a test: imports point down, never up.

    cli -> reproductions -> suites -> components
    reports read records and the catalog only
    runtime, records, catalog: below everything (they import no layer)

Every ``import`` and ``from ... import`` in the installed packages is read with ``ast`` (those
inside functions too: a lazy import is still a dependency) and each edge between two packages
is checked against ALLOWED.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# package -> folder in the repository (pyproject.toml's package-dir)
FOLDERS = {
    "moe_repro.catalog": "catalog",
    "moe_repro.records": "records",
    "moe_repro.runtime": "runtime",
    "moe_repro.components": "components",
    "moe_repro.suites": "suites",
    "moe_repro.reproductions": "reproductions",
    "moe_repro.reports": "reports",
    "moe_repro.cli": "moe_repro/cli",
}

# Which packages each package may import (besides itself). The root package ``moe_repro``
# holds only the version string and may be imported by anyone.
ALLOWED = {
    "moe_repro.catalog": set(),
    "moe_repro.records": set(),
    "moe_repro.runtime": {"moe_repro.records"},
    "moe_repro.components": {"moe_repro.runtime"},
    "moe_repro.suites": {"moe_repro.components", "moe_repro.runtime", "moe_repro.records",
                         "moe_repro.catalog"},
    # No runtime: a reproduction measures by running suites, never by launching ranks itself.
    "moe_repro.reproductions": {"moe_repro.suites", "moe_repro.components", "moe_repro.records",
                                "moe_repro.catalog"},
    # Reports render records; they never import live registries of suites or specs.
    "moe_repro.reports": {"moe_repro.records", "moe_repro.catalog"},
    "moe_repro.cli": {"moe_repro.reproductions", "moe_repro.suites", "moe_repro.components",
                      "moe_repro.reports", "moe_repro.records", "moe_repro.runtime",
                      "moe_repro.catalog"},
}


def package_of(module: str) -> str | None:
    """The layer package a dotted module name belongs to (None: outside the project, or root)."""
    for package in sorted(ALLOWED, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            return package
    return None


def module_name(path: Path, package: str, folder: Path) -> str:
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def imports_of(path: Path, module: str) -> list[str]:
    """Every module ``path`` imports, absolute dotted names (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append(target)
            if target == "moe_repro" or target in FOLDERS:
                # ``from moe_repro import reports`` names a package, not a symbol
                found += [f"{target}.{alias.name}" for alias in node.names]
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    graph: dict[str, set[str]] = {}
    for package, folder in FOLDERS.items():
        root = REPO / folder
        if not root.is_dir():
            continue
        for path in root.rglob("*.py"):
            module = module_name(path, package, root)
            graph[module] = {t for t in imports_of(path, module) if t.startswith("moe_repro")}
    return graph


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    """Every edge from one layer package into another that ALLOWED does not permit."""
    bad = []
    for module, targets in sorted(graph.items()):
        source = package_of(module)
        for target in sorted(targets):
            into = package_of(target)
            if source is None or into is None or into == source:
                continue
            if into not in ALLOWED[source]:
                bad.append(f"{module} -> {target} ({source} may import only "
                           f"{', '.join(sorted(ALLOWED[source])) or 'nothing of the project'})")
    return bad


def test_imports_point_down():
    graph = import_graph()
    assert len(graph) > 100, "the walk found too few modules: is FOLDERS up to date?"
    bad = upward_edges(graph)
    assert not bad, "upward imports:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("module, target", [
    ("moe_repro.components.moe.moe_layer", "moe_repro.suites.runner"),       # component -> suite
    ("moe_repro.components.training.pp_ep_trainer", "moe_repro.cli.errors"),  # component -> CLI
    ("moe_repro.reports.site", "moe_repro.reproductions"),                  # report -> live registry
    ("moe_repro.reports.site", "moe_repro.suites.base"),
    ("moe_repro.records.gate", "moe_repro.suites.stats"),                   # infrastructure -> layer
    ("moe_repro.runtime.launch", "moe_repro.components.network.topology"),
    ("moe_repro.reproductions.mop_llep", "moe_repro.runtime.launch"),       # a spec launching ranks
])
def test_the_rule_fails_on_an_upward_edge(module, target):
    # A synthetic graph with one forbidden edge added: the check must name it.
    graph = {"moe_repro.components.moe.pft": {"moe_repro.runtime.launch"}, module: {target}}
    bad = upward_edges(graph)
    assert len(bad) == 1 and bad[0].startswith(f"{module} -> {target}")


def test_allowed_downward_edges_pass():
    graph = {"moe_repro.suites.alltoall": {"moe_repro.components.alltoall.flat",
                                           "moe_repro.runtime.launch"},
             "moe_repro.cli.run_cmd": {"moe_repro.reproductions.spec", "moe_repro.reports.site"},
             "moe_repro.reports.site": {"moe_repro.records.record", "moe_repro.catalog"},
             "moe_repro.components.moe.pft": {"torch"}}
    assert upward_edges(graph) == []


def test_relative_imports_are_resolved(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("from .base import Suite\nfrom ..components import moe\n")
    found = imports_of(f, "moe_repro.suites.x")
    assert found[0] == "moe_repro.suites.base"
    assert "moe_repro.components.moe" in found  # a package named in a from-import
