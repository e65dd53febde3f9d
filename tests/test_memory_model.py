"""Memory model: Piper Eq. 1-5 on hand-computed small cases, the 1F1B stage skew, ZeRO, X-MoE."""

from __future__ import annotations

import dataclasses

import pytest

from moe_repro.components.resources import memory_model as mm
from moe_repro.components.model.params import param_counts
from moe_repro.components.model.zoo import MoEModel, get_model

# d=2, d_ffn=3, E=4, L=2, H=1, k=2, b=2, s=3 (hand-computed below, per layer):
#   static: 64 d^2 = 256; 48 E d d_ffn = 1152 (EP=2: 576)
#   attention act: 12 b s d = 144; 4 H b s^2 = 72 (flash: 2 b H s = 12)
#   expert act: 2 b s k (3 d_ffn + d) = 2*2*3*2*11 = 264 (EP=2: 132)
SMALL = dict(d=2, d_ffn=3, E=4, L=2, H=1, k=2, b=2, s=3)


def test_eq1_unpartitioned():
    assert mm.piper_eq1(**SMALL) == 2 * (256 + 1152 + 144 + 72 + 264) == 3776
    assert mm.piper_eq1(**SMALL, flash=True) == 2 * (256 + 1152 + 144 + 12 + 264) == 3656


def test_eq2_expert_data_parallel():
    assert mm.piper_eq2(**SMALL, EP=2) == 2 * (256 + 576 + 144 + 72 + 132) == 2360


def test_eq3_gpipe():
    assert mm.piper_eq3(**SMALL, EP=2, PP=2) == 1180


def test_eq4_1f1b_per_stage_and_eq5_skew():
    # One micro-batch of b/M = 1 sequence: 12*1*3*2 + 4*1*1*9 + 2*1*3*2*11/2 = 72 + 36 + 66 = 174.
    s0 = mm.piper_eq4(**SMALL, EP=2, PP=2, M=2, i=0)
    s1 = mm.piper_eq4(**SMALL, EP=2, PP=2, M=2, i=1)
    assert s0 == 1 * (256 + 576 + 2 * 174) == 1180
    assert s1 == 1 * (256 + 576 + 1 * 174) == 1006
    assert mm.piper_eq5(**SMALL, EP=2, PP=2, M=2) == 174 == s0 - s1


@pytest.mark.parametrize("PP,M", [(2, 2), (4, 8), (3, 7)])
def test_eq5_equals_first_minus_last_stage(PP, M):
    args = dict(d=16, d_ffn=24, E=8, L=12, H=2, k=2, b=14, s=5, EP=4, PP=PP, M=M)
    first = mm.piper_eq4(**args, i=0)
    last = mm.piper_eq4(**args, i=PP - 1)
    assert mm.piper_eq5(**args) == pytest.approx(first - last)


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError, match="EP"):
        mm.piper_eq2(**SMALL, EP=0)
    with pytest.raises(ValueError, match="stage"):
        mm.piper_eq4(**SMALL, EP=2, PP=2, M=2, i=2)
    with pytest.raises(ValueError, match="does not divide"):
        mm.all_stages(get_model("tiny-moe"), PP=2, EP=3, micro_batch=1, seq=8, M=2)
    with pytest.raises(ValueError, match="exceeds the layer count"):
        mm.all_stages(get_model("tiny-moe"), PP=5, EP=2, micro_batch=1, seq=8, M=2)


PIPER_LIKE = MoEModel(
    key="p",
    name="p",
    layers=8,
    d_model=16,
    d_ffn=24,
    n_experts=8,
    top_k=2,
    n_mat=3,
    n_heads=2,
    attn_params="4d2",
)


def _layout_memory(m, PP, EP, M=None, v=1):
    from moe_repro.components.resources import formulas as F

    lm = mm.LayerMemory(m, 16, F.precision("bf16-adam"))
    layout = mm.MemoryLayout(pp=PP, vpp=v, ep=EP, dp=EP, micro_batches=M or PP)
    return mm.LayoutMemory(lm, layout, mm.pipeline_stages(m, PP, v, every=True))


@pytest.mark.parametrize("PP,M", [(2, 4), (4, 4), (4, 9), (8, 8)])
def test_1f1b_skew_stage0_holds_pp_micro_batches_last_holds_one(PP, M):
    stages = mm.all_stages(PIPER_LIKE, PP=PP, EP=2, micro_batch=1, seq=4, M=M)
    per_micro = stages[-1].activations  # the last stage holds exactly one micro-batch
    for i, s in enumerate(stages):
        assert s.activations == pytest.approx((PP - i) * per_micro)
    gpipe = mm.all_stages(PIPER_LIKE, PP=PP, EP=2, micro_batch=1, seq=4, M=M, schedule="gpipe")
    assert all(s.activations == pytest.approx(M * per_micro) for s in gpipe)


def test_in_flight_per_schedule():
    lay = mm.MemoryLayout(pp=4, micro_batches=8)
    assert [mm.in_flight(lay, r) for r in range(4)] == [4, 3, 2, 1]
    gpipe = dataclasses.replace(lay, schedule="gpipe")
    assert [mm.in_flight(gpipe, r) for r in range(4)] == [8] * 4
    inter = dataclasses.replace(lay, vpp=2)  # Megatron-core: 2 (PP - r - 1) + (v - 1) PP + 1
    assert [mm.in_flight(inter, r) for r in range(4)] == [11, 9, 7, 5]
    with pytest.raises(ValueError, match="schedule"):
        mm.in_flight(dataclasses.replace(lay, schedule="zb"), 0)


@pytest.mark.parametrize(
    "key,PP,EP", [("deepseek-v3", 8, 16), ("mixtral-8x7b", 4, 8), ("tiny-moe", 4, 2)]
)
def test_stages_partition_all_parameters(key, PP, EP):
    m = get_model(key)
    lay = _layout_memory(m, PP, EP)
    held = sum(d + e * EP for d, e in lay.params)
    head_copy = m.vocab * m.d_model if (m.tie_embeddings and m.vocab and PP > 1) else 0
    assert held == param_counts(m).total + head_copy


def test_a_stage_is_its_terms_and_zero_shards_the_state():
    m = get_model("mixtral-8x7b")
    z0, z1 = (
        mm.all_stages(m, 4, 8, 1, 4096, 8, opts=mm.MemoryOptions(zero_stage=z))[0] for z in (0, 1)
    )
    assert z0.total == pytest.approx(sum(z0.terms().values()))
    assert z0.to_dict()["total"] == z0.total and z0.binding_term() in mm.StageMemory.TERMS
    # ZeRO-1 shards master weights and moments of the dense part over the EP group (experts:
    # over DP = 1): weights and gradients stay
    assert z1.weights == z0.weights and z1.grads == z0.grads and z1.optimizer < z0.optimizer


def test_checkpointing_and_flash_reduce_memory():
    m = dataclasses.replace(get_model("mixtral-8x7b"))
    base = mm.all_stages(m, 4, 8, 1, 4096, 8, opts=mm.MemoryOptions(flash_attention=False))[0]
    flash = mm.all_stages(m, 4, 8, 1, 4096, 8)[0]
    ckpt = mm.all_stages(m, 4, 8, 1, 4096, 8, opts=mm.MemoryOptions(checkpointing=True))[0]
    assert ckpt.activations < flash.activations < base.activations
    static = lambda s: s.weights + s.grads + s.optimizer
    assert static(ckpt) == static(flash) == static(base)


@pytest.mark.parametrize(
    "key,nodes,pp,ep,zero,ckpt",
    [
        ("mixtral-8x7b", 2, 2, 8, 0, False),
        ("mixtral-8x7b", 4, 4, 8, 1, True),
        ("deepseek-moe-16b", 2, 4, 4, 0, False),
    ],
)
def test_both_planners_give_one_memory_for_one_layout(key, nodes, pp, ep, zero, ckpt):
    """Piper's PP x EP planner and the parallelism planner, asked for the same layout (TP = CP =
    ETP = 1, the same M, global batch, ZeRO stage and recompute), need the same bytes on the
    same binding stage: they share one memory model."""
    from moe_repro.components.network.platform import load_builtin
    from moe_repro.components.resources.parallel_planner import plan_parallel
    from moe_repro.components.resources.planner import plan as piper_plan

    m, p = get_model(key), load_builtin("h200")
    G = nodes * p.gpus_per_node
    M, B = 4 * pp, 4 * G
    piper = piper_plan(
        m,
        p,
        nodes,
        seq=4096,
        global_batch=B,
        micro_batches=M,
        zero_stage=zero,
        allow_checkpointing=ckpt,
        layout=(pp, ep),
    )
    (c,) = piper.candidates
    par = plan_parallel(
        m,
        p,
        nodes,
        seq=4096,
        global_batch=B,
        micro_batches=M,
        zero=(zero,),
        recompute=("full",) if c.checkpointing else ("none",),
        tp=1,
        pp=pp,
        ep=ep,
        cp=1,
        etp=1,
        vpp=1,
    )
    best = par.best if c.feasible else min(par.candidates, key=lambda x: x.memory["total"])
    assert best is not None and (best.pp, best.ep, best.tp, best.dp) == (pp, ep, 1, ep)
    assert best.memory["total"] == pytest.approx(c.peak_bytes, rel=1e-12)
    assert best.memory_stage == c.peak_stage


def test_xmoe_table2_and_ssmb_tradeoff():
    conv = mm.xmoe_activation_elements(b=2, s=3, h=4, h_ffn=16, k=1)
    spec = mm.xmoe_activation_elements(b=2, s=3, h=4, h_ffn=16 // 8, k=8)  # m = 8
    assert spec["A_dispatch"] == 8 * conv["A_dispatch"] == 8 * 2 * 3 * 4
    assert spec["A_interm0"] == conv["A_interm0"] == 2 * 3 * 16
    # Eq. 1 vs Eq. 2 at EP = E: SSMB wins iff 4 c k S H > 8 H_FFN H, i.e. k/H_FFN > 2/(c S).
    for k, hf, S in [(8, 2048, 4096), (2, 14336, 8192), (2, 4864, 4096), (2, 4864, 8192)]:
        saving = mm.ssmb_activation_saving(1.0, k, S, 7168, 4)
        cost = mm.ssmb_model_state_cost(64, 64, hf, 7168, 4)
        assert mm.ssmb_beats_ted(k, hf, S) == (saving > cost)
