import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    """A private results store for the test (the CLI reads MOE_REPRO_RESULTS)."""
    d = tmp_path / "results"
    monkeypatch.setenv("MOE_REPRO_RESULTS", str(d))
    return d


@pytest.fixture
def targets_on_path(monkeypatch):
    """Make tests/_launch_targets.py importable by rank processes started by the launcher."""
    old = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", str(TESTS) + (os.pathsep + old if old else ""))
    monkeypatch.syspath_prepend(str(TESTS))
    return TESTS
