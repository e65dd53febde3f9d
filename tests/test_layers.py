"""The layer rule, as a test: imports point down, never up.

    cli -> reproductions -> suites -> components
    reports read records and the catalog only
    runtime, records, catalog: below everything (they import no layer)
    inside components/: COMPONENT_ORDER, each unit importing only units before it

Every ``import`` and ``from ... import`` in the installed packages is read with ``ast`` (those
inside functions too: a lazy import is still a dependency), and so is every import made by
name at run time (``importlib.import_module("...")``, ``__import__("...")``, the project's
``lazy_module("...")``). The packages and their folders come from pyproject.toml (``packages``
and ``package-dir``): a package that is installed but has no place in ALLOWED, or a
sub-package of components/ missing from COMPONENT_ORDER, fails the test instead of being
skipped. Each edge between two packages is checked against ALLOWED, each edge between two units
of components/ against COMPONENT_ORDER, and the module graph must have no import cycle.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Which packages each package may import (besides itself). The root package ``moe_repro``
# holds only the version string and may be imported by anyone.
ALLOWED = {
    "moe_repro.catalog": set(),
    "moe_repro.records": set(),
    "moe_repro.runtime": {"moe_repro.records"},
    # DESIGN.md: runtime and records are the infrastructure every layer may use (components
    # read a platform profile through records' bounded reader).
    "moe_repro.components": {"moe_repro.runtime", "moe_repro.records"},
    "moe_repro.suites": {
        "moe_repro.components",
        "moe_repro.runtime",
        "moe_repro.records",
        "moe_repro.catalog",
    },
    # No runtime: a reproduction measures by running suites, never by launching ranks itself.
    "moe_repro.reproductions": {
        "moe_repro.suites",
        "moe_repro.components",
        "moe_repro.records",
        "moe_repro.catalog",
    },
    # Reports render records; they never import live registries of suites or specs.
    "moe_repro.reports": {"moe_repro.records", "moe_repro.catalog"},
    "moe_repro.cli": {
        "moe_repro.reproductions",
        "moe_repro.suites",
        "moe_repro.components",
        "moe_repro.reports",
        "moe_repro.records",
        "moe_repro.runtime",
        "moe_repro.catalog",
    },
}

# The units of components/ (its sub-packages and top-level modules), lowest first: a unit may
# import only units before it. The communicators sit in network (topology builds them), the
# algorithms above it and the simulator glue with them (alltoall/simulated.py), the layer
# above the algorithms, and the activation-memory meter with the training code it uses.
COMPONENT_ORDER = [
    "lazy_import",
    "provenance",
    "torch_cpu_random",
    "network",
    "alltoall",
    "moe",
    "model",
    "resources",
    "training",
    "balance",
]


def pyproject_packages(text: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(installed packages, package -> folder in the repository) from pyproject.toml."""
    doc = tomllib.loads(text if text is not None else (REPO / "pyproject.toml").read_text())
    setup = doc["tool"]["setuptools"]
    package_dir = setup.get("package-dir", {})
    folders = {}
    for package in setup["packages"]:
        # the longest package-dir entry that is this package or a parent of it
        owner = max(
            (p for p in package_dir if package == p or package.startswith(p + ".")),
            key=len,
            default=None,
        )
        rest = package[len(owner) + 1 :].split(".") if owner and package != owner else []
        folders[package] = "/".join(
            [package_dir[owner] if owner else package.replace(".", "/"), *rest]
        )
    return list(setup["packages"]), folders


def unmapped_packages(packages: list[str]) -> list[str]:
    """Installed packages that belong to no layer of ALLOWED (the root excepted)."""
    return [p for p in packages if p != "moe_repro" and package_of(p) is None]


def layer_folders(folders: dict[str, str]) -> dict[str, str]:
    """layer package -> its folder (the packages ALLOWED names)."""
    return {p: folders[p] for p in ALLOWED if p in folders}


FOLDERS = layer_folders(pyproject_packages()[1])


def package_of(module: str) -> str | None:
    """The layer package a dotted module name belongs to (None: outside the project, or root)."""
    for package in sorted(ALLOWED, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            return package
    return None


def component_unit(module: str) -> str | None:
    """The unit of components/ a module belongs to: ``moe_repro.components.moe.pft`` -> "moe"
    (None: outside components/, or the components package itself)."""
    prefix = "moe_repro.components."
    return module[len(prefix) :].split(".")[0] if module.startswith(prefix) else None


def module_name(path: Path, package: str, folder: Path) -> str:
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


# Calls that import a module named by a string: importlib.import_module, __import__, and the
# project's lazy_module (components/lazy_import.py).
IMPORTING_CALLS = {"import_module", "__import__", "lazy_module"}


def _called_name(func) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def imports_of(path: Path, module: str) -> list[str]:
    """Every module ``path`` imports, absolute dotted names (relative imports resolved), those
    imported by name through importlib, __import__ or lazy_module included."""
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
            # ``from moe_repro import reports`` or ``from pkg import submodule`` names a module
            # (kept where it is one: import_graph drops names that are not modules)
            found += [f"{target}.{alias.name}" for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Call) and _called_name(node.func) in IMPORTING_CALLS:
            if (
                node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.append(node.args[0].value)
    return found


def import_graph(folders: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module -> the project modules (and packages) it imports."""
    graph: dict[str, set[str]] = {}
    for package, folder in (FOLDERS if folders is None else folders).items():
        root = REPO / folder
        if not root.is_dir():
            continue
        for path in root.rglob("*.py"):
            module = module_name(path, package, root)
            graph[module] = {t for t in imports_of(path, module) if t.startswith("moe_repro")}
    # ``from pkg import name``: keep pkg.name only where it is a module of the project
    # (a dunder name from the root package, e.g. __version__, is not a module either); a
    # package's __init__ importing its own submodules by ``from pkg import sub`` is no self-edge
    for module, targets in graph.items():
        graph[module] = {
            t
            for t in targets
            if t != module
            and not t.startswith("moe_repro.__")
            and (t in graph or t == "moe_repro" or t.rsplit(".", 1)[0] not in graph)
        }
    return graph


def unknown_targets(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a project module that belongs to no layer (a package missing from the map)."""
    return [
        f"{m} -> {t}"
        for m, ts in sorted(graph.items())
        for t in sorted(ts)
        if t != "moe_repro" and package_of(t) is None
    ]


def component_order_violations(graph: dict[str, set[str]]) -> list[str]:
    """Edges inside components/ from a unit to a unit not before it in COMPONENT_ORDER, and
    units missing from COMPONENT_ORDER."""
    bad = []
    for module, targets in sorted(graph.items()):
        source = component_unit(module)
        if source is None:
            continue
        if source not in COMPONENT_ORDER:
            bad.append(f"{module}: unit {source!r} is missing from COMPONENT_ORDER")
            continue
        for target in sorted(targets):
            into = component_unit(target)
            if into is None or into == source:
                continue
            if into not in COMPONENT_ORDER:
                bad.append(f"{module} -> {target}: unit {into!r} is missing from COMPONENT_ORDER")
            elif COMPONENT_ORDER.index(into) > COMPONENT_ORDER.index(source):
                bad.append(f"{module} -> {target} ({source} sits below {into} in components/)")
    return bad


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other in a circle (strongly connected components of
    more than one module, or a module importing itself), by Tarjan's algorithm."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    counter = 0

    def visit(v):
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1 or v in graph.get(v, ()):
                cycles.append(sorted(members))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


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
                bad.append(
                    f"{module} -> {target} ({source} may import only "
                    f"{', '.join(sorted(ALLOWED[source])) or 'nothing of the project'})"
                )
    return bad


def test_imports_point_down():
    graph = import_graph()
    assert len(graph) > 100, "the walk found too few modules: is FOLDERS up to date?"
    bad = upward_edges(graph)
    assert not bad, "upward imports:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize(
    "module, target",
    [
        ("moe_repro.components.moe.moe_layer", "moe_repro.suites.runner"),  # component -> suite
        ("moe_repro.components.training.pp_ep_trainer", "moe_repro.cli.errors"),  # component -> CLI
        ("moe_repro.reports.site", "moe_repro.reproductions"),  # report -> live registry
        ("moe_repro.reports.site", "moe_repro.suites.base"),
        ("moe_repro.records.gate", "moe_repro.suites.stats"),  # infrastructure -> layer
        ("moe_repro.runtime.launch", "moe_repro.components.network.topology"),
        ("moe_repro.reproductions.mop_llep", "moe_repro.runtime.launch"),  # a spec launching ranks
    ],
)
def test_the_rule_fails_on_an_upward_edge(module, target):
    # A synthetic graph with one forbidden edge added: the check must name it.
    graph = {"moe_repro.components.moe.pft": {"moe_repro.runtime.launch"}, module: {target}}
    bad = upward_edges(graph)
    assert len(bad) == 1 and bad[0].startswith(f"{module} -> {target}")


def test_allowed_downward_edges_pass():
    graph = {
        "moe_repro.suites.alltoall": {
            "moe_repro.components.alltoall.flat",
            "moe_repro.runtime.launch",
        },
        "moe_repro.cli.run_cmd": {"moe_repro.reproductions.spec", "moe_repro.reports.site"},
        "moe_repro.reports.site": {"moe_repro.records.record", "moe_repro.catalog"},
        "moe_repro.components.moe.pft": {"torch"},
    }
    assert upward_edges(graph) == []


def test_relative_imports_are_resolved(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("from .base import Suite\nfrom ..components import moe\n")
    found = imports_of(f, "moe_repro.suites.x")
    assert found[0] == "moe_repro.suites.base"
    assert "moe_repro.components.moe" in found  # a package named in a from-import


# --- the map from pyproject, the order inside components/, cycles, imports by name ---------


def test_every_installed_package_has_a_place_in_the_map():
    packages, folders = pyproject_packages()
    assert not unmapped_packages(packages), unmapped_packages(packages)
    assert set(FOLDERS) == set(ALLOWED), "a layer of ALLOWED is not installed by pyproject.toml"
    assert all((REPO / folder).is_dir() for folder in folders.values())
    graph = import_graph()
    assert not unknown_targets(graph), unknown_targets(graph)
    # every unit of components/ (sub-package or module) is placed in the order
    units = {
        p.stem if p.is_file() else p.name
        for p in (REPO / FOLDERS["moe_repro.components"]).iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert units == set(COMPONENT_ORDER)


def test_components_keep_their_order_and_nothing_imports_in_a_circle():
    graph = import_graph()
    bad = component_order_violations(graph)
    assert not bad, "imports against the order inside components/:\n  " + "\n  ".join(bad)
    cycles = import_cycles(graph)
    assert not cycles, f"import cycles: {cycles}"


def test_a_package_missing_from_its_map_fails():
    text = (
        (REPO / "pyproject.toml")
        .read_text()
        .replace('packages = ["moe_repro",', 'packages = ["moe_repro", "moe_repro.plugins",', 1)
    )
    packages, folders = pyproject_packages(text)
    assert "moe_repro.plugins" in packages and folders["moe_repro.plugins"] == "moe_repro/plugins"
    assert unmapped_packages(packages) == ["moe_repro.plugins"]
    # an import of it from a mapped package is named, not skipped
    graph = {"moe_repro.suites.x": {"moe_repro.plugins.extra"}}
    assert unknown_targets(graph) == ["moe_repro.suites.x -> moe_repro.plugins.extra"]
    # a new unit of components/ with no place in the order
    bad = component_order_violations(
        {"moe_repro.components.fresh.thing": {"moe_repro.components.moe.pft"}}
    )
    assert len(bad) == 1 and "'fresh' is missing from COMPONENT_ORDER" in bad[0]


def test_a_planted_importlib_upward_import_fails(tmp_path):
    f = tmp_path / "sneaky.py"
    f.write_text(
        "import importlib\n\n\ndef later():\n"
        "    return importlib.import_module('moe_repro.suites.runner')\n"
        "\n\ndef also():\n    return __import__('moe_repro.cli.errors')\n"
    )
    module = "moe_repro.components.moe.sneaky"
    found = imports_of(f, module)
    assert "moe_repro.suites.runner" in found and "moe_repro.cli.errors" in found
    bad = upward_edges({module: {t for t in found if t.startswith("moe_repro")}})
    assert [b.split(" (")[0] for b in bad] == [
        f"{module} -> moe_repro.cli.errors",
        f"{module} -> moe_repro.suites.runner",
    ]
    # the project's own lazy importer counts too
    f.write_text(
        "from moe_repro.components.lazy_import import lazy_module\n"
        "runner = lazy_module('moe_repro.suites.runner', globals())\n"
    )
    assert "moe_repro.suites.runner" in imports_of(f, module)


def test_a_planted_cycle_inside_components_fails():
    # network below alltoall: the topology importing the flat all-to-all breaks the order, and
    # with the way back it is a cycle
    up = {
        "moe_repro.components.network.topology": {"moe_repro.components.alltoall.flat"},
        "moe_repro.components.alltoall.flat": {"moe_repro.components.network.topology"},
    }
    bad = component_order_violations(up)
    assert bad == [
        "moe_repro.components.network.topology -> moe_repro.components.alltoall.flat "
        "(network sits below alltoall in components/)"
    ]
    assert import_cycles(up) == [sorted(up)]
    # a cycle inside one unit breaks no order but is still found
    inner = {
        "moe_repro.components.moe.a": {"moe_repro.components.moe.b"},
        "moe_repro.components.moe.b": {"moe_repro.components.moe.c"},
        "moe_repro.components.moe.c": {"moe_repro.components.moe.a"},
    }
    assert component_order_violations(inner) == []
    assert import_cycles(inner) == [sorted(inner)]
    # and the real graph with one planted edge
    graph = import_graph()
    graph["moe_repro.components.network.topology"] = graph[
        "moe_repro.components.network.topology"
    ] | {"moe_repro.components.moe.moe_layer"}
    assert import_cycles(graph) and component_order_violations(graph)
