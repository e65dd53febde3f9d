"""Zoo and parameter counts: checked against torch modules built from the same shapes, and
against exact counts published for real checkpoints."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from moe_repro.components.model.params import layer_params, param_counts
from moe_repro.components.model.zoo import MLA, MODELS, MoEModel, family, get_model


def _numel(*modules: nn.Module) -> int:
    return sum(p.numel() for mod in modules for p in mod.parameters())


def _reference_count(m: MoEModel) -> tuple[int, int]:
    """Build the model's weights as torch modules (no biases) and count them: (total, active)."""
    d, L = m.d_model, m.layers
    lin = lambda i, o: nn.Linear(i, o, bias=False)
    ffn = lambda f: nn.ModuleList([lin(d, f) for _ in range(m.n_mat - 1)] + [lin(f, d)])
    total = active = 0
    for layer in range(L):
        if m.attn_params == "mla":
            a, h = m.mla, m.heads
            attn = nn.ModuleList(
                [
                    lin(d, a.q_lora_rank),
                    nn.RMSNorm(a.q_lora_rank),
                    lin(a.q_lora_rank, h * (a.qk_nope_head_dim + a.qk_rope_head_dim)),
                    lin(d, a.kv_lora_rank + a.qk_rope_head_dim),
                    nn.RMSNorm(a.kv_lora_rank),
                    lin(a.kv_lora_rank, h * (a.qk_nope_head_dim + a.v_head_dim)),
                    lin(h * a.v_head_dim, d),
                ]
            )
        else:
            hd, kv = m.head_dim or d // m.heads, m.n_kv_heads or m.heads
            attn = nn.ModuleList(
                [lin(d, m.heads * hd), lin(d, kv * hd), lin(d, kv * hd), lin(m.heads * hd, d)]
            )
        common = _numel(attn, nn.RMSNorm(d), nn.RMSNorm(d))
        is_moe = layer >= L - m.n_moe_layers
        if is_moe:
            expert = _numel(ffn(m.d_ffn))
            shared = m.n_shared * _numel(ffn(m.d_ffn_shared or m.d_ffn))
            router = _numel(lin(d, m.n_experts))
            total += common + shared + router + m.n_experts * expert
            active += common + shared + router + m.top_k * expert
        else:
            dense = _numel(ffn(m.d_ffn_dense))
            total += common + dense
            active += common + dense
    emb = _numel(nn.Embedding(m.vocab, d)) * (1 if m.tie_embeddings else 2) + d  # + final norm
    return total + emb, active + emb


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counts_match_torch_modules_for_random_small_architectures(seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))
    heads = r(1, 4)
    gqa = MoEModel(
        key="t",
        name="t",
        layers=r(1, 4),
        d_model=8 * r(1, 4),
        d_ffn=r(1, 40),
        n_experts=r(2, 9),
        top_k=1,
        n_mat=r(2, 3),
        n_shared=r(0, 2),
        n_heads=heads,
        n_kv_heads=1,
        head_dim=r(1, 9),
        vocab=r(3, 50),
        tie_embeddings=bool(r(0, 1)),
    )
    gqa = dataclasses.replace(
        gqa, top_k=r(1, gqa.n_experts), moe_layers=r(0, gqa.layers), d_ffn_dense=r(1, 30)
    )
    mla = dataclasses.replace(
        gqa, attn_params="mla", mla=MLA(r(1, 9), r(1, 9), r(1, 5), r(1, 5), r(1, 5))
    )
    for m in (gqa, mla):
        ref_total, ref_active = _reference_count(m)
        pc = param_counts(m)
        assert (pc.total, pc.active) == (ref_total, ref_active)
        per_layer = sum(
            sum(layer_params(m, moe=i >= m.layers - m.n_moe_layers)) for i in range(m.layers)
        )
        assert per_layer + pc.embeddings + m.d_model == pc.total


def test_tiny_moe_exists_and_is_small():
    m = get_model("tiny-moe")
    assert (m.layers, m.d_model, m.d_ffn, m.n_experts, m.top_k, m.heads, m.vocab) == (
        4,
        64,
        128,
        8,
        2,
        4,
        512,
    )
    assert param_counts(m).total == _reference_count(m)[0] < 1_000_000


def test_published_exact_checkpoint_sizes():
    # Safetensors totals of the public checkpoints (Hugging Face model pages).
    assert param_counts(get_model("mixtral-8x7b")).total == 46_702_792_704
    assert param_counts(get_model("mixtral-8x22b")).total == 140_630_071_296
    # Qwen3 adds per-head q/k RMSNorms (2 x 128 per layer), which we do not count.
    assert param_counts(get_model("qwen3-30b-a3b")).total == 30_532_122_624 - 48 * 256


def test_m10b_family_sizes_need_two_matrix_ffn():
    sizes = {m.n_experts: param_counts(m).total / 1e9 for m in family("m10b")}
    # Piper VII-D: 10B dense, 110B at E=16, 862B at E=128, 1.7T at E=256.
    assert round(sizes[1]) == 10 and int(sizes[16]) == 110 and int(sizes[128]) == 862
    assert round(sizes[256] / 1000, 1) == 1.7
    three = dataclasses.replace(get_model("m10b-e16"), n_mat=3)
    assert param_counts(three).total / 1e9 > 160


def test_families_and_unknown_key():
    assert [m.key for m in family("xmoe-table3")] == [
        "xmoe-small",
        "xmoe-medium",
        "xmoe-large",
        "xmoe-super",
    ]
    assert len(family("piper-table1")) == 11
    assert "glm5-moe" in MODELS
    with pytest.raises(KeyError, match="unknown model 'nope'"):
        get_model("nope")
