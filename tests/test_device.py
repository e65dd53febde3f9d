"""The one device rule (runtime/device.py), --device on every suite, and honest timing
(runtime/timing.py): no host clock times device work."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from moe_repro.runtime import device as dev
from moe_repro.runtime import timing

REPO = Path(__file__).resolve().parent.parent
HAS_GPU = torch.cuda.is_available()


def world(backend: str, local_rank: int):
    return SimpleNamespace(backend=backend, local_rank=local_rank)


# --- the rule ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "backend,local_rank,expected",
    [("nccl", 0, "cuda:0"), ("nccl", 3, "cuda:3"), ("gloo", 3, "cpu"), ("mpi", 1, "cpu")],
)
def test_a_ranks_device_follows_its_backend_and_local_rank(backend, local_rank, expected):
    assert str(dev.rank_device(backend, local_rank)) == expected
    assert str(dev.resolve_device("auto", world(backend, local_rank))) == expected


def test_launcher_context_carries_the_rule():
    from moe_repro.runtime.launch import RankContext

    # rank 5 of 8 at 4 per node: local rank 1
    assert str(RankContext(5, 8, 4, "nccl").device) == "cuda:1"
    assert str(RankContext(5, 8, 4, "gloo").device) == "cpu"


def test_a_device_that_disagrees_with_the_worlds_backend_is_refused():
    with pytest.raises(ValueError, match="gloo world's ranks run on cpu|ranks run on cpu"):
        dev.resolve_device("cuda", world("gloo", 0))
    with pytest.raises(ValueError, match="use --backend nccl"):
        dev.check_world_device("cuda", "gloo")
    with pytest.raises(ValueError, match="use --backend gloo"):
        dev.check_world_device("cpu", "nccl")
    dev.check_world_device("auto", "gloo")  # auto always agrees
    dev.check_world_device("cuda:1", "nccl")


def test_single_process_auto_is_the_gpu_when_there_is_one():
    assert dev.resolve_device("auto").type == ("cuda" if HAS_GPU else "cpu")
    assert str(dev.resolve_device("cpu")) == "cpu"


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused_in_one_line():
    with pytest.raises(ValueError) as e:
        dev.resolve_device("cuda")
    assert "no CUDA GPU" in str(e.value) and "\n" not in str(e.value)
    assert dev.auto_backend(2) == (None, "no GPU")


def test_auto_backend_picks_nccl_only_when_every_rank_has_a_gpu(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(dev, "cuda_count", lambda: 8)
    assert dev.auto_backend(8)[0] == "nccl"
    assert dev.auto_backend(9)[0] is None  # one rank would share a GPU
    monkeypatch.setattr(dev, "cuda_count", lambda: 0)
    assert dev.auto_backend(1)[0] is None


def test_alltoall_auto_backend_is_nccl_on_a_gpu_node_unless_the_cpu_is_asked_for(monkeypatch):
    from moe_repro.suites.alltoall import choose_backend

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(dev, "cuda_count", lambda: 2)
    assert choose_backend("auto", 2)[0] == "nccl"
    assert choose_backend("auto", 2, "cpu")[0] in ("gloo", "mpi")
    assert choose_backend("gloo", 2) == ("gloo", None)  # a named backend is kept


# --- grep: device selection only in the rule --------------------------------------------------------

SELECTION = re.compile(
    r'torch\.device\(\s*"cuda"|torch\.cuda\.is_available\(\)\s*(else|and|or)?|'
    r'"cuda"\s+if\s|if\s+ctx\.backend\s*==\s*"nccl"'
)
# The rule itself, and the environment record, which reports which GPU the machine has (records
# sit below the runtime and may not import it).
NOT_SELECTION = {"records/environment.py", "runtime/device.py"}


def test_device_selection_lives_only_in_the_runtime_rule():
    offenders = []
    for folder in ("components", "suites", "reproductions", "moe_repro", "runtime", "records"):
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO).as_posix()
            if rel in NOT_SELECTION:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if SELECTION.search(line.split("#")[0]):
                    offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "device picked outside runtime/device.py:\n" + "\n".join(offenders)


# --- --device on every suite -----------------------------------------------------------------------


def _suite_names():
    from moe_repro import catalog

    return list(catalog.SUITES)


@pytest.mark.parametrize("name", _suite_names())
def test_every_suite_takes_device_cpu(name):
    from moe_repro.suites import get_suite

    suite = get_suite(name)
    grid = suite.grid({"device": ["cpu"]}, quick=True)
    assert grid and all(p["device"] == "cpu" for p in grid)


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("name", _suite_names())
def test_every_suite_refuses_cuda_without_a_gpu_in_one_line(name, tmp_path, capsys):
    from moe_repro.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--results", str(tmp_path), "bench", name, "--device", "cuda", "--quick"])
    out = capsys.readouterr()
    assert e.value.code == 2, out
    lines = [line for line in out.err.strip().splitlines() if line]
    assert len(lines) == 1 and "no CUDA GPU" in lines[0], out
    assert not any(tmp_path.rglob("*.json")), "nothing stored"


# --- honest timing -------------------------------------------------------------------------------


class FakeCudaTimer:
    """Stands in for CudaEventTimer: device work 'finishes' only when stop() synchronizes, and it
    reports the device's time (not the host's)."""

    clock = "fake cuda events"
    per_window_s = 0.25

    def __init__(self):
        self.starts = self.stops = 0

    def start(self):
        self.starts += 1

    def stop(self):
        self.stops += 1
        return self.per_window_s


def test_the_runner_times_through_the_devices_timer(monkeypatch):
    from moe_repro.suites import runner
    from moe_repro.suites.base import Suite

    fake = FakeCudaTimer()
    monkeypatch.setattr(runner, "timer_for", lambda device: fake)
    calls = []
    suite = Suite(
        name="gemm",
        params={"n": [1]},
        setup=lambda p, ctx: {"device": p["device"]},
        run=lambda s: calls.append(1),
    )
    rec = runner.run_point(suite, {"n": 1}, runner.RunConfig(warmup=1, repeats=3, min_sample_s=0.0))
    # every sample's time is the timer's window over its calls: nothing else timed them
    assert rec["clock"] == "fake cuda events"
    assert rec["samples"]["time_s"] == [pytest.approx(0.25 / rec["number"])] * 3
    assert fake.starts == fake.stops == 1 + 1 + 3  # warm-up, calibration, samples
    assert rec["device_used"] == str(dev.resolve_device("auto"))


def test_timer_for_picks_events_on_cuda_and_the_host_clock_on_cpu():
    assert isinstance(timing.timer_for(torch.device("cpu")), timing.HostTimer)
    assert timing.timer_for("cpu").clock == timing.HOST_CLOCK
    if HAS_GPU:
        assert isinstance(timing.timer_for(torch.device("cuda", 0)), timing.CudaEventTimer)


def test_host_timer_measures_elapsed_host_time():
    t = timing.HostTimer()
    t.start()
    x = sum(range(20000))
    assert x > 0 and t.stop() > 0


def test_host_timer_reads_the_clock_it_is_given(fake_clock):
    t = timing.HostTimer(fake_clock)
    t.start()
    fake_clock.advance(0.25)
    assert t.stop() == 0.25 and t.clock == timing.HOST_CLOCK


HOST_CLOCKS = {
    ("time", "perf_counter"),
    ("time", "time"),
    ("time", "monotonic"),
    ("time", "perf_counter_ns"),
    ("time", "process_time"),
}
# Host clocks around host-only work (no tensor is computed inside the timed region): the
# balancer's planning (a CPU algorithm on the global counts, FEPLB Sec. 2) and the parallel
# planner's search.
HOST_ONLY = {"components/balance/feplb.py", "components/resources/parallel_planner.py"}


def _host_clock_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and (node.func.value.id, node.func.attr) in HOST_CLOCKS
        ):
            lines.append(node.lineno)
    return lines


def test_no_host_clock_times_device_work():
    """Suites and components time through runtime/timing.py (CUDA events on a GPU); a direct
    host clock is allowed only around host-only work (HOST_ONLY, each with its reason)."""
    offenders = []
    for folder in ("suites", "components"):
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO).as_posix()
            if rel in HOST_ONLY:
                continue
            offenders += [f"{rel}:{n}" for n in _host_clock_calls(path)]
    assert not offenders, "host clock around possible device work: " + ", ".join(offenders)


def test_the_code_check_finds_a_host_clock(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nt0 = time.perf_counter()\n")
    assert _host_clock_calls(bad) == [2]


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_a_device_list_is_checked_item_by_item(tmp_path, capsys):
    from moe_repro.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--results", str(tmp_path), "bench", "gemm", "--device", "cpu,cuda", "--quick"])
    assert (
        e.value.code == 2 and "device cuda: this machine has no CUDA GPU" in capsys.readouterr().err
    )
