import os
import time
import uuid

import pytest

from moe_repro.runtime.launch import RankFailure, run_ranks
from conftest import patient
from procs import processes_with_env

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def tag(monkeypatch):
    value = f"MOE_REPRO_TEST_TAG={uuid.uuid4().hex}"
    key, _, v = value.partition("=")
    monkeypatch.setenv(key, v)
    return v


def _none_left(tag):
    deadline = time.monotonic() + patient(0.5)  # a busy machine reaps killed processes late
    while processes_with_env(tag):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("world,per_node", [(4, 2), (4, 1), (2, 2)])
def test_ranks_know_their_emulated_node(targets_on_path, world, per_node):
    out = run_ranks(
        "_launch_targets:identity",
        {"tag": "x"},
        world_size=world,
        ranks_per_node=per_node,
        timeout_s=patient(12),
    )
    assert [o["rank"] for o in out] == list(range(world))
    assert [o["node"] for o in out] == [r // per_node for r in range(world)]
    assert [o["env_local_rank"] for o in out] == [r % per_node for r in range(world)]
    assert all(o["tag"] == "x" and o["world"] == world for o in out)


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_real_collective_over_backends(targets_on_path, backend):
    out = run_ranks(
        "_launch_targets:allreduce_sum", {}, world_size=3, backend=backend, timeout_s=patient(12)
    )
    assert out == [6, 6, 6]


@pytest.mark.timing
def test_killed_rank_fails_fast_and_leaves_nothing(targets_on_path, tag):
    with pytest.raises(RankFailure) as err:
        run_ranks(
            "_launch_targets:killed_mid_collective",
            {"victim": 1},
            world_size=3,
            timeout_s=patient(12),
        )
    assert "did not finish" not in str(err.value)  # found from the death, not at the timeout
    assert err.value.ranks[0] == 1  # the killed rank is named first, not the peers it broke
    assert "killed by signal 9" in str(err.value)
    assert _none_left(tag)


@pytest.mark.timing
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_rank_that_aborts_after_its_result_keeps_the_results_and_says_so(
    targets_on_path, tag, capfd, backend
):
    """Every rank returned its result, then one aborted in teardown (a library's threads at
    exit): the results come back whole, and stderr names the rank and the signal."""
    out = run_ranks(
        "_launch_targets:aborts_in_teardown",
        {"victim": 1},
        world_size=3,
        backend=backend,
        timeout_s=patient(12),
    )
    assert out == [0, 1, 2]
    err = capfd.readouterr().err
    assert "after every rank had written its result" in err
    assert ("rank 1: killed by signal 6" if backend == "gloo" else "mpiexec: ") in err
    assert _none_left(tag)


def test_a_rank_killed_before_its_result_still_fails_the_run(targets_on_path, tag):
    """The teardown leniency needs every result: a rank that dies with none still fails."""
    with pytest.raises(RankFailure, match="killed by signal 6"):
        run_ranks(
            "_launch_targets:aborts_before_its_result",
            {"victim": 1},
            world_size=3,
            timeout_s=patient(12),
        )
    assert _none_left(tag)


def test_raising_rank_is_named_with_its_error(targets_on_path, tag):
    with pytest.raises(RankFailure) as err:
        run_ranks("_launch_targets:raises", {"victim": 2}, world_size=3, timeout_s=patient(12))
    assert err.value.ranks == [2]
    assert "deliberate failure" in str(err.value)
    assert _none_left(tag)


@pytest.mark.timing
def test_hung_rank_times_out(targets_on_path, tag, fake_clock):
    # The timeout is counted on a fake clock, moved past it once rank 1 has ended with its result
    # and rank 0 has started its hang: the test neither waits 20 s nor depends on how fast ranks
    # start.
    import json
    import tempfile
    import threading
    from pathlib import Path

    from moe_repro.runtime.launch import WORKDIR_PREFIX

    def started() -> bool:
        for d in Path(tempfile.gettempdir()).glob(WORKDIR_PREFIX + "*"):
            try:
                if int((d / "owner.pid").read_text()) == os.getpid():
                    rank_1 = json.loads((d / "rank-1.beat").read_text())["pid"]
                    return (
                        (d / "rank-1.json").exists()
                        and (d / "rank-0.beat").exists()
                        and not Path(f"/proc/{rank_1}").exists()
                    )  # ended, and reaped
            except (OSError, ValueError, KeyError):
                pass
        return False

    def time_out_once_started():
        deadline = time.monotonic() + patient(
            12
        )  # a hang guard: the clock moves at the latest then
        while not started() and time.monotonic() < deadline:
            time.sleep(0.05)
        fake_clock.advance(21)

    mover = threading.Thread(target=time_out_once_started, daemon=True)
    mover.start()
    with pytest.raises(RankFailure) as err:
        run_ranks(
            "_launch_targets:hangs", {"victim": 0}, world_size=2, timeout_s=20, clock=fake_clock
        )
    mover.join()
    assert err.value.ranks == [0]
    assert "did not finish within 20 s" in str(err.value)
    assert _none_left(tag)


def test_hung_mpi_world_is_killed_and_leaves_nothing(targets_on_path, tag):
    with pytest.raises(RankFailure):
        run_ranks("_launch_targets:hangs", {"victim": 1}, world_size=2, backend="mpi", timeout_s=6)
    assert _none_left(tag)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError):
        run_ranks("x:y", world_size=4, ranks_per_node=3)
    with pytest.raises(ValueError):
        run_ranks("x:y", world_size=2, backend="carrier-pigeon")
