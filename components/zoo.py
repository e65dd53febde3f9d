"""Model zoo: MoE architectures the reproductions are computed from.

Each entry records its source and which fields are approximate or not published. Entries start
with the models of Piper Table IV (expert-migration cost); later reproductions add the rest of
Piper Table I, X-MoE Table 3, the M10B family and the GLM-5 layer of FEPLB.

Conventions
-----------
``d_ffn`` is the hidden size of one routed expert. ``n_mat`` is the number of weight matrices
in one expert's FFN: 3 for SwiGLU/GeGLU (gate, up, down), 2 for a plain two-matrix FFN.
``moe_layers`` counts the layers whose FFN is an MoE block (models that interleave dense and
MoE layers have fewer MoE layers than layers).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MoEModel:
    key: str
    name: str
    layers: int
    d_model: int
    d_ffn: int  # per routed expert
    n_experts: int  # routed experts per MoE layer
    top_k: int
    n_mat: int = 3
    n_shared: int = 0
    moe_layers: int | None = None  # None: every layer is an MoE layer
    n_heads: int | None = None
    n_kv_heads: int | None = None
    head_dim: int | None = None
    vocab: int | None = None
    d_ffn_dense: int | None = None  # FFN width of the dense layers, where there are any
    source: str = ""
    approximate: tuple[str, ...] = field(default_factory=tuple)
    notes: str = ""

    @property
    def n_moe_layers(self) -> int:
        return self.layers if self.moe_layers is None else self.moe_layers

    def expert_params(self) -> int:
        """Weights of one routed expert (biases ignored, as in the papers' formulas)."""
        return self.n_mat * self.d_model * self.d_ffn


_PIPER_T4 = "Piper Table IV (E/layer, d_model, d_ffn)"

MODELS: dict[str, MoEModel] = {
    m.key: m
    for m in [
        MoEModel(
            key="switch-base", name="Switch-Base", layers=12, moe_layers=6, d_model=768, d_ffn=2048,
            n_experts=128, top_k=1, n_mat=2, n_heads=12, vocab=32128,
            source=f"{_PIPER_T4}; Fedus et al. 2022 (Switch Transformers), Switch-Base-128: "
                   "12 layers, MoE in every other FFN, ReLU two-matrix FFN",
        ),
        MoEModel(
            key="mixtral-8x7b", name="Mixtral 8x7B", layers=32, d_model=4096, d_ffn=14336,
            n_experts=8, top_k=2, n_mat=3, n_heads=32, n_kv_heads=8, head_dim=128, vocab=32000,
            source=f"{_PIPER_T4}; Piper Table I; Jiang et al. 2024 (Mixtral of Experts), SwiGLU",
        ),
        MoEModel(
            key="mixtral-8x22b", name="Mixtral 8x22B", layers=56, d_model=6144, d_ffn=16384,
            n_experts=8, top_k=2, n_mat=3, n_heads=48, n_kv_heads=8, head_dim=128, vocab=32768,
            source=f"{_PIPER_T4}; Piper Table I; Mistral AI model card (Mixtral-8x22B), SwiGLU",
        ),
        MoEModel(
            key="grok-1", name="Grok-1", layers=64, d_model=6144, d_ffn=32768,
            n_experts=8, top_k=2, n_mat=3, n_heads=48, n_kv_heads=8, head_dim=128, vocab=131072,
            source=f"{_PIPER_T4}; xAI grok-1 open release (widening factor 8 gives d_ffn 32768)",
            approximate=("d_ffn",),
            notes="The open release states a widening factor rather than d_ffn; d_ffn is as Piper prints it.",
        ),
        MoEModel(
            key="glam-1.2t", name="GLaM (1.2T)", layers=64, moe_layers=32, d_model=8192, d_ffn=32768,
            n_experts=64, top_k=2, n_mat=3, n_heads=128, head_dim=128, vocab=256000,
            source=f"{_PIPER_T4}; Du et al. 2022 (GLaM) Table 4: 64B/64E, MoE every other layer, GEGLU",
        ),
        MoEModel(
            key="deepseek-v2", name="DeepSeek-V2", layers=60, moe_layers=59, d_model=5120, d_ffn=1536,
            n_experts=160, n_shared=2, top_k=6, n_mat=3, n_heads=128, vocab=102400, d_ffn_dense=12288,
            source=f"{_PIPER_T4}; Piper Table I; DeepSeek-AI 2024 (DeepSeek-V2): 160 routed + 2 shared, "
                   "first layer dense, MLA attention",
            approximate=("n_heads",),
            notes="MLA attention is not modelled by head counts alone.",
        ),
        MoEModel(
            key="deepseek-v3", name="DeepSeek-V3", layers=61, moe_layers=58, d_model=7168, d_ffn=2048,
            n_experts=256, n_shared=1, top_k=8, n_mat=3, n_heads=128, vocab=129280, d_ffn_dense=18432,
            source=f"{_PIPER_T4}; Piper Table I; DeepSeek-AI 2024 (DeepSeek-V3): 256 routed + 1 shared, "
                   "first 3 layers dense, MLA attention",
            approximate=("n_heads",),
            notes="MLA attention is not modelled by head counts alone.",
        ),
        MoEModel(
            key="tiny-moe", name="Tiny MoE (CPU test model)", layers=4, d_model=64, d_ffn=128,
            n_experts=8, top_k=2, n_mat=3, n_heads=4, n_kv_heads=4, head_dim=16, vocab=512,
            source="moe-repro: a toy SwiGLU MoE that trains on CPU in seconds (trainer, tests)",
            notes="Not from a paper. Default sequence length 64 (see TINY_MOE_SEQ).",
        ),
    ]
}

# Sequence length the tiny model is meant to train with (the trainer's default).
TINY_MOE_SEQ = 64


def get_model(key: str) -> MoEModel:
    """Look a model up by key; raises KeyError naming the known keys."""
    try:
        return MODELS[key]
    except KeyError:
        raise KeyError(f"unknown model {key!r}; known: {', '.join(sorted(MODELS))}") from None
