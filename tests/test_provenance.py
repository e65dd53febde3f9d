"""How a number was made is recorded by the code that made it (components/provenance.py), and each
reproduction's cells carry it (reproductions/spec.py): the mechanism, the real producers, and every
reproduction's derived label against the one its catalog entry lists."""

from __future__ import annotations

import pytest

from moe_repro.catalog import REPRODUCTIONS
from moe_repro.components import provenance
from moe_repro.components.provenance import cached_in, letters, produced, remembering, tracking
from moe_repro.reproductions.spec import PaperValue, Reproduction, Result, how_of, record_of

from derived_how import assert_how_is_the_catalogs


# --- the mechanism ------------------------------------------------------------------------------


def test_nested_scopes_all_see_what_ran_and_nothing_leaks_out():
    produced("measured")  # outside every scope: noted nowhere, no error
    with tracking() as outer:
        produced("simulated")
        with tracking() as inner:
            produced("monte-carlo")
        produced("measured")
    assert inner == {"monte-carlo"}
    assert outer == {"simulated", "monte-carlo", "measured"}
    with tracking() as later:
        pass
    assert later == set()


def test_only_the_three_producing_kinds_can_be_announced():
    for bad in ("analytic", "guessed", ""):
        with pytest.raises(ValueError):
            produced(bad)


def test_letters_follow_the_catalog_order_and_default_to_analytic():
    assert letters(set()) == "A"
    assert letters({"simulated", "measured"}) == "R+S"
    assert letters({"monte-carlo", "simulated"}) == "M+S"


def test_a_cached_value_still_says_how_it_was_made():
    calls = []

    @remembering(maxsize=4)
    def simulate(x):
        calls.append(x)
        produced("simulated")
        return 2 * x

    with tracking() as first:
        assert simulate(3) == 6
    with tracking() as second:  # a cache hit: the simulator does not run again
        assert simulate(3) == 6
    assert calls == [3]
    assert first == second == {"simulated"}

    cache: dict = {}

    def measure():
        calls.append("m")
        produced("measured")
        return 1.5

    with tracking() as a:
        cached_in(cache, "k", measure)
    with tracking() as b:
        assert cached_in(cache, "k", measure) == 1.5
    assert calls.count("m") == 1 and a == b == {"measured"}


def _toy(compute):
    return Reproduction(
        id="piper-table4", paper_values=[PaperValue("r", "c", "1.0", "x", "test")], compute=compute
    )


def test_cells_are_labelled_by_what_ran_before_them_or_in_their_part():
    def compute(repro, params):
        cells = [repro.compare("r", "c", 1.0, "x")]  # nothing has run yet: analytic
        produced("measured")
        cells.append(repro.compare("r", "measured", 2.0, "x"))
        with tracking():  # a part of its own
            produced("simulated")
            cells.append(repro.compare("r", "simulated", 3.0, "x"))
        with tracking() as formula:
            value = 4.0
        cells.append(repro.compare("r", "formula", value, "x", made=formula))
        cells.append(repro.compare("r", "missing", None, "x"))
        return Result(cells=cells)

    repro = _toy(compute)
    result = repro.run()
    assert [c.how for c in result.cells] == ["A", "R", "S", "A", None]
    assert how_of(result.cells) == "A+R+S"
    record = record_of(repro, result, {}, ["repro", "run", "piper-table4"])
    assert record.how == "A+R+S" and record.simulated
    assert record.how_words == "analytic + real measurement + simulated"
    assert [c.how for c in record.cells] == ["A", "R", "S", "A", None]


def test_a_record_without_simulated_cells_says_so():
    repro = _toy(lambda repro, params: Result(cells=[repro.compare("r", "c", 1.0, "x")]))
    record = record_of(repro, repro.run(), {}, ["repro"])
    assert record.how == "A" and not record.simulated


# --- the real producers announce themselves -----------------------------------------------------


def test_the_flow_simulator_says_simulated():
    from moe_repro.components.network import simulator as ns
    from moe_repro.components.alltoall import simulated
    from moe_repro.components.network.platform import load_builtin

    platform = load_builtin("dgx-h100")
    with tracking() as made:
        simulated.simulate_uniform("flat", ns.topology_for(platform, 2, 8), platform, 4096)
    assert made == {"simulated"}


def test_a_balancer_replay_says_simulated_and_a_sampled_estimate_monte_carlo():
    import torch

    from moe_repro.components.alltoall.rbd import (
        expected_redundancy_uniform,
        sampled_redundancy_rate,
    )
    from moe_repro.components.balance.load_balance_eval import evaluate_trace
    from moe_repro.components.balance.routing_trace import synthetic_trace
    from moe_repro.components.moe.pft import build_pft
    from moe_repro.components.network.topology import Topology

    trace = synthetic_trace(1, 3, 16, 2, 64, 4, skew=1.0, seed=1)
    with tracking() as replay:
        evaluate_trace(trace, methods=("Before LB", "FEPLB"))
    assert replay == {"simulated"}

    top = torch.argsort(torch.rand(64, 16, generator=torch.Generator().manual_seed(0)), dim=1)[
        :, :2
    ]
    topo = Topology(nodes=2, ranks_per_node=2)
    with tracking() as sampled:
        rate = sampled_redundancy_rate(
            build_pft(top, torch.ones(64, 2), 16), [e * 4 // 16 for e in range(16)], topo, 0
        )
    with tracking() as closed_form:
        expected = expected_redundancy_uniform(16, 2, 2)
    assert sampled == {"monte-carlo"} and closed_form == set()
    assert 0.0 <= rate <= 1.0 and 0.0 <= expected <= 1.0


def test_a_suite_point_and_a_memory_probe_say_measured():
    from moe_repro.components.training.activation_memory import measure_config
    from moe_repro.suites import all_suites
    from moe_repro.suites.runner import RunConfig, run_point

    with tracking() as timed:
        run_point(
            all_suites()["gemm"],
            {"n": 16, "dtype": "float32", "device": "cpu"},
            RunConfig(warmup=0, repeats=1, min_sample_s=0.0),
        )
    assert timed == {"measured"}
    with tracking() as probed:
        measure_config(16, 16, 16, 4, 2, impls=("pft",))
    assert probed == {"measured"}


# --- every reproduction: the derived label is the catalog's -------------------------------------

# Reproductions another test already runs at a small size, checking its label there with
# derived_how.assert_how_is_the_catalogs (running them twice would cost CI minutes).
CHECKED_ELSEWHERE = {
    "piper-fig3": "test_moe_suites.py",
    "piper-fig4": "test_moe_suites.py",
    "xmoe-fig11": "test_moe_suites.py",
    "piper-fig5": "test_alltoall.py",
    "xmoe-fig12": "test_alltoall.py",
    "piper-fig9": "test_balance_repros.py",
    "piper-alg2": "test_balance_repros.py",
    "feplb-table2": "test_balance_repros.py",
    "feplb-table4": "test_balance_repros.py",
    "feplb-fig4": "test_balance_repros.py",
    "feplb-fig6": "test_balance_repros.py",
    "feplb-table3": "test_feplb_grading.py",
    "mop-vocab": "test_mop_vocab.py",
    "xmoe-fig3": "test_paper_presets.py",
    "xmoe-table4": "test_paper_presets.py",
}

# The smallest inputs the others accept (their defaults take minutes for some).
SMALL = {
    "piper-fig8": {"nodes": "2,16", "bytes_per_peer": "256"},
    "piper-eq4": {"micro_batches": 4, "steps": 1, "schedules": "1f1b"},
    "piper-bubble": {"micro_batches": "2,4", "steps": 2, "convergence_steps": 2},
    "xmoe-fig4": {"tokens": 256},
    "xmoe-fig13": {
        "tp_degrees": "1,2",
        "seq": 64,
        "hidden": 16,
        "dense_ffn": 32,
        "experts": 4,
        "expert_ffn": 8,
        "top_k": 2,
    },
    "mop-llep": {"tokens": 64, "d_model": 16, "d_ffn": 32, "experts": 4, "top_k": 2, "repeats": 1},
}


def _implemented() -> list[str]:
    from moe_repro.reproductions import all_reproductions

    return [rid for rid in REPRODUCTIONS if rid in all_reproductions()]


def test_every_reproduction_has_its_label_checked_here_or_where_it_runs():
    from pathlib import Path

    here = Path(__file__).parent
    for rid, test_file in CHECKED_ELSEWHERE.items():
        assert f'assert_how_is_the_catalogs("{rid}"' in (here / test_file).read_text(), rid
    assert set(CHECKED_ELSEWHERE) <= set(_implemented())


@pytest.mark.multiprocess
@pytest.mark.parametrize("rid", [rid for rid in _implemented() if rid not in CHECKED_ELSEWHERE])
def test_each_reproduction_derives_the_label_its_catalog_entry_lists(rid):
    from moe_repro.reproductions import all_reproductions

    result = all_reproductions()[rid].run(SMALL.get(rid, {}))
    assert_how_is_the_catalogs(rid, result)
    assert provenance.current() is None  # run() closed its scope
