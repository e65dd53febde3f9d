"""components.resources.formulas against numbers worked out by hand from the published formulas.

Every expected value below is arithmetic written out from its source (cited beside it); none is
obtained by calling the code under test.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from moe_repro.components.model.zoo import MLA, MoEModel, get_model
from moe_repro.components.resources import formulas as F

GB = 1e9

# ------------------------------------------------------------------------------------------
# Configurations (written out here, not taken from the zoo, so the tests pin the formulas)
# ------------------------------------------------------------------------------------------

# Mixtral 8x7B (Jiang et al. 2024; config.json): 32 layers, d 4096, expert FFN 14336 (SwiGLU),
# 8 experts top-2, 32 heads of 128, 8 KV heads, vocabulary 32000, untied embeddings.
MIXTRAL = MoEModel(
    key="mixtral-like",
    name="m",
    layers=32,
    d_model=4096,
    d_ffn=14336,
    n_experts=8,
    top_k=2,
    n_mat=3,
    n_heads=32,
    n_kv_heads=8,
    head_dim=128,
    vocab=32000,
)

# DeepSeek-V3 (DeepSeek-AI 2024, Sec. 4.2 and config.json): 61 layers, first 3 dense (FFN 18432),
# d 7168, 256 routed experts top-8 + 1 shared, expert width 2048, MLA q_lora 1536, kv_lora 512,
# nope 128, rope 64, v 128, 128 heads, vocabulary 129280, untied.
DSV3 = MoEModel(
    key="dsv3-like",
    name="d",
    layers=61,
    moe_layers=58,
    d_model=7168,
    d_ffn=2048,
    n_experts=256,
    n_shared=1,
    top_k=8,
    n_mat=3,
    n_heads=128,
    vocab=129280,
    d_ffn_dense=18432,
    attn_params="mla",
    mla=MLA(
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
    ),
)

# GPT-3 175B (Brown et al. 2020 Table 2.1): 96 layers, d 12288, 96 heads of 128, FFN 4d, context 2048.
GPT3 = dict(s=2048, b=1, h=12288, a=96, L=96, V=50257)


def _mixtral_by_hand():
    d, f, L, V = 4096, 14336, 32, 32000
    attn = d * 32 * 128 + 2 * d * 8 * 128 + 32 * 128 * d  # Q + K,V (8 KV heads) + O = 41,943,040
    expert = 3 * d * f  # 176,160,768
    router = d * 8
    norms = 2 * d
    total = L * (attn + 8 * expert + router + norms) + 2 * V * d + d
    active = L * (attn + 2 * expert + router + norms) + 2 * V * d + d
    return total, active


def _dsv3_by_hand():
    d, H, rq, rkv, dn, dr, dv = 7168, 128, 1536, 512, 128, 64, 128
    # DeepSeek-V2 Sec. 2.1: W^DQ, q norm, W^UQ/W^QR, W^DKV+W^KR, kv norm, W^UK/W^UV, W^O.
    mla = d * rq + rq + rq * H * (dn + dr) + d * (rkv + dr) + rkv + rkv * H * (dn + dv) + H * dv * d
    assert mla == 187_107_328
    expert = 3 * d * 2048
    dense_layer = mla + 3 * d * 18432 + 2 * d
    moe_total = mla + (256 + 1) * expert + d * 256 + 2 * d
    moe_active = mla + (8 + 1) * expert + d * 256 + 2 * d
    emb = 2 * 129280 * d
    total = 3 * dense_layer + 58 * moe_total + emb + d
    active = 3 * dense_layer + 58 * moe_active + emb + d
    return total, active, mla


# ------------------------------------------------------------------------------------------
# 1. Parameters
# ------------------------------------------------------------------------------------------


def test_mixtral_parameters_by_hand():
    total, active = _mixtral_by_hand()
    assert total == 46_702_792_704  # the public checkpoint's safetensors total
    p = F.parameters(MIXTRAL)
    assert (p["total"], p["active"]) == (total, active)
    assert round(active / 1e9, 1) == 12.9  # Mixtral paper: 13B active ("12.9B" on the model card)
    assert p["router"] == 32 * 4096 * 8
    assert (p["embedding"], p["lm_head"]) == (32000 * 4096, 32000 * 4096)


def test_deepseek_v3_parameters_by_hand():
    total, active, mla = _dsv3_by_hand()
    p = F.parameters(DSV3)
    assert (p["total"], p["active"]) == (total, active)
    assert round(total / 1e9) == 671  # V3 report: 671B total (MTP module excluded)
    # V3 report: "37B activated". Counting both embedding tables whole gives 37.55B; without the
    # input table (a lookup, not a matmul) 36.63B -- the printed 37B sits between the two readings.
    assert round(active / 1e9, 2) == 37.55
    assert round((active - 129280 * 7168) / 1e9, 2) == 36.63
    assert p["attention"] == 61 * (mla - 1536 - 512)  # latent norms are reported under norms
    assert p["router"] == 58 * 7168 * 256
    parts = (
        "embedding",
        "lm_head",
        "attention",
        "norms",
        "router",
        "routed_experts",
        "shared_experts",
        "dense_ffn",
        "extra",
    )
    assert sum(p[k] for k in parts) == p["total"]


@pytest.mark.parametrize(
    "key,L,d,f,H,kv,V,expected",
    [
        # Llama 3 Herd of Models Table 3; released checkpoints: 8,030,261,248 / 70,553,706,496 / 405,853,388,800
        ("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8_030_261_248),
        ("llama3-70b", 80, 8192, 28672, 64, 8, 128256, 70_553_706_496),
        ("llama3-405b", 126, 16384, 53248, 128, 8, 128256, 405_853_388_800),
    ],
)
def test_llama3_zoo_counts_by_hand(key, L, d, f, H, kv, V, expected):
    by_hand = L * (d * H * 128 + 2 * d * kv * 128 + H * 128 * d + 3 * d * f + 2 * d) + 2 * V * d + d
    assert by_hand == expected
    m = get_model(key)
    assert m.family == "dense" and m.n_moe_layers == 0
    p = F.parameters(m)
    assert p["total"] == p["active"] == expected
    assert p["router"] == p["routed_experts"] == 0


def test_gpt3_zoo_count_by_hand():
    h, L, V = GPT3["h"], GPT3["L"], GPT3["V"]
    by_hand = L * (4 * h * h + 2 * 4 * h * h + 2 * h) + V * h + h  # tied head, 2-matrix FFN
    p = F.parameters(get_model("gpt3-175b"))
    assert p["total"] == by_hand == 174_566_105_088
    assert round(by_hand / 1e9) == 175  # Brown et al. Table 2.1: 175.0B (biases, positions omitted)
    assert (
        p["lm_head"] == 0 and p["matmul_active"] == by_hand - L * 2 * h - h
    )  # tied head still multiplies


# ------------------------------------------------------------------------------------------
# 2. FLOPs
# ------------------------------------------------------------------------------------------


def test_gpt3_training_flops_equal_narayanan_eq3():
    B, s, l, h, V = 1536, GPT3["s"], GPT3["L"], GPT3["h"], GPT3["V"]
    eq3 = 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))  # Narayanan SC'21 Eq. 3
    assert F.narayanan_eq3_flops(B, s, l, h, V) == pytest.approx(eq3, rel=1e-15)
    ours = (
        F.train_flops_per_token(get_model("gpt3-175b"), s, attention="full", recompute="full")
        * B
        * s
    )
    assert ours == pytest.approx(eq3, rel=1e-12)
    assert ours == pytest.approx(4.5108e18, rel=1e-4)  # ~4.51 EFLOP per iteration of 1536 x 2048


def test_gpt3_training_flops_equal_current_megatron():
    # Megatron-LM training.py num_floating_point_operations (transformer_flops), no MoE, MHA:
    # per token 3 x 2 x [h (q + k + v) + q s / 2 x 2 + q h] per layer + 3 x 2 x h (2 f) per layer
    # + 3 x 2 x h V, with q = k = v = h (kv_channels 128 x 96 heads) and f = 4h.
    s, l, h, V = GPT3["s"], GPT3["L"], GPT3["h"], GPT3["V"]
    megatron = l * 6 * (3 * h * h + h * s / 2 * 2 + h * h) + l * 6 * h * (2 * 4 * h) + 6 * h * V
    ours = F.train_flops_per_token(get_model("gpt3-175b"), s, attention="causal", recompute="none")
    assert ours == pytest.approx(megatron, rel=1e-12)


def test_mixtral_flops_per_token_by_hand():
    s = 4096
    total, active = _mixtral_by_hand()
    matmul = active - 32000 * 4096 - (32 * 2 * 4096 + 4096)  # no input lookup, no norm weights
    core = 32 * 2 * s * 32 * (128 + 128)  # L x 2 s H (d_qk + d_v): QK^T and AV, all keys
    assert F.forward_flops_per_token(MIXTRAL, s) == 2 * matmul + core
    assert F.forward_flops_per_token(MIXTRAL, s, attention="causal") == 2 * matmul + core / 2
    assert F.forward_flops_per_token(MIXTRAL, s, attention="none") == 2 * matmul
    assert F.train_flops_per_token(MIXTRAL, s) == 3 * (2 * matmul + core)
    assert F.train_flops_per_token(MIXTRAL, s, attention="none") == 6 * matmul  # the 6N rule
    assert (
        F.train_flops_per_token(MIXTRAL, s, recompute="selective") == 3 * (2 * matmul + core) + core
    )
    head = 2 * 32000 * 4096
    assert F.train_flops_per_token(MIXTRAL, s, recompute="full") == 4 * (2 * matmul + core) - head


def test_deepseek_v3_flops_per_token_by_hand():
    s = 4096
    total, active, mla = _dsv3_by_hand()
    d = 7168
    matmul_attention = mla - 1536 - 512  # latent norms are elementwise, not matmul
    per_dense = 2 * (matmul_attention + 3 * d * 18432)
    per_moe = 2 * (matmul_attention + 9 * 3 * d * 2048 + d * 256)  # 8 routed + 1 shared + router
    core = 2 * s * 128 * (192 + 128)  # MLA: q/k head 128 + 64, v head 128
    head = 2 * 129280 * d
    expected = 3 * per_dense + 58 * per_moe + 61 * core + head
    assert F.forward_flops_per_token(DSV3, s) == pytest.approx(expected, rel=1e-15)
    parts = F.forward_flops_breakdown(DSV3, s)
    assert parts["router"] == 2 * 58 * d * 256 and parts["head"] == head


# ------------------------------------------------------------------------------------------
# 3. Activation memory (Korthikanti et al. 2022)
# ------------------------------------------------------------------------------------------


def test_gpt3_layer_activations_korthikanti_table2():
    s, b, h, a, t = GPT3["s"], GPT3["b"], GPT3["h"], GPT3["a"], 8
    sbh = s * b * h
    five_as_h = 5 * a * s / h
    assert five_as_h == 80  # GPT-3: 5as/h = 80
    act = lambda **kw: F.activation_bytes_per_layer(s, b, h, a, **kw)
    assert act() == sbh * (34 + five_as_h)  # Table 2, no parallelism: 2.87 GB
    assert round(act() / GB, 2) == 2.87
    assert act(t=t) == sbh * (10 + 24 / t + five_as_h / t)  # tensor parallel
    assert act(t=t, sp=True) == sbh * (34 / t + five_as_h / t)  # tensor + sequence parallel
    assert act(t=t, recompute="selective") == sbh * (10 + 24 / t)  # TP + selective
    assert act(t=t, sp=True, recompute="selective") == sbh * 34 / t  # TP + SP + selective
    assert act(t=t, recompute="full") == 2 * sbh  # full recompute, as Table 2 prints it
    assert act(t=t, sp=True, recompute="full") == 2 * sbh / t  # the SP-sharded layer input
    assert round(act(t=t, sp=True, recompute="selective") / GB, 3) == 0.107
    # Sec. 5: selective recomputation removes 5as/h of 34 + 5as/h: 70% for GPT-3, and 65% for
    # MT-NLG 530B (a = 128, h = 20480: 5as/h = 64).
    assert round(1 - act(recompute="selective") / act(), 2) == 0.70
    mtnlg = lambda **kw: F.activation_bytes_per_layer(2048, 1, 20480, 128, **kw)
    assert round(1 - mtnlg(recompute="selective") / mtnlg(), 2) == 0.65


def test_activations_equal_megatron_theoretical_memory():
    # Megatron-LM theoretical_memory_usage.py, per layer before the / tp of the return:
    # with SP + selective: s b h (18 + 4 f / h) / t; without SP: s b h (10 + 24 / t).
    s, b, h, a, t, f = 4096, 2, 4096, 32, 4, 16384
    sp_sel = s * b * h * (18 + 4 * f / h) / t
    assert (
        F.activation_bytes_per_layer(s, b, h, a, t=t, sp=True, recompute="selective", ffn=f)
        == sp_sel
    )
    no_sp = s * b * h * (10 + 24 / t)
    assert F.activation_bytes_per_layer(s, b, h, a, t=t, recompute="selective") == no_sp


def test_activation_extensions_by_hand():
    s, b, h, a = 1024, 2, 1024, 8
    sbh = s * b * h
    # SwiGLU (3 matrices, f = 2816) with no dropout and fp32 values:
    # attention 2 (input) + 4 (Q, K) + 2 (V) + 2 (proj input) + LN 4 + MLP input 2 = 16 sbh-bytes
    # at 2 B/value, i.e. 8 values of sbh; MLP intermediates 3 f; core: the softmax output only.
    f, v = 2816, 4
    expected = 8 * sbh * v + 3 * s * b * f * v + a * s * s * b * v
    assert (
        F.activation_bytes_per_layer(s, b, h, a, ffn=f, n_mat=3, dropout=False, bytes_per_value=v)
        == expected
    )
    # Context parallelism cp = 4: s/4 queries per rank: linear terms / 4, scores a (s/4) s b.
    cp = 4
    expected_cp = 34 * sbh / cp + 5 * a * (s / cp) * s * b
    assert F.activation_bytes_per_layer(s, b, h, a, cp=cp) == expected_cp


def test_moe_layer_activations_by_hand():
    # Mixtral-like MoE layer, s = 4096, b = 1, no parallelism, no dropout, bf16 (2 B):
    s, b, d, f, k, E = 4096, 1, 4096, 14336, 2, 8
    n = s * b
    attention = (
        2 * n * d  # two layer-norm inputs
        + n * d  # QKV input
        + n * (4096 + 1024 + 1024)  # Q, K, V (8 KV heads of 128)
        + n * 4096  # output-projection input
        + 32 * n * s
    )  # softmax output per head (no dropout)
    mlp = (
        n * d  # MLP input (router, shared experts)
        + n * E  # router probabilities
        + k * n * d  # dispatched copies (X-MoE A_dispatch)
        + k * n * 3 * f  # expert intermediates: gate, up, product
        + k * n * d
    )  # expert outputs for the combine (A_combine)
    expected = 2 * (attention + mlp)
    assert F.moe_activation_bytes_per_layer(MIXTRAL, s, b) == expected
    # Selective recomputation drops the scores; TP 4 with SP divides everything by 4.
    sel = expected - 2 * 32 * n * s
    assert F.moe_activation_bytes_per_layer(MIXTRAL, s, b, recompute="selective") == sel
    assert (
        F.moe_activation_bytes_per_layer(MIXTRAL, s, b, t=4, sp=True, recompute="selective")
        == sel / 4
    )
    assert F.moe_activation_bytes_per_layer(MIXTRAL, s, b, recompute="full") == 2 * n * d
    with pytest.raises(ValueError, match="sequence parallelism"):
        F.moe_activation_bytes_per_layer(MIXTRAL, s, b, t=4)


def test_moe_terms_match_xmoe_table2():
    # X-MoE Table 2 (elements per MoE layer, padding-free): A_dispatch = A_combine = k b s H,
    # A_interm^0 = A_interm^1 = k b s H_FFN; X-MoE Large: H 7168, H_FFN 2048, top-8, 2-matrix FFN.
    m = get_model("xmoe-large")
    b, s, H, H_ffn, k = 1, 4096, 7168, 2048, 8
    elements = 2 * k * b * s * H + 2 * k * b * s * H_ffn
    t = F.moe_activation_terms_per_layer(m, s, b)
    assert t["dispatch"] + t["combine"] + t["expert_intermediate"] == 2 * elements  # 2 B each


def test_dense_layer_of_moe_model_reduces_to_korthikanti():
    # GPT-3 read as a zoo model, dense layer with dropout: exactly Table 2's 34 sbh + 5 a s^2 b.
    s, b, h, a = GPT3["s"], 1, GPT3["h"], GPT3["a"]
    g = get_model("gpt3-175b")
    assert F.moe_activation_bytes_per_layer(g, s, b, moe=False, dropout=True) == s * b * h * (
        34 + 5 * a * s / h
    )
    with pytest.raises(ValueError, match="no MoE layer"):
        F.moe_activation_bytes_per_layer(g, s, b)


# ------------------------------------------------------------------------------------------
# 4. Model state (ZeRO)
# ------------------------------------------------------------------------------------------


def test_zero_figure1_7_5b_on_64_gpus():
    psi, nd, K = 7.5e9, 64, 12  # ZeRO Fig. 1: Psi = 7.5B, N_d = 64, K = 12
    expected = {
        0: (2 + 2 + K) * psi,
        1: 2 * psi + 2 * psi + K * psi / nd,
        2: 2 * psi + (2 + K) * psi / nd,
        3: (2 + 2 + K) * psi / nd,
    }
    printed = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}  # GB, as Fig. 1 prints them
    for stage in range(4):
        got = F.model_state_bytes(psi, nd, stage, "bf16-adam")["total"]
        assert got == expected[stage]
        assert round(got / GB, 1) == printed[stage]


def test_precision_presets_by_hand():
    psi, dp = 1e9, 8
    # Megatron-LM theoretical_memory_usage.py: 18 B/param; 6 + 12/DP with the distributed optimizer.
    assert F.model_state_bytes(psi, dp, 0, "megatron")["total"] == 18 * psi
    assert F.model_state_bytes(psi, dp, 1, "megatron")["total"] == (6 + 12 / dp) * psi
    # MoP Eq. 2: ZeRO-3 / FSDP 16 Theta / W; with MoP's host-resident optimizer (Sec. 3.5) the
    # device keeps 4 Theta / W and the host 12 Theta / W.
    mop = F.model_state_bytes(psi, dp, 3, "mop")
    assert (mop["total"], mop["host"]) == (4 * psi / dp, 12 * psi / dp)
    assert F.model_state_bytes(psi, dp, 3, "mop", offload_optimizer=False)["total"] == 16 * psi / dp
    # X-MoE App. C.2: under ZeRO-1 a replicated parameter costs 4 B (weight + gradient) on every rank.
    x = F.model_state_bytes(psi, dp, 1, "xmoe")
    assert x["weights"] + x["grads"] == 4 * psi and F.PRECISION_PRESETS["xmoe"].zero_stage == 1
    assert F.model_state_bytes(psi, 1, 0, "piper")["total"] == 16 * psi  # Piper III-A1
    assert (
        F.model_state_bytes(psi, 1, 0, "adam-8bit")["total"] == (2 + 2 + 4 + 2) * psi
    )  # Dettmers 2022
    assert (
        F.model_state_bytes(psi, 1, 0, "deepseek-v3-fp8")["total"] == (1 + 4 + 4 + 4) * psi
    )  # V3 Sec. 3.3
    assert all(p.source for p in F.PRECISION_PRESETS.values())
    with pytest.raises(ValueError, match="unknown precision"):
        F.model_state_bytes(psi, dp, 0, "fp4")
    with pytest.raises(ValueError, match="zero_stage"):
        F.model_state_bytes(psi, dp, 4)


# ------------------------------------------------------------------------------------------
# 5. Communication
# ------------------------------------------------------------------------------------------


def test_zero_communication_volume_sec7():
    psi, n = 1e9, 16
    base = 2 * (n - 1) / n * psi * 2  # Sec. 7.1: all-reduce = 2 Psi elements (x 2 B, ring share)
    assert F.dp_bytes_per_step(psi, n, 0) == base
    assert F.dp_bytes_per_step(psi, n, 1) == F.dp_bytes_per_step(psi, n, 2) == base  # Sec. 7.2.1
    assert F.dp_bytes_per_step(psi, n, 3) == pytest.approx(1.5 * base)  # Sec. 7.2.2: 3 Psi
    assert F.dp_bytes_per_step(psi, 1, 0) == 0


def test_tp_pp_ep_cp_volumes_by_hand():
    s, b, h, t = 2048, 1, 12288, 8
    sbh2 = s * b * h * 2
    # Shoeybi et al. Sec. 3: 2 all-reduces forward + 2 backward per layer, ring share 2 (t-1)/t.
    assert F.tp_bytes_per_layer(s, b, h, t) == 4 * 2 * (t - 1) / t * sbh2
    # Korthikanti Sec. 4.2.2: 4 all-gathers + 4 reduce-scatters, the same bytes.
    assert F.tp_bytes_per_layer(s, b, h, t, sp=True) == pytest.approx(4 * 2 * (t - 1) / t * sbh2)
    assert F.tp_bytes_per_layer(s, b, h, t, recompute="full") == 6 * 2 * (t - 1) / t * sbh2
    # Pipeline: activation forward + gradient backward per micro-batch; / t with SP.
    assert F.pp_p2p_bytes_per_microbatch(s, b, h) == 2 * sbh2
    assert F.pp_p2p_bytes_per_microbatch(s, b, h, t=t, sp=True) == 2 * sbh2 / t
    # EP: Mixtral, 4096 tokens, top-2, EP 8: dispatch + combine, forward + backward, 7/8 leaves.
    assert F.ep_alltoall_bytes_per_layer(4096, 2, 4096, 8) == 4 * 2 * 4096 * 4096 * 2 * 7 / 8
    assert F.ep_alltoall_bytes_per_layer(4096, 2, 4096, 1) == 0
    # CP ring, Mixtral K/V (8 KV heads x 128, K and V): 3 (cp-1) (s/cp) b (2 x 1024) x 2 B.
    assert F.kv_width(MIXTRAL) == 2 * 8 * 128
    assert F.cp_ring_bytes_per_layer(8192, 1, 2048, 4) == 3 * 3 * (8192 / 4) * 2048 * 2


def test_comm_bytes_per_step_adds_up_by_hand():
    s, mb, M, dp, tp, pp, ep = 4096, 1, 8, 2, 2, 4, 4
    total, _ = _mixtral_by_hand()
    experts = 32 * 8 * 3 * 4096 * 14336
    dense_rank, expert_rank = (total - experts) / (tp * pp), experts / (ep * pp)
    edp = dp * tp // ep  # experts are data-parallel over dp x cp x tp / ep = 1 rank here
    dp_bytes = 2 * (dp - 1) / dp * dense_rank * 2 + 2 * (edp - 1) / edp * expert_rank * 2
    sbh2 = s * mb * 4096 * 2
    tp_bytes = M * (32 / pp) * 4 * 2 * (tp - 1) / tp * sbh2
    pp_bytes = M * 2 * sbh2 / tp
    ep_bytes = M * (32 / pp) * 4 * 2 * (s * mb / tp) * 4096 * 2 * (ep - 1) / ep
    got = F.comm_bytes_per_step(MIXTRAL, s, mb, M, dp=dp, tp=tp, pp=pp, ep=ep)
    assert got["dp"] == pytest.approx(dp_bytes)
    assert got["tp"] == pytest.approx(tp_bytes)
    assert got["pp"] == pytest.approx(pp_bytes)
    assert got["ep"] == pytest.approx(ep_bytes)
    assert got["cp"] == 0 and got["total"] == pytest.approx(
        dp_bytes + tp_bytes + pp_bytes + ep_bytes
    )
    with pytest.raises(ValueError, match="does not divide"):
        F.comm_bytes_per_step(MIXTRAL, s, mb, M, dp=3, ep=3)


# ------------------------------------------------------------------------------------------
# Contract
# ------------------------------------------------------------------------------------------


def test_bad_modes_raise():
    with pytest.raises(ValueError, match="recompute"):
        F.activation_bytes_per_layer(8, 1, 8, 1, recompute="some")
    with pytest.raises(ValueError, match="attention"):
        F.forward_flops_per_token(MIXTRAL, 8, attention="sliding")
    with pytest.raises(ValueError, match="positive"):
        F.activation_bytes_per_layer(0, 1, 8, 1)


def test_module_is_standard_library_only():
    code = (
        "import sys; import moe_repro.components.resources.formulas; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    src = open(F.__file__).read()
    assert "import torch" not in src
