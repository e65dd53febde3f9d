"""The all-to-all calibration (simulator's fit section, repro calibrate's profile) and the
alltoall-validation suite: measured vs predicted per cell."""

import json
import math

import pytest
from click.testing import CliRunner

from moe_repro.components.alltoall.flat import PHASE_DEPENDENCIES as FLAT_DEPS
from moe_repro.components.alltoall.flat import flat_schedule
from moe_repro.components.network import simulator as ns
from moe_repro.components.network.topology import Topology
from moe_repro.suites import all_suites

# The serial model by hand: a rank issuing m messages in a phase starts after m*o + L, then moves
# its bytes at beta, its copy to itself included (no message, no latency: network.self_copies);
# with more ranks than cores the machine moves cores*beta in all.
L_TRUE, O_TRUE, BETA_TRUE, CORES = 40e-6, 250e-6, 0.6e9, 2


def flat_uniform_time_by_hand(ranks: int, bytes_per_peer: int) -> float:
    share = max(1.0, ranks / CORES)  # ranks beyond the cores share them
    counts = (ranks - 1) * O_TRUE + L_TRUE + ranks * 8 * share / BETA_TRUE  # one int64 per rank
    data = (ranks - 1) * O_TRUE + L_TRUE + ranks * bytes_per_peer * share / BETA_TRUE
    return counts + data


def flat_uniform(ranks: int, bytes_per_peer: int):
    return flat_schedule([[bytes_per_peer] * ranks] * ranks, 1), Topology(
        nodes=ranks // 2, ranks_per_node=2
    )


def test_fit_recovers_latency_message_cost_and_bandwidth_from_synthetic_times():
    runs = [(n, b) for n in (2, 4, 8) for b in (1 << 8, 1 << 14, 1 << 20, 1 << 23)]
    terms, times = [], []
    for n, b in runs:
        msgs, topo = flat_uniform(n, b)
        terms.append(ns.alltoall_time_terms(msgs, topo, FLAT_DEPS, CORES))
        times.append(flat_uniform_time_by_hand(n, b))
    fit = ns.fit_alltoall_terms(terms, times)
    assert fit["latency_s"] == pytest.approx(L_TRUE, rel=1e-6)
    assert fit["per_message_s"] == pytest.approx(O_TRUE, rel=1e-6)
    assert fit["bytes_per_s"] == pytest.approx(BETA_TRUE, rel=1e-6)
    assert max(abs(r) for r in fit["residuals"]) < 1e-9
    # and the profile built from the fit gives the hand-computed time for a run it never saw
    from moe_repro.components.network.platform import from_dict

    msgs, topo = flat_uniform(6, 3000)
    profile = from_dict(
        ns.local_alltoall_profile(
            fit["latency_s"], fit["per_message_s"], fit["bytes_per_s"], 2, CORES
        )
    )
    assert ns.simulate_messages(msgs, topo, profile, FLAT_DEPS).time_s == pytest.approx(
        flat_uniform_time_by_hand(6, 3000), rel=1e-6
    )


def test_fit_keeps_costs_non_negative_and_refuses_what_it_cannot_fit():
    # times whose best unconstrained line has a negative latency (-20 us): L comes out 0
    terms = [(2, 2, 1e3), (2, 6, 1e4), (2, 14, 1e6), (2, 2, 1e6)]
    times = [n_l * -2e-5 + m * 1e-4 + b / 1e9 for (n_l, m, b) in terms]
    fit = ns.fit_alltoall_terms(terms, times)
    assert fit["latency_s"] == 0.0
    assert fit["per_message_s"] > 0 and fit["bytes_per_s"] > 0
    with pytest.raises(ValueError, match="at least two"):
        ns.fit_alltoall_terms([(2, 2, 1e3)], [1e-3])
    with pytest.raises(ValueError, match="positive"):
        ns.fit_alltoall_terms([(2, 2, 1e3), (2, 2, 1e7)], [1e-3, 0.0])


def test_fit_takes_the_known_host_work_off_before_fitting_the_messages():
    # synthetic runs: the serial model's time plus a known host part k per run (random sizes)
    import random

    rng = random.Random(7)
    terms, times, known = [], [], []
    for n in (2, 4, 8):
        for _ in range(4):
            b = rng.randrange(1 << 8, 1 << 23)
            msgs, topo = flat_uniform(n, b)
            terms.append(ns.alltoall_time_terms(msgs, topo, FLAT_DEPS, CORES))
            known.append(rng.uniform(1e-5, 5e-3))
            times.append(flat_uniform_time_by_hand(n, b) + known[-1])
    fit = ns.fit_alltoall_terms(terms, times, known)
    assert fit["latency_s"] == pytest.approx(L_TRUE, rel=1e-6)
    assert fit["per_message_s"] == pytest.approx(O_TRUE, rel=1e-6)
    assert fit["bytes_per_s"] == pytest.approx(BETA_TRUE, rel=1e-6)
    assert max(abs(r) for r in fit["residuals"]) < 1e-9
    # without k the same runs do not fit exactly: the host part is not a message cost
    assert max(abs(r) for r in ns.fit_alltoall_terms(terms, times)["residuals"]) > 1e-3
    with pytest.raises(ValueError, match="known parts"):
        ns.fit_alltoall_terms(terms[:2], times[:2], [-1.0, 0.0])


def test_host_work_counts_ops_and_the_bytes_they_write_not_views_or_collectives():
    import torch

    from moe_repro.suites.alltoall import count_host_work

    g = torch.Generator().manual_seed(3)
    rows, width = (
        int(torch.randint(5, 50, (1,), generator=g)),
        int(torch.randint(2, 9, (1,), generator=g)),
    )
    x = torch.randn(rows, width, generator=g)
    idx = torch.randperm(rows, generator=g)[: rows // 2]
    out = torch.zeros(rows, width)

    def work():
        picked = x.index_select(0, idx)  # writes len(idx) rows
        out.index_copy_(0, idx, picked)  # in place: writes its source's rows
        x[1:3].view(-1)  # two views: ops, no bytes

    got = count_host_work(work)
    assert got["ops"] == 4
    assert got["fresh_bytes"] == idx.numel() * width * 4  # index_select's fresh output
    assert got["bytes"] == idx.numel() * width * 4  # index_copy_ into an existing tensor
    buf = torch.empty(idx.numel(), width)
    got = count_host_work(lambda: torch.index_select(x, 0, idx, out=buf))  # out=: a reused buffer
    assert got == {"ops": 1, "bytes": idx.numel() * width * 4, "fresh_bytes": 0, "sort_work": 0}
    assert count_host_work(lambda: None) == {"ops": 0, "bytes": 0, "fresh_bytes": 0, "sort_work": 0}
    # a sort orders n elements: n log2 n of sort work (argsort is aten sort), n = 1024 -> 10240
    keys = torch.randint(0, 100, (1024,), generator=g)
    assert count_host_work(lambda: torch.argsort(keys, stable=True))["sort_work"] == 1024 * 10


def test_python_work_counts_the_bytecode_instructions_a_call_executes():
    """count_python_work: a straight-line function executes each of its instructions once (the
    entry, RESUME, is the call itself); a loop adds its body's instructions per iteration; the
    tracer the caller had is put back."""
    import dis
    import sys

    from moe_repro.suites.alltoall import count_python_work

    tracer = sys.gettrace()  # a coverage tool's, or None

    def straight():
        a = 1
        b = a + 2
        return b * 3

    listed = [i.opname for i in dis.get_instructions(straight)]
    assert count_python_work(straight) == len(listed) - listed.count("RESUME")

    def loop(n):
        t = 0
        for i in range(n):
            t += i
        return t

    ops = [i.opname for i in dis.get_instructions(loop)]
    body = ops.index("JUMP_BACKWARD") - ops.index("FOR_ITER") + 1  # FOR_ITER .. JUMP_BACKWARD
    assert count_python_work(lambda: loop(20)) - count_python_work(lambda: loop(10)) == 10 * body
    assert sys.gettrace() is tracer


def test_host_cpu_takes_the_cpu_inside_every_collective_out_and_puts_the_communicators_back(
    monkeypatch,
):
    """host_cpu_seconds on a fake CPU clock: a call that spends 3 units on its own work, 5 in a
    blocking all-to-all (issue 1 + wait 4), 2 in a p2p (issue + wait) and 7 in an allgather on
    another communicator is charged 3, the median over its calls (one call spends 100 of its
    own); no communicator keeps the watch afterwards, even when the call raises."""
    from moe_repro.components.network.topology import Communicators, Topology
    from moe_repro.runtime import timing
    from moe_repro.suites.alltoall import host_cpu_seconds

    clock = [0.0]
    monkeypatch.setattr(timing, "thread_cpu_seconds", lambda: clock[0])

    def spend(units):
        clock[0] += units

    class Handle:
        def __init__(self, units):
            self.units = units

        def wait(self):
            spend(self.units)

    class FakeComm:
        def alltoallv_async(self, x, send_counts, recv_counts, phase="a2a", out=None):
            spend(1)
            return x, Handle(4)

        def p2p(self, sends, recvs, phase="p2p"):
            spend(1)
            return Handle(1)

        def allgather_ints(self, values):
            spend(7)
            return [values]

        def allgather_ints_async(self, values):
            spend(7)
            return lambda: [values]

    world, intra = FakeComm(), FakeComm()
    comms = Communicators(
        Topology(nodes=1, ranks_per_node=2),
        world=world,
        intra=intra,
        intra_overlap=intra,
        inter=world,
    )
    calls = iter([3, 3, 100, 3, 3])

    def dispatch():
        spend(next(calls))
        _, handle = world.alltoallv_async("rows", [1], [1])
        handle.wait()
        world.p2p([], []).wait()
        intra.allgather_ints([1, 2])

    assert host_cpu_seconds(dispatch, comms, calls=5) == 3
    assert all(vars(c) == {} for c in (world, intra))  # the watch is gone

    def failing():
        spend(2)
        world.allgather_ints([0])
        raise RuntimeError("a rank died")

    with pytest.raises(RuntimeError, match="a rank died"):
        host_cpu_seconds(failing, comms)
    assert all(vars(c) == {} for c in (world, intra))


def test_the_prediction_uses_the_profiled_host_cpu(tmp_path):
    """derive with a profile file: predicted_host_s is the run's profiled CPU outside its
    collectives stretched by ranks / cores (4 ranks on 2 cores: x2); a record without the
    profile, and a block whose fit did not take the host work off, add none."""
    from moe_repro.suites import alltoall_validation as v

    block = {
        "latency_us": 40.0,
        "per_message_us": 250.0,
        "GBps": 0.6,
        "host_cores": 2,
        "host_work": v.HOST_TAKEN_OFF,
    }
    path = tmp_path / "local.json"
    path.write_text(json.dumps({"calibration": {"gloo": block}}))
    (p,) = all_suites()["alltoall-validation"].grid(
        {
            "ranks": [4],
            "algo": ["rbd"],
            "backend": ["gloo"],
            "sizes": [65536],
            "calibration": [str(path)],
        }
    )
    names = ("intra_node", "intra_group", "inter_group", "inter_rack", "inter_node")
    state = {
        "payload_bytes": 65536.0,
        "link_bytes": dict.fromkeys(names, 0),
        "memcpy_s": 0.001,
        "host_work": {
            "ops": 50,
            "bytes": 3_000_000,
            "fresh_bytes": 0,
            "python_ops": 0,
            "sort_work": 0,
            "cpu_ns": 1_700_000,
        },
    }
    got = v.derive(p, state, 0.01)
    assert got["host_cpu_s"] == pytest.approx(1.7e-3, rel=1e-12)
    assert got["predicted_host_s"] == pytest.approx(2 * 1.7e-3, rel=1e-12)
    assert "predicted_host_priced_s" not in got
    assert got["predicted_time_s"] == pytest.approx(p["predicted_time_s"] + 3.4e-3, rel=1e-12)
    run = {"ranks": 4, "host_ops": 50, "host_bytes": 3e6}
    assert v.host_s(run, block, 2) == 0.0  # no profile: nothing to add
    assert v.host_s({**run, "host_cpu_s": 1e-3}, block, 2) == pytest.approx(2e-3, rel=1e-12)
    # a block written before the marker says it by its prices
    assert v.host_s({**run, "host_cpu_s": 1e-3}, {"host_op_us": 1.0}, 2) > 0
    # a fit that could not separate the host work carries it in its terms: nothing added
    unseparated = {**block, "host_work": "not separated: ...; fitted whole"}
    assert v.host_s({**run, "host_cpu_s": 1e-3}, unseparated, 2) == 0.0


def test_dispatcher_dependencies_order_every_phase_the_algorithm_orders():
    """The local prediction follows the dispatcher's call order: for every registered
    all-to-all it covers the same phases and keeps every dependency the algorithm states (a
    linear order of the calls may add waits, never drop one)."""
    from moe_repro.components.alltoall import algorithm_names, get_algorithm

    def before(deps, phase):  # every phase ``phase`` waits for, transitively
        seen, todo = set(), list(deps[phase])
        while todo:
            q = todo.pop()
            if q not in seen:
                seen.add(q)
                todo += deps[q]
        return seen

    for name in algorithm_names():
        algo = get_algorithm(name)
        own, calls = algo.phase_dependencies, algo.dispatcher_dependencies
        assert set(calls) == set(own), name
        for phase in own:
            assert before(own, phase) <= before(calls, phase), (name, phase)
    rbd = get_algorithm("rbd").dispatcher_dependencies
    # one call after another: all six of them
    assert before(rbd, "replica") == {"counts", "meta", "replica_counts", "replica_meta", "pilot"}


# --- the suite without ranks: grid validation and a calibration read from a profile file -----


def test_bad_points_are_refused_before_anything_runs():
    suite = all_suites()["alltoall-validation"]
    for bad in (
        {"ranks": [3]},
        {"ranks": [32]},
        {"sizes": [1000]},
        {"algo": ["nope"]},
        {"fit_sizes": ["2K+lots"]},
        {"calibration": ["/nonexistent/profile.json"]},
    ):
        with pytest.raises(ValueError):
            suite.grid({"sizes": [1024], **bad})


def test_bench_refuses_a_bad_point_in_one_line(results_dir):
    from moe_repro.cli import cli

    res = CliRunner().invoke(cli, ["bench", "alltoall-validation", "--ranks", "3"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "multiple of gpus_per_node" in res.output


def test_bench_samples_for_the_suites_own_length_unless_told(results_dir, monkeypatch):
    """alltoall-validation sets 0.1 s samples; --min-sample-s given, even the runner's default
    value, wins."""
    from moe_repro.cli import cli
    from moe_repro.suites import runner

    used = []

    class Stop(Exception):
        pass

    def fake_measure(suite, grid, config, progress=None, done=None):
        used.append(config.min_sample_s)
        raise Stop

    monkeypatch.setattr(runner, "measure", fake_measure)
    point = [
        "bench",
        "alltoall-validation",
        "--ranks",
        "2",
        "--algo",
        "flat",
        "--backend",
        "gloo",
        "--sizes",
        "1K",
    ]
    for extra in ([], ["--min-sample-s", "0.01"], ["--min-sample-s", "0.3"]):
        res = CliRunner().invoke(cli, point + extra)
        assert isinstance(res.exception, Stop), res.output
    assert used == [0.1, 0.01, 0.3]


def test_a_calibration_file_gives_the_hand_computed_prediction(tmp_path):
    """A profile's calibration block (as repro calibrate writes it), read for the point's backend:
    the prediction of a 2-rank flat run is counts phase + data phase of the serial model, with
    the bytes of the busiest rank's port (from the routing: every row it sends or receives, its
    copies to itself included), by hand."""
    from moe_repro.suites.alltoall import rank_workload

    path = tmp_path / "local.json"
    path.write_text(
        json.dumps(
            {
                "calibration": {
                    "gloo": {
                        "latency_us": 40.0,
                        "per_message_us": 250.0,
                        "GBps": 0.6,
                        "host_cores": 2,
                    }
                }
            }
        )
    )
    suite = all_suites()["alltoall-validation"]
    (p,) = suite.grid(
        {
            "ranks": [2],
            "algo": ["flat"],
            "backend": ["gloo"],
            "sizes": [65536],
            "calibration": [str(path)],
        }
    )
    counts = [rank_workload(p, r, 2)["send_counts"] for r in range(2)]
    sent = [sum(counts[r]) for r in range(2)]
    received = [counts[0][r] + counts[1][r] for r in range(2)]
    assert sent != received  # uneven routing: the busiest port is a receiver's
    busiest_port = max(sent + received) * p["hidden"] * 4
    by_hand = (250e-6 + 40e-6 + 2 * 8 / 0.6e9) + (250e-6 + 40e-6 + busiest_port / 0.6e9)
    assert p["predicted_time_s"] == pytest.approx(by_hand, rel=1e-9)
    assert p["calibration_used"]["source"] == str(path)
    with pytest.raises(ValueError, match="no calibration for backend mpi"):
        suite.grid(
            {
                "ranks": [2],
                "algo": ["flat"],
                "sizes": [65536],
                "backend": ["mpi"],
                "calibration": [str(path)],
            }
        )


def test_overlap_is_the_share_of_the_shorter_exchange_hidden_when_both_run_at_once():
    from moe_repro.suites.alltoall_validation import overlap_fraction

    # a 1 ms and a 3 ms exchange: 4 ms one after the other
    assert overlap_fraction(3e-3, 1e-3, 4e-3, 3e-3) == pytest.approx(1.0)  # the shorter one hidden
    assert overlap_fraction(3e-3, 1e-3, 4e-3, 3.75e-3) == pytest.approx(0.25)
    assert overlap_fraction(3e-3, 1e-3, 4e-3, 4e-3) == 0.0  # nothing hidden
    assert overlap_fraction(3e-3, 1e-3, 4e-3, 5e-3) == 0.0  # at once slower: none, not negative
    assert (
        overlap_fraction(3e-3, 1e-3, 4e-3, 2e-3) == 1.0
    )  # faster than the longer alone: at most 1
    with pytest.raises(ValueError):
        overlap_fraction(0.0, 1e-3, 1e-3, 1e-3)


def test_halo_phases_overlap_by_the_measured_fraction_and_chains_are_untouched():
    """HALO's Phase I may run beside Phases II and III (Eq. 13): with overlap 1 it does, with
    0 the four phases run one after another (simulator.chained, longer by Phase I's latency
    at least), in between linearly; flat's phases are a chain, which no overlap changes."""
    from moe_repro.components.network import simulator as ns
    from moe_repro.suites import alltoall_validation as v

    assert ns.chained({"counts": [], "I": ["counts"], "II": ["counts"], "III": ["II"]}) == {
        "counts": [],
        "I": ["counts"],
        "II": ["I"],
        "III": ["II"],
    }
    assert ns.chained({"counts": [], "a2a": ["counts"]}) == {"counts": [], "a2a": ["counts"]}
    suite = all_suites()["alltoall-validation"]
    block = {"latency_us": 300.0, "per_message_us": 20.0, "GBps": 1.0, "host_cores": 2}
    for algo in ("halo", "flat"):
        (p,) = suite.grid({"ranks": [4], "algo": [algo], "backend": ["gloo"], "sizes": [65536]})
        t = {
            x: v.predict(p, {**block, "overlap_by_ranks": {"4": x}}, 2)["predicted_time_s"]
            for x in (0.0, 0.5, 1.0)
        }
        assert t[0.5] == pytest.approx((t[0.0] + t[1.0]) / 2, rel=1e-12)
        # no measured overlap (a profile file): the phases overlap as the dependencies allow
        assert v.predict(p, block, 2)["predicted_time_s"] == pytest.approx(t[1.0], rel=1e-12)
        if algo == "halo":
            assert t[0.0] >= t[1.0] + 300e-6
        else:
            assert t[0.0] == t[1.0]


def test_the_prediction_adds_the_runs_profiled_host_work(tmp_path):
    """derive: the simulated messages (derived_params) plus the host work profiled on the run
    (the busiest rank's CPU outside its collectives), 4 ranks on 2 cores."""
    from moe_repro.suites import alltoall_validation as v

    path = tmp_path / "local.json"
    path.write_text(
        json.dumps(
            {
                "calibration": {
                    "gloo": {
                        "latency_us": 40.0,
                        "latency_us_by_ranks": {"4": 90.0},
                        "per_message_us": 250.0,
                        "GBps": 0.6,
                        "host_cores": 2,
                        "host_work": v.HOST_TAKEN_OFF,
                    }
                }
            }
        )
    )
    suite = all_suites()["alltoall-validation"]
    (p,) = suite.grid(
        {
            "ranks": [4],
            "algo": ["halo"],
            "backend": ["gloo"],
            "sizes": [65536],
            "calibration": [str(path)],
        }
    )
    names = ("intra_node", "intra_group", "inter_group", "inter_rack", "inter_node")
    state = {
        "payload_bytes": 65536.0,
        "link_bytes": dict.fromkeys(names, 0),
        "host_work": {
            "ops": 37,
            "bytes": 3_000_000,
            "fresh_bytes": 500_000,
            "python_ops": 4000,
            "sort_work": 100_000,
            "cpu_ns": 900_000,
        },
        "memcpy_s": 0.001,
    }  # the run's memcpy bound (suites/alltoall.py setup)
    got = v.derive(p, state, 0.01)
    host = 0.9e-3 * 4 / 2
    assert got["predicted_host_s"] == pytest.approx(host, rel=1e-12)
    assert got["predicted_time_s"] == pytest.approx(p["predicted_time_s"] + host, rel=1e-12)
    assert got["error_pct"] == pytest.approx(100 * (got["predicted_time_s"] / 0.01 - 1), rel=1e-12)
    # the 4-rank latency was used, not the median one: 90 us per latency on the critical path
    with_median = v.predict(p, {"latency_us": 40.0, "per_message_us": 250.0, "GBps": 0.6}, 2)
    assert p["predicted_time_s"] > with_median["predicted_time_s"]


# --- repro calibrate's profile fields (no runs: fits written here) ------------------------------


def test_calibrate_writes_every_fit_and_the_faster_backends_links():
    from moe_repro.cli.calibrate_cmd import write_alltoall_calibration
    from moe_repro.components.network.platform import from_dict, local_profile

    doc = local_profile(0.1, 0.01, 10.0, 2, 4.0, "test machine", {})
    runs = [
        {"ranks": 2, "size": 1024, "time_s": 1e-3},
        {"ranks": 4, "size": 1 << 20, "time_s": 1e-2},
    ]
    fits = {
        "gloo": {
            "latency_us": 10.0,
            "per_message_us": 500.0,
            "GBps": 0.5,
            "host_cores": 2,
            "runs": runs,
        },
        "mpi": {
            "latency_us": 2.0,
            "per_message_us": 50.0,
            "GBps": 0.7,
            "host_cores": 2,
            "runs": [dict(r, time_s=r["time_s"] / 2) for r in runs],
        },
    }
    chosen = write_alltoall_calibration(doc, fits, "faster", "2026-01-01T00:00:00+00:00")
    assert chosen == "mpi"  # half the time at every run
    assert doc["calibration"]["links_from"] == "mpi" and doc["calibration"]["gloo"]["GBps"] == 0.5
    assert all(
        link["GBps"] == pytest.approx(0.7) and link["latency_us"] == pytest.approx(2.0)
        for link in doc["links"]
    )
    assert (
        doc["network"]["per_message_us"] == pytest.approx(50.0)
        and doc["network"]["latency_model"] == "serial"
    )
    assert doc["node"]["nic_GBps"] == pytest.approx(0.7)
    assert doc["node"]["intra_node_alltoall_GBps_per_gpu"] == pytest.approx(0.7)
    assert doc["network"]["host_GBps"] == pytest.approx(1.4)
    assert doc["network"]["self_copies"] is True  # as the fit priced them
    from_dict(doc)  # still a valid profile
    doc = local_profile(0.1, 0.01, 10.0, 2, 4.0, "test machine", {})
    assert write_alltoall_calibration(doc, fits, "gloo", None) == "gloo"
    assert doc["links"][0]["GBps"] == pytest.approx(0.5)


# --- the suite on real ranks ------------------------------------------------------------------


@pytest.mark.multiprocess
def test_suite_measures_and_predicts_every_cell_of_a_tiny_grid():
    from moe_repro.suites import alltoall_validation as v
    from moe_repro.suites.runner import RunConfig, measure

    suite = all_suites()["alltoall-validation"]
    grid = suite.grid(
        {
            "ranks": [2],
            "backend": ["gloo"],
            "sizes": [1024, 65536],
            "fit_ranks": ["2"],
            "fit_sizes": ["2K+256K"],
            "fit_repeats": [3],
        }
    )
    records = measure(
        suite, grid, RunConfig(warmup=1, repeats=3, min_sample_s=0.005, timeout_s=240)
    )
    assert [(r["algo"], r["size"]) for r in records] == [
        (a, s) for a in ("flat", "halo", "rbd") for s in (1024, 65536)
    ]
    for r in records:
        assert r["correct"] is True
        assert r["time_s"] > 0 and r["predicted_time_s"] > 0
        assert math.isfinite(r["error_pct"])
        # median of per-sample errors = the error of the median sample (3 repeats)
        assert r["error_pct"] == pytest.approx(
            100 * (r["predicted_time_s"] / r["time_s"] - 1), rel=1e-9
        )
        assert set(r["how"]) == {
            "time_s",
            "predicted_time_s",
            "predicted_host_s",
            "error_pct",
        }
        # the host work is profiled on the run and is part of the prediction, stretched by the
        # world's cpu_stretch
        assert r["host_ops"] > 0 and 0 < r["predicted_host_s"] < r["predicted_time_s"]
        assert r["predicted_host_s"] == pytest.approx(r["host_cpu_s"] * r["cpu_stretch"], rel=1e-9)
        # profiled once a round, after each sample: the record's value is their median
        profiled = r["samples"]["host_cpu_s"]
        assert len(profiled) == 3 and min(profiled) > 0
        # three calls measured apart, not one setup profile copied into every round
        assert len(set(profiled)) > 1
        assert r["host_cpu_s"] == pytest.approx(sorted(profiled)[1], rel=1e-9)
        assert "predicted_host_priced_s" not in r
        assert (
            r["host_python_ops"] > 0 and r["load_average"] >= 0
        )  # instructions counted, load kept
        # measured in the run's world: wall per CPU second is never below 1 for one thread
        assert r["cpu_stretch"] >= 0.99 and len(r["cpu_stretch_samples"]) == 3
        # and how much two exchanges at once overlap there, which the fit keeps per ranks count
        assert 0 <= r["phase_overlap"] <= 1 and len(r["phase_overlap_samples"]) == 3
        assert r["calibration_used"]["overlap_by_ranks"] == {"2": r["phase_overlap"]}
        assert r["how"]["time_s"].startswith("measured") and r["how"][
            "predicted_time_s"
        ].startswith("simulated")
        calib = r["calibration_used"]
        assert calib["source"] == "fit" and calib["backend"] == "gloo" and calib["GBps"] > 0
        assert calib["host_work"] == v.HOST_TAKEN_OFF and set(calib["latency_us_by_ranks"]) == {"2"}
        assert len(calib["load_average"]["before"]) == len(calib["load_average"]["after"]) == 3
        # the fit set is flat at sizes the grid does not hold
        assert sorted(run["size"] for run in calib["runs"]) == [2048, 262144]
        assert all(math.isfinite(run["residual_pct"]) for run in calib["runs"])
        if r["algo"] != "rbd":  # the prediction replays the run's own messages (RBD: pilots random)
            assert r["predicted_intra_node_bytes"] == r["intra_node_bytes"]
            assert r["predicted_inter_node_bytes"] == r["inter_node_bytes"]


def test_fit_mode_measures_the_fit_set_and_the_cells_in_the_same_worlds_in_turn(monkeypatch):
    """calibration=fit: one world per ranks count holds that count's fit runs and scored cells,
    alternating, sampled round by round; the fit is made from those runs afterwards and every
    cell is predicted from it. Worlds faked: each run's time comes from known L, o and beta (no
    host work), so the fit must recover them -- o apart from L where the world has two nodes,
    from its node-wide runs -- and the cells' errors must vanish."""
    from moe_repro.runtime import launch
    from moe_repro.suites import alltoall_validation as v
    from moe_repro.suites.runner import RunConfig, measure

    L = {2: 300e-6, 4: 2e-3}
    o = {2: 0.0, 4: 150e-6}  # a world of one node cannot tell o from L: held at 0 there
    beta = 1.5e9
    calls = []

    def fake_run_ranks(target, kwargs, world_size, ranks_per_node, backend, timeout_s):
        calls.append((world_size, kwargs))
        records = []
        for point, repeats in zip(kwargs["points"], kwargs["repeats"]):
            msgs, topo, deps = v.routed_messages(point)
            n_l, n_o, nbytes = ns.alltoall_time_terms(msgs, topo, deps, 2)
            t = n_l * L[world_size] + n_o * o[world_size] + nbytes / beta
            zero = dict.fromkeys(
                ("host_ops", "host_bytes", "host_fresh_bytes", "host_sort_work", "host_python_ops"),
                0.0,
            )
            records.append(
                {
                    **point,
                    **zero,
                    "time_s": t,
                    "time_s_iqr": 0.0,
                    "samples": {"time_s": [t] * repeats},
                }
            )
        return [records]

    monkeypatch.setattr(launch, "run_ranks", fake_run_ranks)
    suite = all_suites()["alltoall-validation"]
    grid = suite.grid(
        {
            "ranks": [2, 4],
            "algo": ["flat"],
            "backend": ["gloo"],
            "sizes": [1024, 65536],
            "fit_ranks": ["2+4"],
            "fit_sizes": ["2K+256K+4M"],
            "fit_repeats": [2],
        }
    )
    assert all("predicted_time_s" not in p for p in grid)  # no fit before the worlds run
    records = measure(suite, grid, RunConfig(repeats=3))
    assert [n for n, _ in calls] == [2, 4]
    sizes = [2048, 262144, 4194304]
    for n, kwargs in calls:
        kinds = [
            (p["algo"], p["path"], p["size"], f) for p, f in zip(kwargs["points"], kwargs["fit"])
        ]
        # the fit runs over the world, then (two nodes) over each node, in turn with the cells
        fits = [("flat", "dispatch", s, True) for s in sizes] + (
            [("flat", "node", s, True) for s in sizes] if n == 4 else []
        )
        cells = [("flat", "dispatch", 1024, False), ("flat", "dispatch", 65536, False)]
        assert kinds == [fits[0], cells[0], fits[1], cells[1], *fits[2:]]
        assert all(p["ranks"] == n for p in kwargs["points"])
        assert kwargs["repeats"] == [2, 3, 2, 3] + [2] * (len(fits) - 2)
        assert kwargs["config"]["number_from"] > 1  # calls per sample not set by one stalled call
    assert [(r["ranks"], r["size"]) for r in records] == [
        (2, 1024),
        (2, 65536),
        (4, 1024),
        (4, 65536),
    ]
    for r in records:
        calib = r["calibration_used"]
        assert calib["GBps"] == pytest.approx(beta / 1e9, rel=1e-6)
        assert calib["latency_us_by_ranks"]["2"] == pytest.approx(300.0, rel=1e-6)
        assert calib["latency_us_by_ranks"]["4"] == pytest.approx(2000.0, rel=1e-6)
        assert calib["per_message_us_by_ranks"] == {"2": 0.0, "4": pytest.approx(150.0, rel=1e-6)}
        assert "same worlds" in calib["fitted_on"] and "same worlds" in r["how"]["predicted_time_s"]
        # the serial sum n_L L + n_o o + B / beta bounds the simulated time from above once o
        # moves which rank is last (simulator.alltoall_time_terms): within 0.05%, not exactly
        assert r["error_pct"] == pytest.approx(0.0, abs=0.05)
        assert len(r["samples"]["error_pct"]) == 3


def test_an_interrupted_fit_run_keeps_the_cells_it_measured_without_a_prediction(
    monkeypatch, tmp_path
):
    """calibration=fit predicts only once the fit set has run in every world; a run stopped
    in its second world keeps the first world's cells (measured times, the reason the
    prediction is missing) in the store, marked interrupted."""
    from moe_repro.cli import main
    from moe_repro.runtime import launch
    from moe_repro.suites import alltoall_validation as v

    def fake_run_ranks(target, kwargs, world_size, ranks_per_node, backend, timeout_s):
        if world_size == 4:
            raise KeyboardInterrupt  # Ctrl-C while the second world runs
        zero = dict.fromkeys(
            ("host_ops", "host_bytes", "host_fresh_bytes", "host_sort_work", "host_python_ops"), 0.0
        )
        return [
            [
                {**p, **zero, "time_s": 1e-3, "time_s_iqr": 0.0, "samples": {"time_s": [1e-3] * r}}
                for p, r in zip(kwargs["points"], kwargs["repeats"])
            ]
        ]

    monkeypatch.setattr(launch, "run_ranks", fake_run_ranks)
    monkeypatch.setattr(v, "fit_flat", lambda *a, **k: pytest.fail("no fit may be made"))
    store = tmp_path / "store"
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "--results",
                str(store),
                "bench",
                "alltoall-validation",
                "--ranks",
                "2,4",
                "--algo",
                "flat",
                "--backend",
                "gloo",
                "--sizes",
                "1K,64K",
                "--fit-ranks",
                "2+4",
                "--fit-sizes",
                "2K+256K",
                "--fit-repeats",
                "2",
                "--repeats",
                "3",
            ]
        )
    assert exited.value.code == 130
    (path,) = (store / "suites" / "alltoall-validation").glob("*.json")
    stored = json.loads(path.read_text())
    assert stored["interrupted"] is True
    assert [(r["ranks"], r["size"]) for r in stored["records"]] == [(2, 1024), (2, 65536)]
    for r in stored["records"]:
        assert r["time_s"] == pytest.approx(1e-3) and "predicted_time_s" not in r
        assert "no prediction was made" in r["prediction_missing"]


def test_summary_gives_each_backends_and_algorithms_median_error_against_the_goal():
    from moe_repro.suites.alltoall_validation import error_summary

    cells = (
        [("gloo", "rbd", e) for e in (-40.0, 10.0, 20.0)]
        + [("mpi", "rbd", e) for e in (-5.0, 14.0)]
        + [("gloo", "flat", 3.0), ("gloo", "flat", None)]
    )  # None: an interrupted cell, no prediction
    records = [
        {"backend": b, "algo": a, **({} if e is None else {"error_pct": e})} for b, a, e in cells
    ]
    assert error_summary(records) == [
        "gloo rbd: median |error| 20.0% over 3 cells, worst 40.0% (above the 15% goal)",
        "gloo flat: median |error| 3.0% over 1 cell, worst 3.0% (within the 15% goal)",
        "mpi rbd: median |error| 9.5% over 2 cells, worst 14.0% (within the 15% goal)",
    ]
    # a median that one decimal would show as the goal itself shows two: above is above
    assert error_summary([{"backend": "gloo", "algo": "flat", "error_pct": 15.04}])[0].startswith(
        "gloo flat: median |error| 15.04% over 1 cell, worst 15.0% (above the 15% goal)"
    )
    assert (
        "median |error| 15.0% over 1 cell"
        in error_summary([{"backend": "gloo", "algo": "flat", "error_pct": -15.0}])[0]
    )
    # with the host work in the prediction: its share, the median over the cells (0.2, 0.5, 0.9)
    shared = [
        {
            "backend": "mpi",
            "algo": "halo",
            "error_pct": 1.0,
            "predicted_time_s": 10.0,
            "predicted_host_s": h,
        }
        for h in (2.0, 5.0, 9.0)
    ]
    assert error_summary(shared) == [
        "mpi halo: median |error| 1.0% over 3 cells, worst 1.0% (within the "
        "15% goal); host work (profiled) 50% of the predicted time"
    ]


def test_median_error_interval_draws_a_worlds_rounds_together_and_worlds_apart():
    """The bootstrap draws the same rounds for every cell of one world: two cells whose errors
    swap from round to round (0 then 40, 40 then 0) have a median of 20 in every draw. In two
    worlds the rounds are drawn apart, and the same cells spread on both sides of 20."""
    from moe_repro.suites.alltoall_validation import median_error_interval

    def cell(ranks, errors):
        return {
            "backend": "gloo",
            "ranks": ranks,
            "gpus_per_node": 2,
            "error_pct": 20.0,
            "samples": {"error_pct": errors},
        }

    assert median_error_interval([cell(2, [0.0, 40.0]), cell(2, [40.0, 0.0])]) == (20.0, 20.0)
    apart = [cell(2, [0.0, 40.0]), cell(4, [40.0, 0.0])]
    low, high = median_error_interval(apart)
    assert low < 20.0 < high
    assert median_error_interval(apart) == (
        low,
        high,
    )  # seeded: the same records, the same interval
    assert median_error_interval([cell(2, [-7.0, -7.0, -7.0])]) == (
        7.0,
        7.0,
    )  # steady rounds: a point


def test_goal_verdict_needs_the_whole_interval_on_one_side():
    from moe_repro.suites.alltoall_validation import error_summary, goal_verdict

    assert goal_verdict(3.0, 14.0) == "within the 15% goal"
    assert goal_verdict(3.0, 15.0) == "within the 15% goal"
    assert goal_verdict(16.0, 30.0) == "above the 15% goal"
    assert goal_verdict(10.0, 20.0) == (
        "the 15% goal inside the interval: this run cannot tell; more --repeats narrow it"
    )
    # a median of 12% whose rounds reach past the goal is not called within
    noisy = [
        {
            "backend": "gloo",
            "algo": "rbd",
            "ranks": 2,
            "gpus_per_node": 2,
            "error_pct": 12.0,
            "samples": {"error_pct": [12.0, 2.0, 30.0]},
        }
    ]
    (line,) = error_summary(noisy)
    assert line.startswith("gloo rbd: median |error| 12.0% (90% interval 2.0-30.0%) over 1 cell")
    assert line.endswith(
        "(the 15% goal inside the interval: this run cannot tell; more --repeats narrow it)"
    )


def test_the_host_work_is_profiled_on_one_more_call_and_the_busiest_ranks_rounds_kept(monkeypatch):
    """After each sample the host work is profiled on one more call (none for a peer's dispatch);
    at the end the rank whose median over the rounds is the highest gives the point's profile,
    not the highest single call (a stall on one rank in one round)."""
    from moe_repro.suites import alltoall
    from moe_repro.suites.alltoall_validation import busiest_rank_rounds, profile_host_cpu

    calls = []

    def fake_profile(fn, comms, calls_per_profile=5, **kw):
        calls.append((comms, kw.get("calls", calls_per_profile)))
        return 0.002

    monkeypatch.setattr(alltoall, "host_cpu_seconds", fake_profile)
    assert (
        profile_host_cpu({"comms": "the point's communicators", "host_work": {"cpu_ns": 1}})
        == 0.002
    )
    assert calls == [("the point's communicators", 1)]
    assert profile_host_cpu({"comms": None, "host_work": {"ops": 5}}) is None and len(calls) == 1

    class World:
        def allgather_ints(self, values):
            assert values == [1000, 5000, 3000]  # this rank's rounds, in ns
            return [
                [1000, 5000, 3000],
                [2000, 9000, 2000],
                [4000, 4000, 1000],
            ]  # medians 3, 2, 4 us

    class Comms:
        world = World()

    assert busiest_rank_rounds(Comms(), [1e-6, 5e-6, 3e-6]) == pytest.approx([4e-6, 4e-6, 1e-6])
