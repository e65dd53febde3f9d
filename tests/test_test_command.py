"""The test command (issue 53): the README's quick command leaves the heavy tests out, CI runs
that very command and then the heavy set, so every test runs in CI once; the heavy list
(tests/_heavy.py) names tests that exist."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import _heavy
from conftest import patient

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
QUICK = 'python -m pytest -q -m "not heavy" --durations=15'
HEAVY = "python -m pytest -q -m heavy --durations=15"


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _ci_commands() -> list[str]:
    """.ci/run's command lines, comments cut."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [re.split(r"\s+#", line)[0].strip() for line in lines if line.strip()]


def test_every_heavy_name_exists():
    missing = [m for m in _heavy.MODULES if not (TESTS / m).exists()]
    for module, functions in _heavy.TESTS.items():
        path = TESTS / module
        known = _functions(path) if path.exists() else set()
        missing += [f"{module}::{f}" for f in functions if f not in known]
    assert not missing, f"tests/_heavy.py names tests that do not exist: {missing}"


def test_heavy_is_decided_by_marker_module_and_name():
    assert _heavy.is_heavy("test_x.py", "test_a", {"multiprocess"})
    assert _heavy.is_heavy("test_x.py", "test_a", {"slow", "timing"})
    assert _heavy.is_heavy("test_site_browser.py", "test_anything", set())
    module, functions = next(iter(_heavy.TESTS.items()))
    assert _heavy.is_heavy(module, functions[0], set())
    assert not _heavy.is_heavy(module, "test_not_listed", {"timing"})
    assert not _heavy.is_heavy("test_x.py", functions[0], set())


def test_conftest_marks_at_collection_so_m_selects_the_two_halves(tmp_path):
    """A scratch suite under this conftest's collection hook: -m heavy and -m "not heavy" split
    it exactly."""
    (tmp_path / "conftest.py").write_text(
        "import importlib.util, sys\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "spec = importlib.util.spec_from_file_location(\n"
        f"    'moe_repro_tests_conftest', {str(TESTS / 'conftest.py')!r}\n"
        ")\n"
        "real = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(real)\n"
        "pytest_collection_modifyitems = real.pytest_collection_modifyitems\n"
    )
    module, functions = next(iter(_heavy.TESTS.items()))
    (tmp_path / module).write_text(f"def {functions[0]}(): pass\ndef test_light(): pass\n")
    (tmp_path / next(iter(_heavy.MODULES))).write_text("def test_any(): pass\n")
    (tmp_path / "test_marked.py").write_text(
        "import pytest\n@pytest.mark.multiprocess\ndef test_ranks(): pass\ndef test_plain(): pass\n"
    )

    def collected(selection: str) -> set[str]:
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
            + ["-W", "ignore::pytest.PytestUnknownMarkWarning", "-m", selection],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=patient(60),
        )
        assert r.returncode == 0, r.stdout + r.stderr
        return {line.split("::")[1] for line in r.stdout.splitlines() if "::" in line}

    heavy, quick = collected("heavy"), collected("not heavy")
    assert heavy == {functions[0], "test_any", "test_ranks"}
    assert quick == {"test_light", "test_plain"}


def test_the_readme_test_command_is_the_quick_one_and_ci_runs_it_then_the_heavy_set():
    readme = (ROOT / "README.md").read_text()
    install_test = [
        " ".join(line.split())
        for line in readme.splitlines()
        if line.startswith("python3 -m venv") and "pytest" in line
    ]
    assert install_test and all(line.endswith(QUICK) for line in install_test), install_test
    ci = _ci_commands()
    assert QUICK in ci, ".ci/run must run the README's test command as written"
    assert HEAVY in ci, ".ci/run must run the heavy set"
    assert ci.index(QUICK) < ci.index(HEAVY)
    # no other full-suite pytest run: each test runs once (the timing step selects -m timing)
    others = [c for c in ci if c.startswith("python -m pytest") and c not in (QUICK, HEAVY)]
    assert all("-m timing" in c for c in others), others


@pytest.mark.parametrize("command", [QUICK, HEAVY, "python -m pytest -q --durations=15"])
def test_the_readme_gives_each_command(command):
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"`{command}`" in readme or command in readme
