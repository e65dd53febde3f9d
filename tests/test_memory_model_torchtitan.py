"""torchtitan's activation forms in the memory model: its per-op selective checkpointing and its
eager SwiGLU (memory_terms.MemorySettings ``selective`` and ``mlp``), counted by hand from the
shapes of torchtitan's blocks."""

import pytest

from moe_repro.components.model.zoo import get_model
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources import memory_model as MM
from moe_repro.components.resources import memory_terms as MT


def test_op_sac_keeps_every_other_matmul_sdpa_and_the_block_input_llama3_8b():
    m = get_model("llama3-8b")  # d 4096, 32 heads, 8 KV heads of 128, FFN 14336
    # wq 4096 (kept), wk 1024, wv 1024 (kept), wo 4096, w1 14336 (kept), w3 14336, w2 4096
    # (kept); SDPA's output 4096 and the block input 4096; bf16, + fp32 lse of 32 heads
    per_token = 2 * (4096 + 1024 + 14336 + 4096 + 4096 + 4096) + 4 * 32
    assert MM.torchtitan_op_sac_bytes(m, False, 1000) == pytest.approx(1000 * per_token)


def test_op_sac_under_tp_with_sequence_parallelism():
    m = get_model("llama3-8b")
    t = 4
    cols = 4096 / t + 1024 / t + 14336 / t  # kept column-parallel outputs, / TP
    rows = 4096  # w2's output: the full-width partial sum before the reduce-scatter
    kept = cols + rows + 4096 / t + 4096 / t + 2 * 4096 / t  # SDPA, input, two reduce-scatters
    expect = 10 * (2 * kept + 4 * 32 / t)
    assert MM.torchtitan_op_sac_bytes(m, False, 10, t=t, sp=True) == pytest.approx(expect)


def test_op_sac_moe_block_keeps_the_router_and_shared_expert_but_not_routed_experts():
    m = get_model("deepseek-v2-lite")
    a = m.mla
    assert a.q_lora_rank in (None, 0) and m.n_shared >= 1
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    h, d = m.heads, m.d_model
    ds = m.d_ffn_shared or m.d_ffn
    mms = [h * qk, a.kv_lora_rank + a.qk_rope_head_dim, h * (a.qk_nope_head_dim + a.v_head_dim)]
    mms += [d, m.n_experts] + [ds, ds, d] * m.n_shared
    kept = sum(mms[0::2]) + h * a.v_head_dim + d
    got = MM.torchtitan_op_sac_bytes(m, True, 1)
    assert got == pytest.approx(2 * kept + 4 * h)
    # routed experts' width never enters: doubling it leaves the kept bytes unchanged
    from dataclasses import replace

    wider = replace(m, d_ffn=2 * m.d_ffn, d_ffn_shared=ds)
    assert MM.torchtitan_op_sac_bytes(wider, True, 1) == pytest.approx(got)


def test_eager_swiglu_keeps_one_d_ffn_more_per_token():
    m = get_model("llama3-8b")
    assert MM.eager_swiglu_extra(m, False, 100) == 2 * 100 * 14336
    p = load_builtin("grand-teton-h100")
    lay = MM.MemoryLayout(dp=8, micro_batch=1, micro_batches=1)

    def act(mlp):
        st = MM.per_gpu_memory(
            m,
            p,
            lay,
            8192,
            kind="allocated",
            zero=3,
            recompute=("none", 0),
            settings=MT.MemorySettings(facts=MT.device_facts(p), framework="fsdp2", mlp=mlp),
        )
        return st.activations

    assert act("eager") - act("fused") == pytest.approx(m.layers * 2 * 8192 * 14336)


def test_torchtitan_selective_is_far_below_korthikantis_and_above_full():
    m = get_model("llama3-8b")
    p = load_builtin("grand-teton-h100")
    lay = MM.MemoryLayout(dp=8, micro_batch=2, micro_batches=1)

    def act(selective, mode):
        s = MT.MemorySettings(facts=MT.device_facts(p), framework="fsdp2", selective=selective)
        return MM.per_gpu_memory(
            m, p, lay, 8192, kind="allocated", zero=3, recompute=mode, settings=s
        ).activations

    op = act("torchtitan-op", ("selective", 0))
    assert act("korthikanti", ("full", MM.ALL_LAYERS)) < op < act("korthikanti", ("selective", 0))
    # 32 layers of the hand count above, 2 x 8192 tokens, plus one layer in backward and logits
    per_layer = 16384 * (2 * (4096 + 1024 + 14336 + 4096 + 4096 + 4096) + 4 * 32)
    assert op > 32 * per_layer


def test_unknown_forms_are_refused():
    with pytest.raises(ValueError, match="mlp"):
        MT.MemorySettings(mlp="lazy")
    with pytest.raises(ValueError, match="selective"):
        MT.MemorySettings(selective="every-op")


def test_a_compiled_loss_keeps_bf16_logits_and_writes_a_bf16_gradient():
    m = get_model("llama3-8b")  # vocabulary 128256
    p = load_builtin("grand-teton-h100")
    lay = MM.MemoryLayout(dp=8, micro_batch=1, micro_batches=1)

    def stage(loss):
        s = MT.MemorySettings(facts=MT.device_facts(p), framework="fsdp2", loss=loss)
        return MM.per_gpu_memory(
            m, p, lay, 4096, kind="allocated", zero=3, recompute=("full", MM.ALL_LAYERS), settings=s
        )

    eager, compiled = stage("torch"), stage("torch-compiled")
    logits = 4096 * 128256
    # eager: fp32 logits kept (4 B) + fp32 copy, log-softmax and gradients (8 B); compiled: the
    # bf16 logits (2 B) and the bf16 gradient (2 B)
    assert eager.activations - compiled.activations == pytest.approx(2 * logits)
    loss = "fp32 logits and loss transient"
    assert dict(eager.extras)[loss] == pytest.approx(8 * logits)
    assert dict(compiled.extras)[loss] == pytest.approx(2 * logits)


def test_torchs_loss_under_tp_is_its_loss_parallel():
    m = get_model("llama3-8b")
    p = load_builtin("grand-teton-h100")
    t = 4
    lay = MM.MemoryLayout(tp=t, sp=True, dp=2, micro_batch=1, micro_batches=1)
    s = MT.MemorySettings(facts=MT.device_facts(p), framework="fsdp2", loss="torch")
    st = MM.per_gpu_memory(
        m, p, lay, 4096, kind="allocated", zero=3, recompute=("full", MM.ALL_LAYERS), settings=s
    )
    # loss_parallel's forward holds x, shifted and exp(shifted) (fp32), its backward the saved
    # output, zeros_like(x), exp(x) and their sum: 12 B per local logit beside the 4 B kept
    local_logits = 4096 * 128256 / t
    assert dict(st.extras)["fp32 logits and loss transient"] == pytest.approx(12 * local_logits)
