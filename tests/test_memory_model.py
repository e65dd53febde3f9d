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
        mm.stage_memory(get_model("tiny-moe"), PP=2, EP=3, i=0, micro_batch=1, seq=8, M=2)
    with pytest.raises(ValueError, match="exceeds the layer count"):
        mm.stage_memory(get_model("tiny-moe"), PP=5, EP=2, i=0, micro_batch=1, seq=8, M=2)


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
NO_EXTRAS = mm.MemoryOptions(flash_attention=False, embeddings=False, shared_and_dense=False)


@pytest.mark.parametrize("PP,M", [(2, 4), (4, 4), (4, 9), (8, 8)])
def test_1f1b_skew_stage0_holds_pp_micro_batches_last_holds_one(PP, M):
    stages = mm.all_stages(PIPER_LIKE, PP=PP, EP=2, micro_batch=1, seq=4, M=M, opts=NO_EXTRAS)
    assert [s.in_flight for s in stages] == [PP - i for i in range(PP)]
    per_micro = stages[-1].activation_bytes  # the last stage holds exactly one micro-batch
    for i, s in enumerate(stages):
        assert s.activation_bytes == pytest.approx((PP - i) * per_micro)
    gpipe = mm.all_stages(
        PIPER_LIKE, PP=PP, EP=2, micro_batch=1, seq=4, M=M, schedule="gpipe", opts=NO_EXTRAS
    )
    assert all(
        s.in_flight == M and s.activation_bytes == pytest.approx(M * per_micro) for s in gpipe
    )


@pytest.mark.parametrize("PP", [1, 2, 4])
def test_stage_model_reduces_to_eq4(PP):
    """With Piper's conventions (EP=1 so both of Eq. 4's b readings agree), the stage model is Eq. 4
    plus exactly the norms and router Piper leaves out."""
    M, b = 4, 8
    m = PIPER_LIKE
    for i in range(PP):
        ours = mm.stage_memory(
            m, PP=PP, EP=1, i=i, micro_batch=b / M, seq=5, M=M, opts=NO_EXTRAS
        ).total
        eq4 = mm.piper_eq4(d=16, d_ffn=24, E=8, L=8, H=2, k=2, b=b, s=5, EP=1, PP=PP, M=M, i=i)
        left_out = m.layers / PP * (2 * 16 + 16 * 8) * 16  # norms 2d + router d E, 16 B each
        assert ours == pytest.approx(eq4 + left_out)


@pytest.mark.parametrize(
    "key,PP,EP", [("deepseek-v3", 8, 16), ("mixtral-8x7b", 4, 8), ("tiny-moe", 4, 2)]
)
def test_stages_partition_all_parameters(key, PP, EP):
    m = get_model(key)
    stages = mm.all_stages(m, PP=PP, EP=EP, micro_batch=1, seq=16, M=PP)
    held = sum(s.params_replicated + s.params_experts * EP for s in stages)
    assert held == param_counts(m).total - m.d_model  # the final norm is not placed on a stage


def test_zero_stages_bytes_per_param():
    assert mm.state_bytes_per_param(0, 4) == 16
    assert mm.state_bytes_per_param(1, 4) == 2 + 2 + 12 / 4
    assert mm.state_bytes_per_param(2, 4) == 2 + 14 / 4
    assert mm.state_bytes_per_param(3, 4) == 16 / 4
    with pytest.raises(ValueError):
        mm.state_bytes_per_param(4, 4)


def test_checkpointing_and_flash_reduce_memory():
    m = dataclasses.replace(get_model("mixtral-8x7b"))
    base = mm.stage_memory(m, 4, 8, 0, 1, 4096, 8, opts=mm.MemoryOptions(flash_attention=False))
    flash = mm.stage_memory(m, 4, 8, 0, 1, 4096, 8)
    ckpt = mm.stage_memory(m, 4, 8, 0, 1, 4096, 8, opts=mm.MemoryOptions(checkpointing=True))
    assert ckpt.activation_bytes < flash.activation_bytes < base.activation_bytes
    assert ckpt.static_bytes == flash.static_bytes == base.static_bytes


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
