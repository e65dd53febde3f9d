import os
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def signals_as_from_a_terminal() -> None:
    """Give SIGINT and SIGHUP their terminal dispositions in this process, and so in every
    process it starts. Tests send them to the runs they start, as a user's Ctrl-C or a closed
    terminal would; a test run started in the background (``nohup``, ``&`` in a script, some CI
    runners) inherits them ignored, and every child would ignore them too (by design: repro keeps
    an inherited SIG_IGN, as nohup asks)."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


signals_as_from_a_terminal()

# How many times slower than an idle 2-core machine a test run may be and still pass (a shared
# CI runner, other jobs on the machine). Every hang guard and every timeout of a test's real
# processes is an idle machine's need times this factor: ``patient(seconds)``. A timeout only
# ends a hang, so a generous one costs nothing while the tests pass. Set
# MOE_REPRO_TEST_SLOWDOWN higher on a slower machine (an emulator, a sanitizer build).
SLOWDOWN = float(os.environ.get("MOE_REPRO_TEST_SLOWDOWN", "10"))


def patient(seconds: float) -> float:
    """``seconds`` (enough on an idle machine) scaled by SLOWDOWN: a hang guard's or a real
    process's timeout that a slow, busy machine does not reach."""
    return seconds * SLOWDOWN


class FakeClock:
    """A clock for timing logic under test: it reads the seconds it was moved by, so the logic
    is checked exactly, at any machine load. Pass it where a clock is taken (e.g.
    runtime/timing.HostTimer(fake_clock))."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_clock():
    return FakeClock()


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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the heavy tests (tests/_heavy.py says which and why) before ``-m`` selects: the
    README's quick command leaves them out (``-m "not heavy"``), CI runs them after it."""
    from _heavy import is_heavy

    for item in items:
        function = getattr(item, "originalname", None) or item.name.split("[")[0]
        markers = {m.name for m in item.iter_markers()}
        if is_heavy(item.path.name, function, markers):
            item.add_marker(pytest.mark.heavy)


@pytest.fixture(autouse=True)
def _own_kernel_table(tmp_path, monkeypatch):
    """Each test reads and writes its own (empty) ``auto`` kernel table, never the machine's
    (components/moe/kernel_choice.py): ``auto`` takes the documented fallback rule unless the
    test writes a table."""
    monkeypatch.setenv("MOE_REPRO_KERNEL_TABLE", str(tmp_path / "kernel-table.json"))
    from moe_repro.components.moe import kernel_choice

    kernel_choice.load_table.cache_clear()
