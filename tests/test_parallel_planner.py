"""components.resources.parallel_planner: the search, its constraints, and one configuration's
memory and time worked out by hand from the published formulas (the expected numbers below are
arithmetic written out here, not values read back from the code under test)."""

from __future__ import annotations

import json

import pytest

from moe_repro.components.model.zoo import get_model
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources import formulas as F
from moe_repro.components.resources.parallel_planner import plan_parallel

DGX = load_builtin("dgx-h100")
GPT3 = get_model("gpt3-175b")


@pytest.fixture(scope="module")
def gpt3_64():
    return plan_parallel(GPT3, DGX, 64)


def test_gpt3_on_64_nodes_finds_layouts_that_respect_the_mesh(gpt3_64):
    pl = gpt3_64
    assert pl.gpus == 512 and pl.feasible
    for c in pl.candidates:
        assert c.dp * c.tp * c.pp * c.cp == 512
        assert c.tp <= 8 and 96 % c.tp == 0 and c.pp <= 96 and c.ep == 1
        assert pl.global_batch % (c.dp * c.micro_batch) == 0
        assert c.micro_batches == pl.global_batch // (c.dp * c.micro_batch)
    for c in pl.feasible:
        assert c.memory["total"] <= 79.11 * 2**30  # what PyTorch gets of an 80 GB H100
        assert c.step_s == pytest.approx(sum(c.parts.values()))
        assert 0 < c.mfu < 1
    steps = [c.step_s for c in pl.feasible]
    assert steps == sorted(steps) or all(
        abs(a - b) < 1e-3 * a for a, b in zip(steps, sorted(steps))
    )
    assert all(not c.feasible and c.why_not for c in pl.candidates[len(pl.feasible) :])
    json.dumps(pl.to_dict())  # JSON-ready


def test_gpt3_tp8_pp8_dp16_zero1_memory_and_time_by_hand():
    # GPT-3 175B (Brown et al. 2020 Table 2.1): d = 12288, 96 layers, 96 heads of 128, FFN 4d
    # (two matrices), vocabulary 50257, embedding tied to the head. 128 nodes x 8 = 1024 GPUs:
    # TP 8 x PP 8 x DP 16; ZeRO-1, bf16-adam (ZeRO Sec. 3.1: 2 + 2 + 12 B per parameter);
    # sequence parallelism, no recompute, FlashAttention, no dropout; 1024 sequences of 4096
    # tokens, M = 64 micro-batches of 1 sequence per DP rank.
    pl = plan_parallel(
        GPT3,
        DGX,
        128,
        tp=8,
        pp=8,
        vpp=1,
        cp=1,
        ep=1,
        zero=(1,),
        recompute=("none",),
        micro_batches=64,
        sp=True,
    )
    assert pl.global_batch == 1024 and len(pl.candidates) == 1
    c = pl.candidates[0]
    assert (c.dp, c.tp, c.pp, c.micro_batch, c.micro_batches) == (16, 8, 8, 1, 64) and c.feasible

    d, s = 12288, 4096
    # Stage 0 holds 96 / 8 = 12 layers. Per layer: attention 4 d^2 + FFN 2 x d x 4d = 12 d^2 =
    # 1,811,939,328 matrix weights, split over TP 8; 2 d = 24,576 norm weights, replicated over TP.
    # Plus the input embedding V d = 617,558,016, vocab-parallel over TP 8.
    matrices = 12 * 1_811_939_328 // 8  # 2,717,908,992
    embedding = 617_558_016 // 8  # 77,194,752
    norms = 12 * 24_576  # 294,912
    p0 = matrices + embedding + norms
    assert p0 == 2_795_398_656
    # ZeRO-1 (ZeRO Fig. 1, P_os): weights 2 B and gradients 2 B per parameter unsharded; fp32
    # master 4 B + Adam moments 8 B sharded over DP x CP = 16.
    assert c.memory_stage == 0
    assert c.memory["weights"] == 2 * p0 == 5_590_797_312
    assert c.memory["grads"] == 2 * p0 == 5_590_797_312
    assert c.memory["optimizer"] == 12 * p0 / 16 == 2_096_548_992
    # Activations (Korthikanti 2022 Table 2, TP + SP, no stored scores, no dropout masks):
    # per layer and sequence, bytes = s h (4 layer-norm inputs + 2 QKV input + 6 Q,K,V + 2 projection
    # input + 2 MLP input + 16 GeLU input/output) / t = 32 s h / 8 = 4 s h = 201,326,592 B;
    # 1F1B stage 0 holds PP = 8 micro-batches of its 12 layers.
    per_layer = 32 * s * d // 8
    assert per_layer == 201_326_592
    assert c.memory["activations"] == 12 * 8 * per_layer == 19_327_352_832
    # Buffers: the profile's 4 GB framework overhead (ZeRO-1 adds no prefetch buffer).
    assert c.memory["buffers"] == 4e9
    assert c.memory["total"] == 2 * 5_590_797_312 + 2_096_548_992 + 19_327_352_832 + 4e9

    # Compute time: the last stage (12 layers + the head) is the slowest. Forward FLOPs per token:
    # per layer 2 x 12 d^2 = 3,623,878,656 (matmuls) and 2 s H (d_qk + d_v) / 2 = 4096 x 96 x 256
    # = 100,663,296 (causal attention core); head 2 V d = 1,235,116,032. Training = 3 x forward.
    # Each GPU does 1/8 (TP) of the 4096 tokens of a micro-batch: 512 token-equivalents; matmuls
    # at 700 TFLOPS, attention core at 500 TFLOPS (dgx-h100 profile).
    mm = 3 * (12 * 3_623_878_656 + 1_235_116_032) * 512 / 700e12
    core = 3 * 12 * 100_663_296 * 512 / 500e12
    # Non-GEMM kernels at HBM speed (3.35 TB/s): per layer and token, layer norms and the two
    # bias-dropout-adds 10 h and the GeLU 2 x 4h values of 2 B, / TP 8 (SP shards the h terms);
    # forward + 1.5 x for the backward; 4096 tokens of the micro-batch, 12 layers.
    ew = 2.5 * 12 * (10 * 12288 + 2 * 4 * 12288) / 8 * 2 * 4096 / 3350e9
    assert c.parts["compute"] == pytest.approx(64 * (mm + core + ew), rel=1e-12)
    # TP with SP (Korthikanti Sec. 4.2.2): 4 all-gathers + 4 reduce-scatters of s b h x 2 bytes per
    # layer, each (t-1)/t of it sent: 7/8 x 4096 x 12288 x 2 = 88,080,384 B each, at 450 GB/s x 0.8
    # over NVLink (line rate x the app-level share NCCL's maintainers give), plus 2 us (the
    # profile's NVLink latency) per collective. The backward's two reduce-scatters (of the
    # column-parallel layers' input gradients) run beside the weight-gradient GEMMs (Megatron's
    # asynchronous TP communication): 12 x 2 x (88,080,384 / 360e9 + 2e-6) = 5.9 ms against 12
    # layers' forward GEMMs, 12 x 3,623,878,656 x 512 / 700e12 = 31.8 ms: hidden. Six exposed.
    assert 12 * 2 * (88_080_384 / 360e9 + 2e-6) < 12 * 3_623_878_656 * 512 / 700e12
    tp = 12 * (6 * 88_080_384 / 360e9 + 6 * 2e-6)
    assert c.parts["tp"] == pytest.approx(64 * tp, rel=1e-12)
    # Bubble: (PP - 1) slots of the slowest stage (1F1B).
    slot = (c.parts["compute"] + c.parts["tp"] + c.parts["pp"]) / 64
    assert c.parts["bubble"] == pytest.approx(7 * slot, rel=1e-12)
    # The optimizer step reads and writes stage 0's state once at HBM speed: 2 x (weights 2 p0 +
    # grads 2 p0 + optimizer 12 p0 / 16) bytes; gradient accumulation is fused (the default).
    assert c.parts["optimizer"] == pytest.approx(2 * (4 * p0 + 12 * p0 / 16) / 3350e9, rel=1e-12)
    assert c.parts["grad_accum"] == 0.0
    # MFU: model FLOPs (3 x forward, no recompute) x tokens / (GPUs x 989 TFLOPS x step).
    flops = F.train_flops_per_token(GPT3, 4096, "causal") * 1024 * 4096
    assert c.mfu == pytest.approx(flops / (1024 * 989e12 * c.step_s), rel=1e-12)
    assert c.step_s == pytest.approx(sum(c.parts.values()), rel=1e-12)


def test_unfused_gradient_accumulation_adds_a_pass_per_micro_batch_by_hand():
    # The layout above with Megatron-LM's unfused accumulation (main_grad.add_(grad)): each of the
    # 64 micro-batches reads stage 0's new 16-bit gradients (2 p0 B) and reads and writes the held
    # 2-byte gradients (2 x 2 p0 B) at 3.35 TB/s; nothing else moves.
    kw = dict(
        tp=8, pp=8, vpp=1, cp=1, ep=1, zero=(1,), recompute=("none",), micro_batches=64, sp=True
    )
    fused = plan_parallel(GPT3, DGX, 128, **kw).candidates[0]
    unfused = plan_parallel(GPT3, DGX, 128, fused_grad_accumulation=False, **kw).candidates[0]
    p0 = 2_795_398_656
    assert unfused.parts["grad_accum"] == pytest.approx(64 * 6 * p0 / 3350e9, rel=1e-12)
    assert unfused.step_s - fused.step_s == pytest.approx(unfused.parts["grad_accum"], rel=1e-9)
    assert any(
        "gradient accumulation (asked)" in a
        for a in plan_parallel(GPT3, DGX, 128, fused_grad_accumulation=False, **kw).assumptions
    )


def test_without_async_tp_the_backwards_collectives_are_exposed_by_hand():
    # The layout above with --no-overlap-tp (Megatron-LM before its asynchronous TP all-reduce):
    # all eight collectives of each of the 12 layers are exposed, 64 micro-batches.
    kw = dict(
        tp=8, pp=8, vpp=1, cp=1, ep=1, zero=(1,), recompute=("none",), micro_batches=64, sp=True
    )
    pl = plan_parallel(GPT3, DGX, 128, overlap_tp=False, **kw)
    c = pl.candidates[0]
    assert c.parts["tp"] == pytest.approx(64 * 12 * (8 * 88_080_384 / 360e9 + 8 * 2e-6), rel=1e-12)
    assert any("TP (asked)" in a for a in pl.assumptions)
    # Without SP the backward's two all-reduces (2 (t-1)/t s b h 2 B each) are both hidden
    overlapped = plan_parallel(GPT3, DGX, 128, **{**kw, "sp": False}).candidates[0]
    exposed = plan_parallel(GPT3, DGX, 128, overlap_tp=False, **{**kw, "sp": False}).candidates[0]
    per_layer_bwd = 2 * (2 * 88_080_384 / 360e9 + 2e-6)
    assert exposed.parts["tp"] - overlapped.parts["tp"] == pytest.approx(
        64 * 12 * per_layer_bwd, rel=1e-9
    )


def test_the_assumptions_say_the_optimizer_step_is_timed_and_never_that_it_is_not():
    # The step's parts include an optimizer pass; an assumption line once said it was not modelled.
    c = plan_parallel(
        GPT3,
        DGX,
        128,
        tp=8,
        pp=8,
        vpp=1,
        cp=1,
        ep=1,
        zero=(1,),
        recompute=("none",),
        micro_batches=64,
        sp=True,
    )
    assert c.candidates[0].parts["optimizer"] > 0
    text = " ".join(c.assumptions)
    assert "optimizer step: one HBM pass" in text
    assert "optimizer-step time" not in text and "optimizer step not modelled" not in text


def test_interleaving_holds_megatrons_penalty_on_stage_0():
    # Megatron-LM theoretical_memory_usage: with v virtual stages the first stage holds
    # L x (1 + (PP-1)/(PP v)) layers' activations: 96 x (1 + 7/16) = 138 layers for PP 8, v 2.
    pl = plan_parallel(
        GPT3,
        DGX,
        128,
        tp=8,
        pp=8,
        vpp=2,
        cp=1,
        ep=1,
        zero=(1,),
        recompute=("none",),
        micro_batches=64,
        sp=True,
    )
    (c,) = pl.candidates
    assert c.vpp == 2 and c.memory_stage == 0
    assert c.memory["activations"] == 138 * 201_326_592
    # Narayanan et al. 2021 Sec. 2.2.2: the interleaved bubble is (PP - 1) / v slots, and each
    # micro-batch crosses v stage boundaries per GPU: twice the P2P bytes of plain 1F1B
    slot = (c.parts["compute"] + c.parts["tp"] + c.parts["pp"]) / 64
    assert c.parts["bubble"] == pytest.approx(7 / 2 * slot, rel=1e-12)
    plain = plan_parallel(
        GPT3,
        DGX,
        128,
        tp=8,
        pp=8,
        vpp=1,
        cp=1,
        ep=1,
        zero=(1,),
        recompute=("none",),
        micro_batches=64,
        sp=True,
    ).candidates[0]
    assert c.comm_bytes["pp"] == 2 * plain.comm_bytes["pp"]
    # SP sends 1/t of the 2 s b h bytes per boundary (Korthikanti Sec. 4.2.2): 2 x 4096 x 12288 x
    # 2 B / 8 = 25,165,824 B per micro-batch, 64 micro-batches
    assert plain.comm_bytes["pp"] == 64 * 2 * 4096 * 12288 * 2 / 8


def test_zero3_shards_weights_below_zero1():
    pl = plan_parallel(
        GPT3,
        DGX,
        128,
        tp=8,
        pp=8,
        vpp=1,
        cp=1,
        ep=1,
        zero=(1, 3),
        recompute=("none",),
        micro_batches=64,
        sp=True,
    )
    by_stage = {c.zero: c for c in pl.candidates}
    assert set(by_stage) == {1, 3}
    assert by_stage[3].memory["weights"] == pytest.approx(by_stage[1].memory["weights"] / 16)
    assert by_stage[3].memory["grads"] < by_stage[1].memory["grads"]
    # ZeRO-3 gathers weights for every forward and backward: more DP traffic per step
    assert by_stage[3].comm_bytes["dp"] > by_stage[1].comm_bytes["dp"]


def test_selective_recompute_lowers_activations():
    # Materialised attention scores (no FlashAttention), so selective recompute (Korthikanti
    # Sec. 5) drops the 2 a s^2 b / t score bytes that "none" keeps.
    common = dict(
        tp=8, pp=8, vpp=1, cp=1, ep=1, zero=(1,), micro_batches=64, sp=True, flash_attention=False
    )
    none = plan_parallel(GPT3, DGX, 128, recompute=("none",), **common).candidates[0]
    sel = plan_parallel(GPT3, DGX, 128, recompute=("selective",), **common).candidates[0]
    full = plan_parallel(GPT3, DGX, 128, recompute=("full",), **common).candidates[0]
    # softmax output (no dropout): 96 heads x 4096 x 4096 scores x 2 B / TP 8 = 402,653,184 B per
    # layer and micro-batch; stage 0 holds 12 layers x 8 micro-batches of them
    assert (
        none.memory["activations"] - sel.memory["activations"] == 12 * 8 * 96 * 4096 * 4096 * 2 // 8
    )
    assert full.memory["activations"] < sel.memory["activations"] < none.memory["activations"]
    assert none.parts["compute"] < sel.parts["compute"] < full.parts["compute"]


def test_a_model_too_big_for_the_machine_names_memory():
    pl = plan_parallel(get_model("llama3-405b"), DGX, 1)
    assert pl.best is None and not pl.feasible
    assert pl.candidates and all(not c.feasible and "GiB HBM" in c.why_not for c in pl.candidates)
    reasons = [r["reason"] for r in pl.rejected]
    assert any("memory" in r and "GiB HBM" in r for r in reasons)
    # each closest miss is the layout it names: evaluating that layout alone gives the same bytes
    assert {c.zero for c in pl.candidates} == {0, 1, 2, 3}
    for c in pl.candidates:
        again = plan_parallel(
            get_model("llama3-405b"),
            DGX,
            1,
            tp=c.tp,
            pp=c.pp,
            vpp=c.vpp,
            ep=c.ep,
            cp=c.cp,
            sp=c.sp,
            zero=(c.zero,),
            recompute=(c.recompute,),
            micro_batches=c.micro_batches,
        ).candidates
        assert len(again) == 1 and again[0].memory == c.memory and again[0].why_not == c.why_not
        assert c.memory["total"] == pytest.approx(
            sum(c.memory[k] for k in ("weights", "grads", "optimizer", "activations", "buffers"))
        )


def test_deepseek_v3_counts_and_flops():
    m = get_model("deepseek-v3")
    pl = plan_parallel(m, DGX, 64)
    assert pl.params["total"] == pytest.approx(671e9, rel=0.01)  # DeepSeek-V3: 671B total
    assert pl.params["active"] == pytest.approx(37e9, rel=0.03)  # 37B activated per token
    assert pl.flops_per_token["forward"] == F.forward_flops_per_token(m, 4096, "causal")
    assert pl.flops_per_token["training"] == 3 * pl.flops_per_token["forward"]
    # ~6 x 37B plus attention: 2.2e11-2.6e11 at 4096 tokens
    assert 2.2e11 < pl.flops_per_token["training"] < 2.6e11
    assert pl.feasible
    for c in pl.candidates:
        assert (
            c.dp * c.tp * c.pp * c.cp == 512
            and 256 % c.ep == 0
            and (c.dp * c.cp * c.tp) % c.ep == 0
        )
        assert c.sp or c.tp == 1  # MoE with TP needs SP (Megatron-core)


def test_deepseek_v3_expert_state_sharded_over_the_expert_dp_group_by_hand():
    # DeepSeek-V3 on 512 GPUs, TP 1 x PP 16 x DP 32, EP 16 folded into DP (EDP = 32 / 16 = 2),
    # ZeRO-1, bf16-adam. 61 layers over 16 stages: 4 x 13 + 3 x 3; stage 1 holds layers 4-7, all
    # MoE (layers 0-2 are dense), and binds. Per MoE layer (DeepSeek-V2 Sec. 2.1 MLA; config.json):
    # MLA 187,107,328 + shared expert 3 x 7168 x 2048 = 44,040,192 + router 7168 x 256 = 1,835,008
    # + norms 2 x 7168 = 14,336 -> 232,996,864 dense; routed 256 x 44,040,192, split over EP 16.
    m = get_model("deepseek-v3")
    pl = plan_parallel(
        m,
        DGX,
        64,
        tp=1,
        pp=16,
        vpp=1,
        cp=1,
        ep=16,
        zero=(1,),
        recompute=("full",),
        micro_batches=32,
    )
    (c,) = pl.candidates
    dense = 4 * (187_107_328 + 44_040_192 + 1_835_008 + 14_336)  # 931,987,456
    experts = 4 * 256 * 44_040_192 // 16  # 2,818,572,288
    assert c.memory_stage == 1 and c.layers_per_stage == "4 x 13 + 3 x 3"
    assert c.memory["weights"] == 2 * (dense + experts) == 7_501_119_488
    # master + Adam (12 B): dense over DP x CP = 32, experts over EDP = DP x CP x TP / EP = 2
    assert c.memory["optimizer"] == 12 * dense / 32 + 12 * experts / 2 == 17_260_929_024
    # so the expert optimizer bytes per GPU do not depend on EP (experts / EP over 32 / EP ranks)
    for ep in (8, 32):
        other = plan_parallel(
            m,
            DGX,
            64,
            tp=1,
            pp=16,
            vpp=1,
            cp=1,
            ep=ep,
            zero=(1,),
            recompute=("full",),
            micro_batches=32,
        ).candidates[0]
        assert other.memory["optimizer"] == c.memory["optimizer"]
        assert other.memory["weights"] == 2 * (dense + 4 * 256 * 44_040_192 // ep)


def test_per_layer_flops_and_weights_add_up_to_formulas():
    # the GEMMs the time model times per layer, summed over the layers with the attention core
    # and the head, are formulas' forward FLOPs per token; the planner's per-layer weights,
    # summed with embedding, head and final norm, are formulas' parameter total
    from moe_repro.components.resources import time_model as T
    from moe_repro.components.resources.memory_model import layer_weights

    for key in ("deepseek-v3", "gpt3-175b", "llama3-8b", "mixtral-8x7b", "arctic", "glam-1.2t"):
        m = get_model(key)
        dense, moe = layer_weights(m)
        V = m.vocab or 0
        w = F.attention_widths(m)
        core = 2 * 4096 * w["heads"] * (w["d_qk"] + w["d_v"]) * 0.5
        per_layer = {
            kind: sum(g.flops for g in T.layer_gemms(m, kind, 1.0)) + core for kind in (False, True)
        }
        fwd = (
            m.n_dense_layers * per_layer[False]
            + m.n_moe_layers * per_layer[True]
            + 2 * V * m.d_model
        )
        assert fwd == pytest.approx(F.forward_flops_per_token(m, 4096, "causal"), rel=1e-12), key
        weights = (
            m.n_dense_layers * (dense.w_tp + dense.w_rep)
            + m.n_moe_layers * (moe.w_tp + moe.w_rep + moe.w_exp)
            + V * m.d_model * (1 if m.tie_embeddings else 2)
            + m.d_model
        )  # + final norm
        assert weights == F.parameters(m)["total"], key


def test_fixed_degrees_that_break_a_rule_are_rejected_with_a_reason():
    pl = plan_parallel(GPT3, DGX, 64, tp=16)
    assert not pl.candidates
    assert {"reason": "TP 16 > 8 GPUs per node", "count": 1} in pl.rejected
    pl = plan_parallel(get_model("deepseek-v3"), DGX, 64, ep=3, pp=100)
    reasons = [r["reason"] for r in pl.rejected]
    assert "EP 3 does not divide 256 experts" in reasons and "PP 100 > 61 layers" in reasons
    pl = plan_parallel(GPT3, DGX, 64, tp=5)
    assert "TP 5 does not divide 96 heads" in [r["reason"] for r in pl.rejected]
    pl = plan_parallel(get_model("llama3-8b"), DGX, 1, ep=2)
    assert any("dense model" in r["reason"] for r in pl.rejected)


def test_context_parallelism_is_offered_for_long_sequences_only():
    short = plan_parallel(get_model("llama3-8b"), DGX, 4, seq=8192)
    assert {c.cp for c in short.candidates} == {1}
    long = plan_parallel(get_model("llama3-8b"), DGX, 4, seq=131072, zero=(1,))
    assert any(c.cp > 1 for c in long.feasible)
    asked = plan_parallel(get_model("llama3-8b"), DGX, 4, seq=8192, cp=2)
    assert {c.cp for c in asked.candidates} == {2}


def test_rejections_are_grouped_with_counts(gpt3_64):
    texts = [r["reason"] for r in gpt3_64.rejected]
    assert len(texts) == len(set(texts))
    assert all(r["count"] >= 1 for r in gpt3_64.rejected)
    counts = [r["count"] for r in gpt3_64.rejected]
    assert counts == sorted(counts, reverse=True)


def test_huge_clusters_are_answered():
    # how long it takes is measured in benchmarks/test_bench_planner.py, not asserted here
    pl = plan_parallel(get_model("deepseek-v3"), load_builtin("frontier"), 10**8)
    assert pl.gpus == 8 * 10**8 and pl.candidates


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(nodes=0), "nodes must be positive"),
        (dict(nodes=1, seq=-1), "seq must be positive"),
        (dict(nodes=1, precision="fp9"), "unknown precision preset"),
        (dict(nodes=1, zero=(4,)), "ZeRO stage must be"),
        (dict(nodes=1, recompute=("some",)), "recompute must be one of"),
    ],
)
def test_bad_arguments_raise(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        plan_parallel(GPT3, DGX, **kwargs)


def test_block_recompute_reports_the_smallest_n_layers_that_fit_by_hand():
    # GPT-3 175B on 64 nodes: TP 8 (SP) x PP 4 x DP 16, ZeRO-1, 1024 sequences as M = 16
    # micro-batches of 4. Stage 0 holds 24 layers and (1F1B) 4 micro-batches in flight.
    common = dict(tp=8, pp=4, vpp=1, cp=1, ep=1, zero=(1,), micro_batches=16, sp=True)
    none = plan_parallel(GPT3, DGX, 64, recompute=("none",), **common)
    assert not none.feasible  # keeping every activation does not fit
    pl = plan_parallel(GPT3, DGX, 64, recompute=("none", "block"), **common)
    (c,) = pl.candidates
    assert c.feasible and c.memory_stage == 0
    # Model state of stage 0: 24 x 12 d^2 / 8 matrices + V d / 8 embedding + 24 x 2d norms
    p0 = 24 * 1_811_939_328 // 8 + 617_558_016 // 8 + 24 * 24_576
    assert p0 == 5_513_602_560
    static = 2 * p0 + 2 * p0 + 12 * p0 / 16  # ZeRO-1: weights, grads; master + Adam / DP 16
    # Korthikanti Table 2 per layer, b = 4 sequences, t = 8, SP, FlashAttention (no scores), no
    # dropout: s b h (4 LN inputs + 2 QKV input + 6 Q, K, V + 2 projection input + 2 MLP input + 16
    # GeLU input/output) / t = 32 u bytes, u = s b h / t; full recompute keeps the layer input,
    # 2 s b h / t = 2 u (bf16 values). Block N: 4 micro-batches x (N x 2u + (24 - N) x 32u) + one
    # layer's working set being recomputed (32 u).
    u = 4096 * 4 * 12288 // 8
    assert u == 25_165_824
    acts = lambda n: 4 * (n * 2 * u + (24 - n) * 32 * u) + 32 * u
    # 79.11 GiB of an 80 GB H100 (PyTorch's capacity), 4 GB framework overhead
    budget = 79.11 * 2**30 - 4e9 - static
    smallest = next(n for n in range(1, 25) if acts(n) <= budget)
    assert smallest == 8 and acts(7) > budget  # u (3104 - 120 N) <= 54.75 GB -> N >= 7.74
    assert (c.recompute, c.recompute_layers, c.chunk_layers) == ("full:8", 8, 24)
    assert c.recompute_note == "full 8/24 layers"
    assert c.memory["activations"] == acts(8) == 53_955_526_656
    # Compute adds the 8 recomputed layers' forward only (every stage recomputes its first 8):
    # per layer 2 x 12 d^2 matmul FLOPs and the causal attention core 4096 x 96 x 256 per token;
    # the last stage (24 layers + the 2 V d head) is the slowest; 4 x 4096 / 8 = 2048
    # token-equivalents per GPU; 700 / 500 TFLOPS (dgx-h100)
    mm, core, head, tok = 3_623_878_656, 100_663_296, 1_235_116_032, 2048
    per_mb = (3 * (24 * mm + head) + 8 * mm) * tok / 700e12 + (3 * 24 + 8) * core * tok / 500e12
    # non-GEMM kernels at 3.35 TB/s: (10 h + 2 x 4h) / 8 values of 2 B per layer and token (SP),
    # forward + 1.5 x backward for 24 layers + the 8 recomputed forwards; 4 x 4096 tokens
    per_mb += (2.5 * 24 + 8) * (10 * 12288 + 2 * 4 * 12288) / 8 * 2 * 4 * 4096 / 3350e9
    assert c.parts["compute"] == pytest.approx(16 * per_mb, rel=1e-12)
    # the same N fixed by hand gives the same candidate; one layer less does not fit
    fixed = plan_parallel(GPT3, DGX, 64, recompute=("full:8",), **common).candidates[0]
    assert fixed.feasible and fixed.memory == c.memory and fixed.step_s == c.step_s
    assert not plan_parallel(GPT3, DGX, 64, recompute=("full:7",), **common).feasible


def test_expert_tp_2_halves_the_expert_weights_per_gpu_by_hand():
    # DeepSeek-V3 on 512 GPUs, TP 2 (SP) x PP 16 x DP 16, EP 16; ETP 1 or 2 (EP x ETP = 32 divides
    # DP x CP x TP = 32). Stage 1 holds MoE layers 4-7; routed experts 256 x 3 x 7168 x 2048 =
    # 256 x 44,040,192 per layer, over EP x ETP GPUs.
    m = get_model("deepseek-v3")
    common = dict(tp=2, pp=16, vpp=1, cp=1, ep=16, zero=(1,), recompute=("full",), micro_batches=32)
    one = plan_parallel(m, DGX, 64, etp=1, **common).candidates[0]
    two = plan_parallel(m, DGX, 64, etp=2, **common).candidates[0]
    assert (one.etp, two.etp) == (1, 2) and one.memory_stage == two.memory_stage == 1
    experts_etp1 = 2 * 4 * 256 * 44_040_192 // 16  # bf16 bytes, 5,637,144,576
    experts_etp2 = 2 * 4 * 256 * 44_040_192 // 32  # 2,818,572,288
    assert experts_etp1 == 2 * experts_etp2 == 5_637_144_576
    assert one.memory["weights"] - two.memory["weights"] == experts_etp1 - experts_etp2
    assert one.memory["grads"] - two.memory["grads"] == experts_etp1 - experts_etp2
    # ZeRO-1 shards master + Adam over EDP = DP x CP x TP / (EP x ETP): 2 ranks for ETP 1, 1 for
    # ETP 2, so the expert optimizer bytes per GPU do not change: 12 x 4 x 256 x 44,040,192 / 32
    assert one.memory["optimizer"] == two.memory["optimizer"]
    # ETP traffic (Megatron-core token dispatcher): all-gather + reduce-scatter of the ETP-gathered
    # tokens forward and backward, 4 (ETP - 1) k tokens h 2 B per MoE layer; tokens = mb s / TP =
    # 2 x 4096 / 2 = 4096, k = 8, h = 7168; full recompute repeats the forward's two (x 1.5); the
    # slowest stage has 4 MoE layers; M = 32
    per_layer = 4 * 1 * 8 * 4096 * 7168 * 2
    assert per_layer == 1_879_048_192
    assert two.comm_bytes["etp"] == 32 * 4 * 1.5 * per_layer
    assert one.comm_bytes["etp"] == 0 and one.parts["etp"] == 0 < two.parts["etp"]


def test_an_invalid_expert_tp_is_rejected_with_a_one_line_reason():
    m = get_model("deepseek-v3")
    # TP 1 x PP 16 x DP 32: EP 32 x ETP 2 = 64 does not divide DP x CP x TP = 32
    pl = plan_parallel(m, DGX, 64, tp=1, pp=16, ep=32, etp=2, cp=1)
    assert not pl.candidates
    (r,) = [r["reason"] for r in pl.rejected if "ETP" in r["reason"]]
    assert r.startswith("EP x ETP does not divide DP x CP x TP") and "world % (ETP x EP x PP)" in r
    assert "EP 32 x ETP 2, DP x CP x TP = 32 x 1 x 1" in r and "\n" not in r
    assert "ETP 3 does not divide the 8 GPUs per node" in [
        r["reason"] for r in plan_parallel(m, DGX, 64, etp=3).rejected
    ]
    assert any(
        "ETP 2 on a dense model" in r["reason"]
        for r in plan_parallel(GPT3, DGX, 64, etp=2).rejected
    )
    # by default ETP is searched over 1 and TP, and every candidate respects the folding rule
    for c in plan_parallel(m, DGX, 64).candidates:
        assert c.etp in (1, c.tp) and (c.dp * c.cp * c.tp) % (c.ep * c.etp) == 0


def test_a_request_is_answered_as_the_arguments_are():
    """plan(PlanRequest(...)) is plan_parallel(...) with the same fields; a malformed request is
    refused by its check before any search."""
    from moe_repro.components.resources.parallel_planner import PlanRequest, plan

    mix = get_model("mixtral-8x7b")
    kw = dict(seq=8192, zero=(1, 3), recompute=("none", "block"), ep=8, capacity_factor=1.25)
    by_request = plan(PlanRequest(mix, DGX, 4, **kw)).to_dict()
    by_arguments = plan_parallel(mix, DGX, 4, **kw).to_dict()
    for d in (by_request, by_arguments):
        d["search"].pop("seconds")
    assert by_request == by_arguments and by_request["candidates"]
    assert all(c["ep"] == 8 for c in by_request["candidates"])
    with pytest.raises(ValueError, match="ZeRO stage must be 0, 1, 2 or 3, got 4"):
        PlanRequest(mix, DGX, 4, zero=(4,)).checked()


def test_pipeline_sends_use_megatrons_scatter_gather_without_sp():
    # Narayanan et al. 2021 Sec. 4.1: each of the 8 TP ranks sends 1/8 of the 2048 x 12288
    # activation (2 B) forward and its gradient backward: 2 x 2048 x 12288 x 2 / 8 = 12,582,912 B
    # per micro-batch, 16 micro-batches; the same bytes with SP (the shard is already 1/8)
    for sp in (False, True):
        c = plan_parallel(
            GPT3,
            load_builtin("dgx-a100"),
            8,
            seq=2048,
            global_batch=16,
            micro_batches=16,
            tp=8,
            pp=8,
            vpp=1,
            cp=1,
            sp=sp,
            zero=(1,),
            recompute=("full",),
        ).candidates[0]
        assert (c.tp, c.pp, c.sp, c.micro_batch) == (8, 8, sp, 1)
        assert c.comm_bytes["pp"] == 16 * 12_582_912
