"""The balancer and grouped-GEMM registries: every entry honours its interface, each registered
balancer's plan on small hand-worked micro-batches, a throwaway entry shows up wherever the
registry is read and is gone afterwards, and unknown names are refused with the known ones."""

import pytest
import torch

from moe_repro.components.balance import (
    BALANCERS,
    balancer_names,
    check_knobs,
    get_balancer,
    register_balancer,
)
from moe_repro.components.balance.base import Balancer, BalanceStep, DeviceWork
from moe_repro.components.balance.expert_migration import Swap
from moe_repro.components.balance.load_balance_eval import evaluate_trace
from moe_repro.components.balance.routing_trace import synthetic_trace
from moe_repro.components.moe.expert_mlp import ExpertMLP
from moe_repro.components.moe.grouped_gemm import (
    GROUPED_GEMM_KERNELS,
    GroupedGemmKernel,
    get_grouped_gemm,
    grouped_gemm,
    grouped_gemm_names,
    register_grouped_gemm,
)
from moe_repro.components.moe.moe_layer import ExpertPlacement
from moe_repro.suites import all_suites
from moe_repro.suites.grouped_gemm import variants


def _step(source_counts, previous=None, world=2):
    source_counts = torch.tensor(source_counts)
    placement = ExpertPlacement.contiguous(source_counts.shape[1], world)
    return BalanceStep(
        placement, source_counts, None if previous is None else torch.tensor(previous)
    )


def _random_steps():
    g = torch.Generator().manual_seed(3)
    for world, experts in ((2, 8), (4, 16), (4, 32)):  # dyn = 4 fits
        skew = torch.linspace(0, 3, experts).exp()  # later experts hotter: real imbalance
        rows = [
            (torch.rand(world, experts, generator=g) * skew * 20).round().long() for _ in range(2)
        ]
        yield BalanceStep(ExpertPlacement.contiguous(experts, world), rows[1], rows[0])


# --- balancers ----------------------------------------------------------------------------------


def test_the_labels_the_reproductions_print_are_registered():
    assert {"Before LB", "FasterMoE", "FEPLB", "LLEP", "EPLB"} <= set(balancer_names())
    assert balancer_names()[:4] == ("Before LB", "FasterMoE", "FEPLB", "LLEP")


@pytest.mark.parametrize("name", balancer_names())
def test_every_balancer_implements_the_interface(name):
    b = get_balancer(name)
    assert isinstance(b, Balancer) and b.name == name
    assert b.paper and b.description and "\n" not in b.description
    assert isinstance(b.needs_history, bool) and all(isinstance(k, str) for k in b.knobs)
    for step in _random_steps():
        work = b.run(step)
        world = step.placement.world_size
        assert isinstance(work, DeviceWork) and len(work.loads) == len(work.gemm_groups) == world
        # every row is computed exactly once, and a device's rows are the rows of its GEMMs
        assert sum(work.loads) == int(step.source_counts.sum())
        assert [sum(groups) for groups in work.gemm_groups] == work.loads
        assert all(r >= 0 for groups in work.gemm_groups for r in groups)
        if b.needs_history:
            with pytest.raises(ValueError, match="history"):
                b.run(BalanceStep(step.placement, step.source_counts))


def test_before_lb_by_hand():
    work = get_balancer("Before LB").run(_step([[3, 4, 1, 1], [0, 0, 0, 0]]))
    assert work.loads == [7, 2] and work.gemm_groups == [[3, 4], [1, 1]]


def test_feplb_by_hand():
    # history [9, 1, 2, 2], dyn = 1: dynamic experts 0 (rank 0) and 2 (rank 1, tie -> lower id).
    # actual [3, 4, 1, 1]: loads 7 | 2, gap 5, expert 0 (3 < 5) moves to rank 1: 4 | 5; then
    # rank 1 is the busiest and its dynamic expert 2 (1 row) is not below the gap 1: stop.
    work = get_balancer("FEPLB").run(
        _step([[3, 4, 1, 1], [0, 0, 0, 0]], [[9, 1, 2, 2], [0, 0, 0, 0]]), {"dyn": 1}
    )
    assert work.loads == [4, 5] and work.gemm_groups == [[4], [3, 1, 1]]
    assert [(m.expert, m.src, m.dst) for m in work.decision.moves] == [(0, 0, 1)]


def test_fastermoe_by_hand():
    # the example of test_balance_repros: shadows 0, 2, 3 predicted; each source computes its
    # own rows of them, and expert 1 (0 rows) stays on rank 0
    src = [[10, 0, 1, 1], [30, 0, 1, 1]]
    work = get_balancer("FasterMoE").run(_step(src, src), {"max_shadows": 4})
    assert work.decision == [0, 2, 3]
    assert work.loads == [12, 32] and work.gemm_groups == [[10, 0, 1, 1], [30, 1, 1]]


def test_llep_by_hand():
    # N = 44, capacity 22: rank 0 keeps 22 rows of expert 0, sends 8 of them and all 10 of
    # expert 1 to rank 1 (which had 4)
    work = get_balancer("LLEP").run(_step([[30, 10, 0, 4], [0, 0, 0, 0]]))
    assert work.loads == [22, 22] and work.gemm_groups == [[22], [8, 10, 4]]


def test_eplb_by_hand():
    # 2 experts, 2 devices, 1 + 1 slots each: history 30 | 10 -> expert 0 gets a second replica
    # (30 > 10), then expert 0 is at the cap of 2 (one per device), so expert 1 gets the last
    # slot: both experts on both devices. Actual 7 | 4 rows split evenly, the odd row to the
    # first replica.
    work = get_balancer("EPLB").run(_step([[7, 0], [0, 4]], [[30, 0], [0, 10]]))
    assert work.decision.replicas == [2, 2] and work.decision.experts_of_gpu == [[0, 1], [0, 1]]
    assert work.gemm_groups == [[4, 2], [3, 2]] and work.loads == [6, 5]


def test_piper_migration_by_hand():
    # history [9, 5, 1, 2] on [[0, 1], [2, 3]] (14 | 3): swapping 0 <-> 3 gives 7 | 10, the
    # best gap (3, tied with 1 <-> 2, first found wins); no swap then narrows 10 | 7.
    work = get_balancer("Piper migration").run(
        _step([[4, 3, 2, 1], [0, 0, 0, 0]], [[9, 5, 1, 2], [0, 0, 0, 0]])
    )
    assert work.decision == [Swap(0, 0, 3, 1)]
    assert work.gemm_groups == [[1, 3], [2, 4]] and work.loads == [4, 6]


def _fake_plan(step, knobs):
    """Everything on device 0, whatever the knob."""
    _fake_plan.seen = dict(knobs)
    rows = int(step.source_counts.sum())
    return DeviceWork(
        [rows] + [0] * (step.placement.world_size - 1),
        [[rows]] + [[] for _ in range(step.placement.world_size - 1)],
    )


FAKE = Balancer(
    name="All on zero",
    paper="none",
    description="every row on device 0",
    needs_history=False,
    plan=_fake_plan,
    knobs={"fake_knob": 3},
)


def test_a_registered_balancer_joins_the_replay_and_leaves(monkeypatch):
    trace = synthetic_trace(1, 3, 8, 2, 16, 2, seed=0)  # 16 tokens x top-2 x 2 ranks = 64 rows
    monkeypatch.setitem(BALANCERS, FAKE.name, FAKE)
    assert balancer_names()[-1] == FAKE.name
    stats = evaluate_trace(trace)
    assert list(stats) == list(balancer_names())
    assert stats[FAKE.name].token_straggler == 64 - 32 and stats[FAKE.name].samples == 2
    assert _fake_plan.seen == {"fake_knob": 3}  # its default
    evaluate_trace(trace, methods=[FAKE.name], fake_knob=5, dyn=2)
    assert _fake_plan.seen == {"fake_knob": 5}  # its own knob only
    monkeypatch.undo()
    assert FAKE.name not in balancer_names() and FAKE.name not in evaluate_trace(trace)
    with pytest.raises(ValueError, match="fake_knob"):
        evaluate_trace(trace, fake_knob=5)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError) as err:
        get_balancer("Tutel")
    assert all(name in str(err.value) for name in balancer_names())
    trace = synthetic_trace(1, 2, 4, 1, 8, 2)
    with pytest.raises(ValueError, match="FEPLB"):
        evaluate_trace(trace, methods=["Before LB", "Tutel"])
    with pytest.raises(ValueError, match="max_num_dyn"):
        check_knobs({"max_dyn": 8})
    with pytest.raises(ValueError, match="already registered"):
        register_balancer(get_balancer("FEPLB"))
    with pytest.raises(ValueError, match="ranks, experts"):
        BalanceStep(ExpertPlacement.contiguous(4, 2), torch.zeros(4, dtype=torch.int64))


# --- grouped GEMM kernels -----------------------------------------------------------------------


def _loop_reference(x, w, counts):
    out, start = [], 0
    for g, c in enumerate(counts):
        out.append(x[start : start + c].double() @ w[g].double())  # x[rows of g] @ w[g]
        start += c
    return torch.cat(out)


@pytest.mark.parametrize("name", grouped_gemm_names())
def test_every_kernel_equals_the_loop_reference(name):
    kernel = get_grouped_gemm(name)
    assert kernel.name == name and kernel.description and "\n" not in kernel.description
    g = torch.Generator().manual_seed(11)
    for k, m in ((5, 9), (16, 8)):  # odd widths: grouped_mm pads
        counts = torch.randint(0, 12, (6,), generator=g).tolist()
        counts[2] = 0  # at least one empty group
        counts[4] = max(counts[4], 1)  # and uneven, non-empty ones
        x = torch.randn(sum(counts), k, generator=g)
        w = torch.randn(len(counts), k, m, generator=g)
        y = grouped_gemm(x, w, torch.tensor(counts), name)
        assert y.shape == (sum(counts), m)
        assert torch.allclose(y.double(), _loop_reference(x, w, counts), atol=1e-5), counts


def test_a_registered_kernel_is_looked_up_everywhere(monkeypatch):
    calls = []

    def loop(x, w, counts):
        calls.append(counts.tolist())
        return _loop_reference(x, w, counts.tolist()).to(x.dtype)

    monkeypatch.setitem(
        GROUPED_GEMM_KERNELS, "loop", GroupedGemmKernel("loop", "a test loop", loop)
    )
    x, w = torch.randn(5, 3), torch.randn(2, 3, 4)
    grouped_gemm(x, w, torch.tensor([2, 3]), "loop")
    assert calls == [[2, 3]]
    assert "loop" in variants() and ExpertMLP(2, 3, 4, gemm="loop").gemm == "loop"
    monkeypatch.undo()
    assert "loop" not in grouped_gemm_names() and "loop" not in variants()
    with pytest.raises(ValueError, match="sequential"):
        grouped_gemm(x, w, torch.tensor([2, 3]), "loop")


def test_unknown_kernels_list_the_known_ones():
    with pytest.raises(ValueError) as err:
        get_grouped_gemm("cublas")
    assert all(name in str(err.value) for name in grouped_gemm_names())
    with pytest.raises(ValueError, match="grouped_mm"):
        ExpertMLP(2, 4, 4, gemm="cublas")
    with pytest.raises(ValueError, match="padded_bmm"):
        all_suites()["expert-gemm"].setup({"variant": "cublas"}, None)
    with pytest.raises(ValueError, match="already registered"):
        register_grouped_gemm(get_grouped_gemm("sequential"))
