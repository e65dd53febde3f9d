"""The all-to-all registry (components/alltoall): every algorithm keeps the interface, every
caller's choice list comes from the registry, and every registered algorithm equals the flat
reference on real ranks."""

from dataclasses import fields, replace

import pytest
import torch

from moe_repro.components.alltoall import (
    ALGORITHMS,
    AllToAll,
    AllToAllFacts,
    algorithm_names,
    get_algorithm,
    register,
)
from moe_repro.components.alltoall.flat import FlatAlgorithm
from moe_repro.components.alltoall.halo import HaloAlgorithm
from moe_repro.components.alltoall.rbd import RBDAlgorithm
from moe_repro.components.moe.pft import build_pft
from moe_repro.components.alltoall import simulated
from moe_repro.components.network.topology import Topology
from moe_repro.runtime.launch import run_ranks

# --- the interface ------------------------------------------------------------------------------


def test_the_three_papers_algorithms_are_registered_in_order():
    assert algorithm_names() == ["flat", "halo", "rbd"]
    assert algorithm_names(schedule_from_counts=False) == ["rbd"]
    assert algorithm_names(equal_ranks_per_node=True, schedule_from_counts=True) == ["halo"]


@pytest.mark.parametrize("name", ["flat", "halo", "rbd"])
def test_every_registered_algorithm_implements_the_interface(name):
    algo = get_algorithm(name)
    assert isinstance(algo, AllToAll) and isinstance(algo.facts, AllToAllFacts)
    assert algo.facts.name == name
    for text in (algo.facts.label, algo.facts.paper_section, algo.facts.description):
        assert isinstance(text, str) and text.strip()
    # phase dependencies: every phase waited for is a phase, and they form no cycle
    deps = algo.phase_dependencies
    assert all(d in deps for ds in deps.values() for d in ds)
    done, left = set(), dict(deps)
    while left:
        ready = [p for p, ds in left.items() if set(ds) <= done]
        assert ready, f"{name}: dependency cycle among {sorted(left)}"
        done |= set(ready)
        left = {p: ds for p, ds in left.items() if p not in ready}
    # what the facts promise is implemented (else the base class raises)
    overridden = lambda method: getattr(type(algo), method) is not getattr(AllToAll, method)  # noqa: E731
    assert overridden("group_dispatcher")  # the layer and the trainer hold any of them
    assert overridden("counts_schedule") == algo.facts.schedule_from_counts
    assert overridden("check_group") == algo.facts.equal_ranks_per_node


# One routing on 2 nodes x 2 ranks, expert e on rank e, rows of 100 B, only rank 0 has tokens:
# token 0 -> experts 2, 3 (both on node 1), token 1 -> experts 1, 2.
ROW = 100
TOPO = Topology(nodes=2, ranks_per_node=2)
PLACEMENT = [0, 1, 2, 3]


def _pfts():
    top = torch.tensor([[2, 3], [1, 2]])
    weights = torch.full((2, 2), 0.5)
    empty = build_pft(torch.zeros(0, 2, dtype=torch.int64), torch.zeros(0, 2), 4)
    return [build_pft(top, weights, 4)] + [empty] * 3


# Bytes per link class without the count exchange, by hand:
#   flat  rank 0 sends 1 row to rank 1 (intra), 2 rows to rank 2 and 1 to rank 3 (inter).
#   HALO  Phase I: 1 row to rank 1; Phase II: all 3 remote rows to rank 2 (same local rank on
#         node 1); Phase III: rank 2 forwards token 0's row for expert 3 to rank 3.
#   RBD   pilots across nodes: one per (token, node 1) = 2 rows, plus 32 B of metadata for each
#         of the 3 pairs on node 1; inside nodes: token 1's pilot to rank 1 (1 row + 32 B) and
#         token 0's replica on node 1 (1 row + 16 B of replica metadata).
HAND_LINK_BYTES = {
    "flat": (3 * ROW, 1 * ROW),
    "halo": (3 * ROW, 2 * ROW),
    "rbd": (2 * ROW + 3 * 32, (ROW + 32) + (ROW + 16)),
}


@pytest.mark.parametrize("name", ["flat", "halo", "rbd"])
def test_link_bytes_match_a_hand_count(name):
    gens = [torch.Generator().manual_seed(r) for r in range(4)]
    got = get_algorithm(name).link_bytes(_pfts(), PLACEMENT, TOPO, ROW, gens, with_counts=False)
    assert (got["inter_node"], got["intra_node"]) == HAND_LINK_BYTES[name]


@pytest.mark.parametrize("name", algorithm_names(schedule_from_counts=True))
def test_counts_schedule_is_the_routed_schedule_of_the_same_counts(name):
    algo = get_algorithm(name)
    C = [[0, 1, 2, 1], [0] * 4, [0] * 4, [0] * 4]  # rank 0's rows per destination above
    for with_counts in (True, False):
        assert sorted(algo.counts_schedule(C, TOPO, ROW, with_counts)) == sorted(
            algo.routed_schedule(_pfts(), PLACEMENT, TOPO, ROW, with_counts=with_counts)
        )


def test_schedule_phases_are_declared():
    for name in algorithm_names():
        algo = get_algorithm(name)
        gens = [torch.Generator().manual_seed(r) for r in range(4)]
        phases = {m[0] for m in algo.routed_schedule(_pfts(), PLACEMENT, TOPO, ROW, gens)}
        assert phases <= set(algo.phase_dependencies), name


# --- the registry ---------------------------------------------------------------------------


def test_unknown_names_and_facts_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"^unknown all-to-all 'ring'; known: flat, halo, rbd$"):
        get_algorithm("ring")
    with pytest.raises(ValueError, match="unknown all-to-all fact 'fast'"):
        algorithm_names(fast=True)
    with pytest.raises(ValueError, match="all-to-all 'ring'"):
        simulated.expected_schedule("ring", TOPO, ROW)
    # RBD's messages depend on the tokens: the simulator cannot build them from counts
    with pytest.raises(ValueError, match="rbd cannot be simulated from expected counts"):
        simulated.expected_schedule("rbd", TOPO, ROW)


def test_register_refuses_duplicates_and_broken_promises(monkeypatch):
    with pytest.raises(ValueError, match="already registered"):
        register(FlatAlgorithm())

    class Promises(RBDAlgorithm):  # says it schedules from counts but does not implement it
        facts = replace(RBDAlgorithm.facts, name="promises", schedule_from_counts=True)

    with pytest.raises(
        ValueError, match="schedule_from_counts is set but Promises does not implement"
    ):
        register(Promises())
    assert "promises" not in ALGORITHMS


class FakeFlat(FlatAlgorithm):
    facts = replace(FlatAlgorithm.facts, name="fake-flat", label="fake")


class FakeHalo(HaloAlgorithm):
    facts = replace(HaloAlgorithm.facts, name="fake-halo", label="fake HALO")


class FakeRouted(RBDAlgorithm):
    facts = replace(RBDAlgorithm.facts, name="fake-routed", label="fake RBD")


def _choices():
    """The choice lists of every caller that picks an all-to-all by name."""
    from moe_repro.cli.train_cmd import command as train
    from moe_repro.components.moe.moe_layer import MoELayer
    from moe_repro.components.training.pp_ep_trainer import TrainConfig
    from moe_repro.suites.alltoall import SUITE

    def accepted(make) -> set[str]:
        ok = set()
        for name in ("flat", "halo", "rbd", "fake-flat", "fake-halo", "fake-routed"):
            try:
                make(name)
                ok.add(name)
            except ValueError:
                pass
        return ok

    (option,) = [p for p in train.params if p.name == "alltoall"]
    return {
        "layer": accepted(lambda a: MoELayer(8, 4, 4, 2, all_to_all=a)),
        "trainer": accepted(lambda a: TrainConfig(model="tiny-moe", alltoall=a).validate()),
        "cli": set(option.type.choices),
        "suite": accepted(
            lambda a: SUITE.grid({"algo": [a], "platform": ["dgx-h100"], "nodes": [2]})
        ),
        "simulator": accepted(lambda a: simulated.expected_schedule(a, TOPO, ROW)),
    }


def test_every_callers_choices_come_from_the_registry(monkeypatch):
    before = _choices()
    every = {"flat", "halo", "rbd"}
    assert before == {
        "layer": every,
        "trainer": every,
        "cli": every,
        "suite": every,
        "simulator": {"flat", "halo"},
    }
    with monkeypatch.context() as m:
        for fake in (FakeFlat(), FakeHalo(), FakeRouted()):
            m.setitem(ALGORITHMS, fake.facts.name, fake)
        during = _choices()
    all_six = {"flat", "halo", "rbd", "fake-flat", "fake-halo", "fake-routed"}
    assert during == {
        "layer": all_six,
        "trainer": all_six,
        "cli": all_six,
        "suite": all_six,
        "simulator": {"flat", "halo", "fake-flat", "fake-halo"},
    }
    assert _choices() == before  # gone again


def test_callers_ask_the_facts_not_the_name(monkeypatch):
    from moe_repro.components.training.pp_ep_trainer import TrainConfig
    from moe_repro.suites.alltoall import MAX_PER_MESSAGE_RANKS, SUITE, simulate

    for fake in (FakeFlat(), FakeHalo(), FakeRouted()):
        monkeypatch.setitem(ALGORITHMS, fake.facts.name, fake)
    # the trainer checks equal ranks per node because the facts say so (EP group {0..3} over
    # nodes of 3 ranks), whatever the algorithm is called
    with pytest.raises(ValueError, match="same number"):
        TrainConfig(model="tiny-moe", ep=4, dp=3, alltoall="fake-halo", ranks_per_node=3).validate()
    TrainConfig(model="tiny-moe", ep=4, dp=3, alltoall="fake-flat", ranks_per_node=3).validate()
    # the suite simulates a copy of flat exactly as flat, and a copy of RBD message by message
    grid = {
        "platform": ["dgx-h100"],
        "nodes": [2],
        "gpus_per_node": [4],
        "tokens": [32],
        "hidden": [64],
        "experts": [8],
        "top_k": [2],
    }
    for real, fake in (("flat", "fake-flat"), ("halo", "fake-halo"), ("rbd", "fake-routed")):
        (p_real,) = SUITE.grid({**grid, "algo": [real]})
        (p_fake,) = SUITE.grid({**grid, "algo": [fake]})
        assert simulate(p_fake) == simulate(p_real)
    nodes = MAX_PER_MESSAGE_RANKS // 8 + 1
    with pytest.raises(ValueError, match="fake-routed is simulated per message"):
        SUITE.grid({**grid, "algo": ["fake-routed"], "nodes": [nodes], "gpus_per_node": [8]})
    SUITE.grid({**grid, "algo": ["fake-flat"], "nodes": [nodes], "gpus_per_node": [8]})


def test_facts_fields_are_what_callers_filter_on():
    names = {f.name for f in fields(AllToAllFacts)}
    assert {"equal_ranks_per_node", "schedule_from_counts"} <= names
    for name in algorithm_names():
        assert algorithm_names(**{f: getattr(get_algorithm(name).facts, f) for f in names}) == [
            name
        ]


# --- real ranks -----------------------------------------------------------------------------


def _check_registry_cases(per_rank):
    for cases in per_rank:
        assert {c["algo"] for c in cases} == set(algorithm_names())
        for c in cases:
            bad = [k for k, v in c.items() if v is False]
            assert not bad, c
        assert {c["algo"] for c in cases if "autograd_dw" in c} == set(algorithm_names())
        assert all("second_dispatch_reuses_buffer" in c for c in cases)


@pytest.mark.multiprocess
def test_every_registered_algorithm_equals_the_reference_on_2x2(targets_on_path):
    """Each algorithm chosen by name on 4 ranks over 2 emulated nodes: dispatch and combine
    == the loop reference, its messages == its schedule, its autograd form == one process's."""
    per_rank = run_ranks(
        "_alltoall_targets:registry_vs_reference",
        {"seeds": [1, 2, 3]},
        world_size=4,
        ranks_per_node=2,
        timeout_s=150,
    )
    _check_registry_cases(per_rank)
