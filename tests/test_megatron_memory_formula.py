"""Megatron-LM's theoretical memory formula against the planners' live-tensor terms.

The formula is re-implemented here from NVIDIA/Megatron-LM
megatron/training/theoretical_memory_usage.py (compute_weight_and_optimizer_memory and
compute_activation_memory, core_r0.9+; the MoE and MLA branches of later versions do not apply to
GPT-3), with Megatron's argument names. It counts live tensors only, so it must agree with
memory_model.LayoutMemory's weights + grads + optimizer and activations; the sourced terms a
memory kind adds (memory_terms) are then exactly the difference between the two.
"""

import math

import pytest

from moe_repro.components.model.zoo import get_model
from moe_repro.components.network.platform import load_platform
from moe_repro.components.resources import formulas as F
from moe_repro.components.resources import memory_model as mm
from moe_repro.components.resources import memory_terms as MT

GPT3 = get_model("gpt3-175b")


def padded_vocab(vocab: int, tp: int, divisible_by: int = 128) -> int:
    # megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding: a multiple of
    # make_vocab_size_divisible_by x TP
    multiple = divisible_by * tp
    return math.ceil(vocab / multiple) * multiple


def megatron_weight_and_optimizer_memory(a: dict) -> float:
    """compute_weight_and_optimizer_memory: bytes on the most loaded model shard (stage 0)."""
    query_projection_to_hidden_size_ratio = (a["kv_channels"] * a["num_attention_heads"]) / a[
        "hidden_size"
    ]
    num_experts = 1
    gated_linear_multiplier = 3 / 2 if a["swiglu"] else 1
    n_layers_params = (
        2
        * a["num_layers"]
        * a["hidden_size"]
        * a["hidden_size"]
        * (
            # Attention.
            (
                (1 + (a["num_query_groups"] / a["num_attention_heads"]))
                * query_projection_to_hidden_size_ratio
            )
            # MLP.
            + ((a["ffn_hidden_size"] / a["hidden_size"]) * num_experts * gated_linear_multiplier)
            # Transformer layernorms.
            + (2 / a["hidden_size"])
            # Final layernorm.
            + (1 / (a["num_layers"] * a["hidden_size"]))
        )
    )
    embedding_size = a["hidden_size"] * a["padded_vocab_size"]
    most_loaded = (n_layers_params / a["pipeline_model_parallel_size"] + embedding_size) / a[
        "tensor_model_parallel_size"
    ]
    if a["untie_embeddings_and_output_weights"] and a["pipeline_model_parallel_size"] == 1:
        most_loaded += embedding_size / a["tensor_model_parallel_size"]
    bytes_per_parameter = (
        18 if not a["use_distributed_optimizer"] else 6 + (12 / a["data_parallel_size"])
    )
    return most_loaded * bytes_per_parameter


def megatron_activation_memory(a: dict, num_microbatches: int) -> float:
    """compute_activation_memory: stage 0 with sequence parallelism and selective recompute
    (Korthikanti Table 2), non-interleaved 1F1B."""
    s, b, h = a["seq_length"], a["micro_batch_size"], a["hidden_size"]
    pp, tp = a["pipeline_model_parallel_size"], a["tensor_model_parallel_size"]
    activation_memory = (s * b * h) * (18 + (4 * (a["ffn_hidden_size"] / h)))
    activation_memory *= a["num_layers"]
    # Input to embedding (pp_size microbatches in flight).
    activation_memory += 8 * s * b * pp
    # Dropout in embedding layer (pp_size microbatches in flight).
    activation_memory += s * b * h * pp
    if pp > 1:
        activation_memory *= min(1, num_microbatches / pp)
    if pp == 1:
        # Inputs to output layer and CE loss.
        activation_memory += s * b * h * 4 * (1 + (a["padded_vocab_size"] / h))
    return activation_memory / tp


def gpt3_args(tp: int, pp: int, dp: int) -> dict:
    return dict(
        num_layers=96,
        hidden_size=12288,
        ffn_hidden_size=49152,
        num_attention_heads=96,
        num_query_groups=96,  # no GQA
        kv_channels=128,
        swiglu=False,
        padded_vocab_size=padded_vocab(50257, tp),
        untie_embeddings_and_output_weights=False,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        data_parallel_size=dp,
        use_distributed_optimizer=True,
        seq_length=2048,
        micro_batch_size=1,
    )


def ours(tp: int, pp: int, dp: int, M: int) -> mm.StageMemory:
    """Stage 0 of the same layout by the planners' model, live tensors only (no kind)."""
    lm = mm.LayerMemory(GPT3, 2048, F.precision("megatron"), flash=False, dropout=True)
    layout = mm.MemoryLayout(tp=tp, pp=pp, dp=dp, sp=True, micro_batch=1, micro_batches=M)
    lay = mm.LayoutMemory(lm, layout, mm.pipeline_stages(GPT3, pp))
    return lay.stage(1, "selective", 0, 0)  # ZeRO-1: Megatron's distributed optimizer


# Differences the formula leaves out and the model counts, or the reverse, each < 0.1% here:
# biases (9 h per layer) and the position embedding (2048 h), Megatron's vocabulary padding
# (50257 -> 51200 at TP 8), the embedding's input ids and dropout mask (8 s b + s b h per
# micro-batch in flight) and, at PP 1, the 4 s b h input of the output layer.
TOLERANCE = 0.003


@pytest.mark.parametrize("tp,pp,dp,M", [(8, 8, 16, 64), (8, 1, 128, 8)])
def test_live_terms_agree_with_megatrons_formula(tp, pp, dp, M):
    a = gpt3_args(tp, pp, dp)
    sm = ours(tp, pp, dp, M)
    state = sm.weights + sm.grads + sm.optimizer
    assert state == pytest.approx(megatron_weight_and_optimizer_memory(a), rel=TOLERANCE)
    assert sm.activations == pytest.approx(megatron_activation_memory(a, M), rel=TOLERANCE)


def test_the_memory_kinds_add_exactly_the_new_terms():
    p = load_platform("dgx-h100")
    layout = mm.MemoryLayout(tp=8, pp=8, dp=16, sp=True, micro_batch=1, micro_batches=64)
    kw = dict(zero=1, recompute=("selective", 0), precision="megatron", dropout=True)
    live = mm.per_gpu_memory(GPT3, p, layout, 2048, kind=None, **kw)
    a = gpt3_args(8, 8, 16)
    megatron = megatron_weight_and_optimizer_memory(a) + megatron_activation_memory(a, 64)
    assert live.total - p.overhead_bytes == pytest.approx(megatron, rel=TOLERANCE)
    base, totals = live.total - p.overhead_bytes, []
    for kind in MT.KINDS:
        sm = mm.per_gpu_memory(GPT3, p, layout, 2048, kind=kind, **kw)
        names = [n for n, _ in sm.extras]
        # the live terms are unchanged, the profile's constant is gone, the kind's terms are added
        assert (sm.weights, sm.activations, sm.buffers) == (live.weights, live.activations, 0.0)
        assert names and all(MT.includes(kind, MT.KIND_OF[n]) for n in names)
        assert sm.total == pytest.approx(base + sum(b for _, b in sm.extras), rel=1e-12)
        totals.append(sm.total)
    assert base < totals[0] <= totals[1] < totals[2]  # allocated <= reserved < device
