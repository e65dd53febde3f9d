"""Model zoo: MoE architectures the reproductions are computed from.

Each entry records its source and which fields are approximate or not published: the models of
Piper Table IV (expert migration) and Table I, X-MoE Table 3 (Small/Medium/Large/Super), the M10B
family of Piper Sec. VII-D, the GLM-5 MoE layer of FEPLB, stand-ins for MoP's unpublished
120B/600B/1T models, and ``tiny-moe`` for CPU training and tests. Parameter counts are computed
from these fields by components.model.params (never stored).

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
class MLA:
    """Multi-head Latent Attention shapes (DeepSeek-V2 Sec. 2.1; public model configs)."""

    q_lora_rank: int | None  # None: queries projected directly (no low-rank query)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


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
    # Architecture details the parameter count needs beyond the fields above (components.model.params).
    mla: MLA | None = None  # Multi-head Latent Attention (DeepSeek-V2/V3, Kimi K2)
    d_ffn_shared: int | None = None  # hidden size of one shared expert; None: same as d_ffn
    tie_embeddings: bool = False  # input embedding and output head share one matrix
    attn_params: str = (
        "gqa"  # "gqa" (MHA when n_kv_heads == n_heads), "mla", or "4d2" (Piper's 4 d^2)
    )
    d_ffn_residual: int | None = None  # a dense FFN beside the MoE in every layer (Arctic)
    extra_params_per_layer: int = 0  # e.g. DeepSeek-V3.2's DSA indexer
    family: str = ""  # groups entries for reproductions: "piper-table1", "xmoe-table3", "m10b", ...
    # Trained with dropout (attention-probability and hidden dropout): its 1-byte masks are stored
    # activations (Korthikanti et al. 2022 Sec. 4.1). Off unless the source says the model used it
    # (the Llama 3, Mixtral and DeepSeek configs set attention_dropout 0.0).
    dropout: bool = False

    @property
    def n_moe_layers(self) -> int:
        return self.layers if self.moe_layers is None else self.moe_layers

    @property
    def n_dense_layers(self) -> int:
        return self.layers - self.n_moe_layers

    @property
    def heads(self) -> int:
        """Attention heads (d_model / 128 where the source does not say)."""
        return self.n_heads or max(1, self.d_model // 128)

    def expert_params(self) -> int:
        """Weights of one routed expert (biases ignored, as in the papers' formulas)."""
        return self.n_mat * self.d_model * self.d_ffn


_PIPER_T4 = "Piper Table IV (E/layer, d_model, d_ffn)"
_PIPER_T1 = "Piper Table I"
_XMOE_T3 = "X-MoE Table 3"
_M10B = "Piper Sec. VII-D (M10B: d_model=5120, d_ffn=20480, L=32, k=2; E scaled with nodes)"

# MLA shapes from the public DeepSeek-V2/V3 and Kimi K2 configs (config.json on the Hugging Face hub).
_MLA_DEEPSEEK = MLA(
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128
)


def _m10b(n_experts: int) -> MoEModel:
    # Piper VII-D: 16 experts on 8 nodes, scaled proportionally to 256 experts on 128 nodes.
    return MoEModel(
        key=f"m10b-e{n_experts}",
        name=f"M10B x {n_experts} experts",
        layers=32,
        d_model=5120,
        d_ffn=20480,
        n_experts=n_experts,
        top_k=2,
        n_mat=2,
        n_heads=40,
        vocab=None,
        attn_params="4d2",
        family="m10b",
        source=f"{_M10B}; nodes = E/2 (8 nodes at E=16 ... 128 nodes at E=256)",
        approximate=("n_heads", "vocab"),
        notes="Only a two-matrix FFN (2 d d_ffn per expert) and Piper's 4 d^2 attention reproduce "
        "the stated sizes (10B dense, 110B at E=16, 862B at E=128, 1.7T at E=256); with a "
        "SwiGLU FFN (3 matrices) the E=16 model would have ~165B. Heads (40, d_h=128) and "
        "vocabulary are not stated; embeddings are left out, as the stated sizes do.",
    )


def _xmoe(key: str, name: str, seq: int, d: int, f: int, e: int, k: int, layers: int) -> MoEModel:
    return MoEModel(
        key=key,
        name=name,
        layers=layers,
        d_model=d,
        d_ffn=f,
        n_experts=e,
        top_k=k,
        n_mat=2,
        n_heads=d // 128,
        vocab=None,
        attn_params="4d2",
        family="xmoe-table3",
        source=f"{_XMOE_T3} (seq {seq}); expert FFN with 2 matrices as X-MoE Table 1 (2 h' h)",
        approximate=("n_heads", "vocab", "n_mat"),
        notes=f"Trained at sequence length {seq}. X-MoE does not state heads, vocabulary, shared "
        "experts or dense layers; we use d_h=128, no embeddings, every layer MoE.",
    )


MODELS: dict[str, MoEModel] = {
    m.key: m
    for m in [
        MoEModel(
            key="switch-base",
            name="Switch-Base",
            layers=24,
            moe_layers=12,
            d_model=768,
            d_ffn=2048,
            n_experts=128,
            top_k=1,
            n_mat=2,
            n_heads=12,
            vocab=32128,
            d_ffn_dense=3072,
            tie_embeddings=True,
            source=f"{_PIPER_T4}; Fedus et al. 2022 (Switch Transformers), Switch-Base-128: "
            "encoder-decoder, 12 + 12 layers, MoE in every other FFN (12 MoE layers), ReLU "
            "two-matrix FFN",
            notes="Encoder-decoder: layers counts both stacks; decoder cross-attention is not modelled.",
            approximate=("layers",),
        ),
        MoEModel(
            key="mixtral-8x7b",
            name="Mixtral 8x7B",
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
            family="piper-table1",
            source=f"{_PIPER_T4}; {_PIPER_T1}; Jiang et al. 2024 (Mixtral of Experts), SwiGLU",
        ),
        MoEModel(
            key="mixtral-8x22b",
            name="Mixtral 8x22B",
            layers=56,
            d_model=6144,
            d_ffn=16384,
            n_experts=8,
            top_k=2,
            n_mat=3,
            n_heads=48,
            n_kv_heads=8,
            head_dim=128,
            vocab=32768,
            family="piper-table1",
            source=f"{_PIPER_T4}; {_PIPER_T1}; Mistral AI model card (Mixtral-8x22B), SwiGLU",
        ),
        MoEModel(
            key="grok-1",
            name="Grok-1",
            layers=64,
            d_model=6144,
            d_ffn=32768,
            n_experts=8,
            top_k=2,
            n_mat=3,
            n_heads=48,
            n_kv_heads=8,
            head_dim=128,
            vocab=131072,
            source=f"{_PIPER_T4}; xAI grok-1 open release (widening factor 8 gives d_ffn 32768)",
            approximate=("d_ffn",),
            notes="The open release states a widening factor rather than d_ffn; d_ffn is as Piper prints it.",
        ),
        MoEModel(
            key="glam-1.2t",
            name="GLaM (1.2T)",
            layers=64,
            moe_layers=32,
            d_model=8192,
            d_ffn=32768,
            n_experts=64,
            top_k=2,
            n_mat=2,
            n_heads=128,
            head_dim=128,
            vocab=256000,
            d_ffn_dense=32768,
            source=f"{_PIPER_T4}; Du et al. 2022 (GLaM) Table 4: 64B/64E, MoE every other layer",
            notes="n_mat=2: the published 1.2T total follows from two-matrix experts (three would "
            "give about 1.7T), whatever the gating of the FFN.",
        ),
        MoEModel(
            key="deepseek-v2",
            name="DeepSeek-V2",
            layers=60,
            moe_layers=59,
            d_model=5120,
            d_ffn=1536,
            n_experts=160,
            n_shared=2,
            top_k=6,
            n_mat=3,
            n_heads=128,
            vocab=102400,
            d_ffn_dense=12288,
            attn_params="mla",
            mla=_MLA_DEEPSEEK,
            family="piper-table1",
            source=f"{_PIPER_T4}; {_PIPER_T1}; DeepSeek-AI 2024 (DeepSeek-V2) and its config.json: "
            "160 routed + 2 shared, first layer dense, MLA attention",
            notes="Attention parameters from the MLA shapes (q_lora 1536, kv_lora 512, rope 64, "
            "nope 128, v 128). Attention activations/FLOPs use 128 heads of d_h=192 (q/k).",
        ),
        MoEModel(
            key="deepseek-v3",
            name="DeepSeek-V3",
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
            mla=_MLA_DEEPSEEK,
            family="piper-table1",
            source=f"{_PIPER_T4}; {_PIPER_T1}; DeepSeek-AI 2024 (DeepSeek-V3) and its config.json: "
            "256 routed + 1 shared, first 3 layers dense, MLA attention",
            notes="Counts exclude the multi-token-prediction module (as the 671B headline does).",
        ),
        MoEModel(
            key="deepseek-v3.2",
            name="DeepSeek-V3.2",
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
            mla=_MLA_DEEPSEEK,
            family="piper-table1",
            # DSA lightning indexer per layer: wq_b 1536 x (64 x 128), wk 7168 x 128, weights 7168 x 64.
            extra_params_per_layer=1536 * 64 * 128 + 7168 * 128 + 7168 * 64,
            source=f"{_PIPER_T1}; DeepSeek-V3.2-Exp config.json: V3 plus the DSA lightning indexer",
            approximate=("extra_params_per_layer",),
            notes="Indexer size from the public config (64 heads x 128); norms and biases ignored.",
        ),
        MoEModel(
            key="qwen3-30b-a3b",
            name="Qwen3-30B-A3B",
            layers=48,
            d_model=2048,
            d_ffn=768,
            n_experts=128,
            top_k=8,
            n_mat=3,
            n_heads=32,
            n_kv_heads=4,
            head_dim=128,
            vocab=151936,
            family="piper-table1",
            source=f"{_PIPER_T1}; Qwen3 technical report and Qwen3-30B-A3B config.json",
        ),
        MoEModel(
            key="qwen3-235b-a22b",
            name="Qwen3-235B-A22B",
            layers=94,
            d_model=4096,
            d_ffn=1536,
            n_experts=128,
            top_k=8,
            n_mat=3,
            n_heads=64,
            n_kv_heads=4,
            head_dim=128,
            vocab=151936,
            family="piper-table1",
            source=f"{_PIPER_T1} (counts, experts, layers); Qwen3-235B-A22B config.json (d_model "
            "4096, d_ffn 1536)",
            notes="Piper Table I prints hidden 7,168 and FFN 2,048 for this model (DeepSeek-V3's "
            "values); the public config has 4,096 and 1,536, which give the 235B/22B counts.",
        ),
        MoEModel(
            key="llama4-scout",
            name="Llama 4 Scout",
            layers=48,
            d_model=5120,
            d_ffn=8192,
            n_experts=16,
            n_shared=1,
            top_k=1,
            n_mat=3,
            n_heads=40,
            n_kv_heads=8,
            head_dim=128,
            vocab=202048,
            family="piper-table1",
            source=f"{_PIPER_T1}; Llama-4-Scout-17B-16E config.json (text model): 16 routed + 1 "
            "shared expert in every layer",
            approximate=("layers", "d_model", "d_ffn"),
            notes="Table I marks layers, hidden and FFN as approximate; counts are the text model "
            "only (the published 109B includes the vision encoder).",
        ),
        MoEModel(
            key="llama4-maverick",
            name="Llama 4 Maverick",
            layers=48,
            moe_layers=24,
            d_model=5120,
            d_ffn=8192,
            n_experts=128,
            n_shared=1,
            top_k=1,
            n_mat=3,
            n_heads=40,
            n_kv_heads=8,
            head_dim=128,
            vocab=202048,
            d_ffn_dense=16384,
            family="piper-table1",
            source=f"{_PIPER_T1}; Llama-4-Maverick-17B-128E config.json (text model): MoE in every "
            "other layer (128 routed + 1 shared), dense FFN 16384 in the others",
            approximate=("layers", "d_model", "d_ffn"),
            notes="Counts are the text model only.",
        ),
        MoEModel(
            key="arctic",
            name="Arctic",
            layers=35,
            d_model=7168,
            d_ffn=4864,
            n_experts=128,
            top_k=2,
            n_mat=3,
            n_heads=56,
            n_kv_heads=8,
            head_dim=128,
            vocab=32000,
            d_ffn_residual=4864,
            family="piper-table1",
            source=f"{_PIPER_T1}; Snowflake Arctic config.json: 35 layers, dense residual MLP "
            "(4864) beside a 128-expert top-2 MoE (4864) in every layer",
            approximate=("d_ffn",),
            notes="Table I prints FFN ~3,660 and leaves layers/hidden blank; 3.66B is the "
            "parameter count of one expert summed over the 35 layers (3 x 7168 x 4864 x 35), "
            "not an FFN width. The public config's expert width is 4,864.",
        ),
        MoEModel(
            key="kimi-k2",
            name="Kimi K2",
            layers=61,
            moe_layers=60,
            d_model=7168,
            d_ffn=2048,
            n_experts=384,
            n_shared=1,
            top_k=8,
            n_mat=3,
            n_heads=64,
            vocab=163840,
            d_ffn_dense=18432,
            attn_params="mla",
            mla=_MLA_DEEPSEEK,
            family="piper-table1",
            source=f"{_PIPER_T1}; Kimi K2 tech report and config.json: 384 routed + 1 shared, "
            "first layer dense, MLA with 64 heads",
        ),
        MoEModel(
            key="deepseek-v2-lite",
            name="DeepSeek-V2-Lite (torchtitan's DeepSeek-V3 16B)",
            layers=27,
            moe_layers=26,
            d_model=2048,
            d_ffn=1408,
            n_experts=64,
            n_shared=2,
            top_k=6,
            n_mat=3,
            n_heads=16,
            vocab=102400,
            d_ffn_dense=10944,
            attn_params="mla",
            mla=MLA(
                q_lora_rank=None,
                kv_lora_rank=512,
                qk_nope_head_dim=128,
                qk_rope_head_dim=64,
                v_head_dim=128,
            ),
            source="deepseek-ai/DeepSeek-V2-Lite config.json (27 layers, first_k_dense_replace 1, "
            "64 routed + 2 shared experts, top-6, moe_intermediate_size 1408, intermediate_size "
            "10944, q_lora_rank null, kv_lora_rank 512); the same shape is torchtitan's deepseek_v3 "
            "flavor '16B' (torchtitan/models/deepseek_v3/__init__.py)",
        ),
        MoEModel(
            key="deepseek-moe-16b",
            name="DeepSeek-MoE 16B",
            layers=28,
            moe_layers=27,
            d_model=2048,
            d_ffn=1408,
            n_experts=64,
            n_shared=2,
            top_k=6,
            n_mat=3,
            n_heads=16,
            head_dim=128,
            vocab=102400,
            d_ffn_dense=10944,
            source="Dai et al. 2024 (DeepSeekMoE) and deepseek-moe-16b-base config.json; X-MoE Fig. 17",
        ),
        _xmoe("xmoe-small", "X-MoE Small", 2048, 2048, 1408, 64, 6, 28),
        _xmoe("xmoe-medium", "X-MoE Medium", 4096, 5120, 1536, 128, 6, 28),
        _xmoe("xmoe-large", "X-MoE Large", 4096, 7168, 2048, 256, 8, 28),
        _xmoe("xmoe-super", "X-MoE Super", 4096, 7168, 2560, 256, 8, 61),
        MoEModel(
            key="m10b-dense",
            name="M10B (dense base)",
            layers=32,
            d_model=5120,
            d_ffn=20480,
            n_experts=1,
            top_k=1,
            n_mat=2,
            n_heads=40,
            attn_params="4d2",
            family="m10b",
            source=_M10B,
            approximate=("n_heads", "vocab"),
            notes="The dense base: one 'expert' that every token uses.",
        ),
        *[_m10b(e) for e in (16, 32, 64, 128, 256)],
        MoEModel(
            key="glm5-moe",
            name="GLM-5 MoE layer (FEPLB, 18 layers)",
            layers=18,
            d_model=6144,
            d_ffn=2048,
            n_experts=128,
            top_k=8,
            n_mat=3,
            n_heads=64,
            family="feplb",
            source="FEPLB Sec. 3.1 (reduced-layer GLM-5: 18 layers, 128 routed experts, top-k, no aux "
            "loss) and Sec. 2 (one expert = 72 MiB)",
            approximate=("d_model", "d_ffn", "top_k", "n_heads"),
            notes="FEPLB does not print d_model/d_ffn; 72 MiB per expert = 3 x 6144 x 2048 x 2 bytes "
            "(bf16 SwiGLU), which matches GLM-5's public hidden 6144 / expert width 2048. "
            "top-8 is GLM-5's public setting; FEPLB only says top-k.",
        ),
        MoEModel(
            key="mop-120b",
            name="MoP 120B (stand-in: gpt-oss-120b shape)",
            layers=36,
            d_model=2880,
            d_ffn=2880,
            n_experts=128,
            top_k=4,
            n_mat=3,
            n_heads=64,
            n_kv_heads=8,
            head_dim=64,
            vocab=201088,
            family="mop",
            source="MoP Table 2 (120B, 2 nodes); architecture not published: stand-in gpt-oss-120b "
            "config.json (116.8B)",
            approximate=("layers", "d_model", "d_ffn", "n_experts", "top_k", "n_heads", "vocab"),
            notes="MoP publishes only the size; every architectural field is a stand-in.",
        ),
        MoEModel(
            key="mop-600b",
            name="MoP 600B (stand-in: DeepSeek-V3 shape, 224 experts)",
            layers=61,
            moe_layers=58,
            d_model=7168,
            d_ffn=2048,
            n_experts=224,
            n_shared=1,
            top_k=8,
            n_mat=3,
            n_heads=128,
            vocab=129280,
            d_ffn_dense=18432,
            attn_params="mla",
            mla=_MLA_DEEPSEEK,
            family="mop",
            source="MoP Table 2 (600B, 8 nodes); architecture not published: DeepSeek-V3 shape with "
            "224 routed experts (~590B)",
            approximate=("layers", "d_model", "d_ffn", "n_experts", "top_k", "n_heads", "vocab"),
            notes="MoP publishes only the size; every architectural field is a stand-in.",
        ),
        MoEModel(
            key="mop-1t",
            name="MoP 1T (stand-in: Kimi K2 shape)",
            layers=61,
            moe_layers=60,
            d_model=7168,
            d_ffn=2048,
            n_experts=384,
            n_shared=1,
            top_k=8,
            n_mat=3,
            n_heads=64,
            vocab=163840,
            d_ffn_dense=18432,
            attn_params="mla",
            mla=_MLA_DEEPSEEK,
            family="mop",
            source="MoP Table 2 (1T, 12 nodes); architecture not published: Kimi K2 config.json",
            approximate=("layers", "d_model", "d_ffn", "n_experts", "top_k", "n_heads", "vocab"),
            notes="MoP publishes only the size; every architectural field is a stand-in.",
        ),
        MoEModel(
            key="tiny-moe",
            name="Tiny MoE (CPU test model)",
            layers=4,
            d_model=64,
            d_ffn=128,
            n_experts=8,
            top_k=2,
            n_mat=3,
            n_heads=4,
            n_kv_heads=4,
            head_dim=16,
            vocab=512,
            source="moe-repro: a toy SwiGLU MoE that trains on CPU in seconds (trainer, tests)",
            notes="Not from a paper. Default sequence length 64 (see TINY_MOE_SEQ).",
        ),
        # Dense models (family "dense"): no MoE layer (moe_layers=0), one FFN of width d_ffn_dense
        # in every layer. n_experts=1 / top_k=1 only fill the required fields (no router is counted
        # when E=1, and no routed expert when there is no MoE layer); d_ffn repeats the FFN width.
        MoEModel(
            key="gpt3-175b",
            name="GPT-3 175B",
            layers=96,
            moe_layers=0,
            d_model=12288,
            d_ffn=4 * 12288,
            d_ffn_dense=4 * 12288,
            n_experts=1,
            top_k=1,
            n_mat=2,
            n_heads=96,
            head_dim=128,
            vocab=50257,
            tie_embeddings=True,
            family="dense",
            dropout=True,
            source="Brown et al. 2020 (Language Models are Few-Shot Learners) Table 2.1: 96 layers, "
            "d_model 12288, 96 heads of 128, d_ffn = 4 d_model, context 2048; GPT-2 BPE "
            "vocabulary 50257; two-matrix GELU FFN, output head tied to the token embedding",
            notes="Counts 174.6B weights (12 L d^2 + V d + norms): the learned position embedding "
            "(2048 x 12288 = 25M), biases (9 d per layer, 11M) and LayerNorm biases are not "
            "modelled (0.02% together); the paper rounds to 175.0B. GPT-3 alternates dense and "
            "locally banded sparse attention; attention here is dense. Sequence 2048. Dropout "
            "on: GPT-3 follows GPT-2's training setup (dropout 0.1), and Korthikanti et al. "
            "2022 (Sec. 4.1, Table 2) count its masks for this model.",
        ),
        MoEModel(
            key="llama3-8b",
            name="Llama 3 8B",
            layers=32,
            moe_layers=0,
            d_model=4096,
            d_ffn=14336,
            d_ffn_dense=14336,
            n_experts=1,
            top_k=1,
            n_mat=3,
            n_heads=32,
            n_kv_heads=8,
            head_dim=128,
            vocab=128256,
            family="dense",
            source="Llama Team 2024 (The Llama 3 Herd of Models) Table 3: 32 layers, d_model 4096, "
            "FFN 14336, 32 heads, 8 KV heads, vocabulary 128K (128256 in the released "
            "config.json); SwiGLU, untied embeddings",
            notes="8.03B, as the released checkpoint (8,030,261,248).",
        ),
        MoEModel(
            key="qwen3-32b",
            name="Qwen3 32B",
            layers=64,
            moe_layers=0,
            d_model=5120,
            d_ffn=25600,
            d_ffn_dense=25600,
            n_experts=1,
            top_k=1,
            n_mat=3,
            n_heads=64,
            n_kv_heads=8,
            head_dim=128,
            vocab=151936,
            family="dense",
            source="Qwen/Qwen3-32B config.json (64 layers, hidden 5120, intermediate 25600, 64 heads, "
            "8 KV heads, head_dim 128, vocabulary 151936, tie_word_embeddings false); the same "
            "shape is torchtitan's qwen3 flavor '32B' (torchtitan/experiments/qwen3/__init__.py)",
            notes="QK-norm weights (2 x 128 per layer) are not counted.",
        ),
        MoEModel(
            key="llama3-70b",
            name="Llama 3 70B",
            layers=80,
            moe_layers=0,
            d_model=8192,
            d_ffn=28672,
            d_ffn_dense=28672,
            n_experts=1,
            top_k=1,
            n_mat=3,
            n_heads=64,
            n_kv_heads=8,
            head_dim=128,
            vocab=128256,
            family="dense",
            source="Llama Team 2024 (The Llama 3 Herd of Models) Table 3: 80 layers, d_model 8192, "
            "FFN 28672, 64 heads, 8 KV heads, vocabulary 128256; SwiGLU, untied embeddings",
            notes="70.55B, as the released checkpoint.",
        ),
        MoEModel(
            key="llama3-405b",
            name="Llama 3 405B",
            layers=126,
            moe_layers=0,
            d_model=16384,
            d_ffn=53248,
            d_ffn_dense=53248,
            n_experts=1,
            top_k=1,
            n_mat=3,
            n_heads=128,
            n_kv_heads=8,
            head_dim=128,
            vocab=128256,
            family="dense",
            source="Llama Team 2024 (The Llama 3 Herd of Models) Table 3: 126 layers, d_model 16384, "
            "FFN 53248, 128 heads, 8 KV heads, vocabulary 128256; SwiGLU, untied embeddings",
            notes="405.85B, as the released checkpoint.",
        ),
    ]
}

# Sequence length the tiny model is meant to train with (the trainer's default).
TINY_MOE_SEQ = 64


def megatron_gpt(
    layers: int,
    hidden: int,
    heads: int,
    vocab: int | None,
    dropout: bool = True,
    ffn: int | None = None,
) -> MoEModel:
    """A GPT model of Narayanan et al. Sec. 5.1: two-matrix GeLU MLP of ``ffn`` (default 4h),
    vocabulary V tied to the output head (their parameter count, Eq. 2, counts V h once; None: no
    vocabulary, e.g. one measured layer), learned position embeddings (not counted by the zoo),
    dropout as Megatron-LM's GPT defaults."""
    f = 4 * hidden if ffn is None else ffn
    return MoEModel(
        key=f"megatron-gpt-{layers}x{hidden}",
        name=f"Megatron GPT ({layers} x {hidden})",
        layers=layers,
        moe_layers=0,
        d_model=hidden,
        d_ffn=f,
        d_ffn_dense=f,
        n_experts=1,
        top_k=1,
        n_mat=2,
        n_heads=heads,
        head_dim=hidden // heads,
        vocab=vocab,
        tie_embeddings=True,
        family="dense",
        dropout=dropout,
        source="Narayanan et al. SC'21 Table 1; dropout: Megatron-LM's --hidden-dropout and "
        "--attention-dropout default 0.1",
    )


def get_model(key: str) -> MoEModel:
    """Look a model up by key; raises KeyError naming the known keys."""
    import difflib

    try:
        return MODELS[key]
    except KeyError:
        close = difflib.get_close_matches(key, list(MODELS), n=3, cutoff=0.5)
        hint = (
            f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(sorted(MODELS))}"
        )
        raise KeyError(f"unknown model {key!r}; {hint}") from None


def family(name: str) -> list[MoEModel]:
    """Entries of one family (``piper-table1``, ``xmoe-table3``, ``m10b``, ``mop``), in zoo order."""
    return [m for m in MODELS.values() if m.family == name]
