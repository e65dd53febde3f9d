"""How close a profile calibrated on this machine predicts a real run (moved here from tests/:
how well a busy machine follows the model is a measurement of the machine, not of the code; the
fit and the prediction are tested exactly in tests/test_network_sim.py). Run on a quiet machine:
`python -m pytest benchmarks/test_bench_local_profile.py`."""

import pytest

from moe_repro.components.alltoall.flat import PHASE_DEPENDENCIES as FLAT_DEPS
from moe_repro.components.network import simulator as ns


@pytest.mark.multiprocess
def test_calibrated_local_profile_predicts_a_real_bandwidth_bound_run(request):
    """Fit latency and bandwidth on two real flat runs (2 emulated nodes x 1 rank, about 0.25
    and 1 MB per rank on the wire), predict the run in between (about 0.5 MB, where the bytes
    term is most of the time) with the simulator: within 25% of the measurement.

    The sizes stay at 1 MB or less, and close together, because copies leave the linear regime
    as they stop fitting in cache, and where that starts depends on the machine."""
    if request.config.getoption("benchmark_disable"):
        pytest.skip("a measurement of this machine: nothing to check with benchmarks disabled")
    from moe_repro.suites import all_suites
    from moe_repro.suites.runner import RunConfig, measure

    suite = all_suites()["alltoall"]
    grid = suite.grid(
        {
            "nodes": [2],
            "gpus_per_node": [1],
            "algo": ["flat"],
            "tokens": [32, 64, 128],
            "hidden": [1024],
        }
    )
    # Rounds interleave the sizes (load from other processes then hits all of them alike);
    # single calls per sample (min_sample_s=0): the minimum is one undisturbed call.
    rounds = 10
    records = measure(
        suite,
        grid * rounds,
        RunConfig(warmup=2, repeats=7, min_sample_s=0.0, check=False, timeout_s=240),
    )
    assert len(records) == 3 * rounds and all(r["simulated"] is False for r in records)
    wire = [r["inter_node_bytes"] / 2 for r in records[:3]]  # bytes one rank puts on the wire
    times = [min(r["time_s_min"] for r in records[i::3]) for i in range(3)]
    # t = alpha + bytes / beta: the one fit (simulator.fit_alltoall_terms), one message per run
    line = ns.fit_alltoall_terms([(0, 1, wire[0]), (0, 1, wire[2])], [times[0], times[2]])
    alpha, beta = line["per_message_s"], line["bytes_per_s"]
    local = ns.calibrated_profile(alpha, beta, gpus_per_node=1)
    topo = ns.topology_for(local, nodes=2)
    predicted = ns.simulate_messages(
        [("a2a", 0, 1, wire[1]), ("a2a", 1, 0, wire[1])], topo, local, FLAT_DEPS
    ).time_s
    assert predicted == pytest.approx(times[1], rel=0.25), (wire, times, alpha, beta)
