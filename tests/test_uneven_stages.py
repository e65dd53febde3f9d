"""Uneven first/last pipeline stages in the parallelism planner (Megatron-LM's
--decoder-first/last-pipeline-num-layers), against components/model/pipeline_split."""

import pytest

from moe_repro.components.model.pipeline_split import stage_sizes
from moe_repro.components.model.zoo import get_model
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources import parallel_planner as P
from moe_repro.components.resources.memory_model import split_stages


def test_ends_split():
    # Qwen3-235B (94 layers) at PP 8 x VPP 4: middle stages 4 chunks of ceil(94/32) = 3
    # layers, the ends share 94 - 6 x 12 = 22 (the Model Zoo's embedding- and loss-as-layer split)
    assert P.ends_split(94, 8, 4) == (11, 11)
    assert P.ends_split(61, 8, 4) == (7, 6)  # the last stage (with the head) the smaller half
    assert P.ends_split(96, 8, 4) == (12, 12)  # even when the chunks divide
    assert P.ends_split(94, 32, 3) == (2, 2)
    assert P.ends_split(10, 1, 2) is None
    assert P.ends_split(20, 16, 2) is None  # the middle stages leave the ends nothing


@pytest.mark.parametrize(
    "key,pp,v,first,last",
    [("qwen3-235b-a22b", 8, 4, 11, 11), ("deepseek-v3", 8, 4, 7, 6), ("deepseek-v3", 4, 1, 13, 14)],
)
def test_split_stages_hold_pipeline_splits_layers(key, pp, v, first, last):
    m = get_model(key)
    sizes = stage_sizes(m.layers, pp, first, last)
    stages = split_stages(m, pp, v, first, last)
    for st in stages:
        assert st.n_layers == sizes[st.r]
        assert len(st.chunks) == v
        assert max(sum(c) for c in st.chunks) - min(sum(c) for c in st.chunks) <= 1
    # dense layers come first in model order: the first model chunk (on stage 0) takes them
    st0 = stages[0]
    assert st0.r == 0 and st0.chunks[0][0] == min(sum(st0.chunks[0]), m.n_dense_layers)


def _plan(**kw):
    m = get_model("qwen3-235b-a22b")
    args = dict(
        seq=4096,
        global_batch=2048,
        precision="megatron",
        zero=(1,),
        recompute=("selective",),
        tp=2,
        ep=32,
        cp=1,
        etp=1,
        sp=True,
    )
    args.update(kw)
    return P.plan_parallel(m, load_builtin("h200"), nodes=32, **args)


def test_a_fixed_vpp_that_does_not_divide_the_layers_is_planned_with_uneven_ends():
    pl = _plan(pp=8, vpp=4, micro_batches=128)
    c = pl.candidates[0]
    assert (c.first_stage_layers, c.last_stage_layers) == (11, 11)
    assert c.chunk_layers == 3  # the middle stages' chunks: 12 layers / 4
    assert c.layers_per_stage.startswith("11 + 12 x 6 + 11")


def test_uneven_ends_are_in_the_search_space():
    pl = _plan(pp=8, micro_batches=128)
    vpps = {(c.vpp, c.first_stage_layers, c.last_stage_layers) for c in pl.candidates}
    assert (4, 11, 11) in vpps or any(v > 1 and f for v, f, _ in vpps)
    assert pl.search["layouts"] > 1


def test_fixed_first_and_last_stage_layers():
    pl = _plan(pp=8, vpp=1, micro_batches=128, first_stage_layers=10, last_stage_layers=8)
    c = pl.candidates[0]
    assert (c.first_stage_layers, c.last_stage_layers) == (10, 8)
    assert c.layers_per_stage == "10 + 13 x 4 + 12 x 2 + 8"
    bad = _plan(pp=8, vpp=1, micro_batches=128, first_stage_layers=90, last_stage_layers=2)
    assert not bad.candidates
    assert any("uneven split" in r["reason"] for r in bad.rejected)
    with pytest.raises(ValueError, match="first stage layers"):
        _plan(pp=8, first_stage_layers=0)


def test_the_slowest_stage_sets_the_pace():
    # one more layer on the first stage can only slow the step (same everything else)
    even = _plan(pp=8, vpp=1, micro_batches=128, first_stage_layers=11, last_stage_layers=11)
    heavy = _plan(pp=8, vpp=1, micro_batches=128, first_stage_layers=16, last_stage_layers=6)
    assert heavy.candidates[0].step_s > even.candidates[0].step_s


def test_per_gpu_memory_takes_the_uneven_split_the_planner_searched():
    """memory_model.per_gpu_memory of an uneven split is the plan's memory of the same layout
    (the planner and the validation scorer share one split), and a heavier first stage binds."""
    from moe_repro.components.resources import memory_model as mm

    m, p = get_model("llama3-8b"), load_builtin("dgx-h100")
    plan = P.plan_parallel(
        m, p, 1, tp=1, pp=4, vpp=1, zero=(1,), recompute=("none",), global_batch=16,
        micro_batches=8, first_stage_layers=11, last_stage_layers=5,
    )  # fmt: skip
    c = plan.candidates[0]
    layout = mm.MemoryLayout(pp=4, dp=c.dp, micro_batch=c.micro_batch, micro_batches=8)
    uneven = mm.per_gpu_memory(m, p, layout, 4096, kind=None, zero=1,
                               first_stage_layers=11, last_stage_layers=5)  # fmt: skip
    even = mm.per_gpu_memory(m, p, layout, 4096, kind=None, zero=1)
    assert uneven.total == pytest.approx(c.memory["total"], rel=1e-12)
    assert uneven.stage == 0 and uneven.total > even.total
