"""mop-table1: per-rank memory per component under MoP (MoP Table 1), evaluated in bytes.

Table 1 is symbolic (Theta_dns/W, O(NH), Theta_exp/W, << O(NkH), Theta_voc/P, O(NV/P), host
optimizer). We evaluate every component with the public formulas (components/resources/
formulas.py) under the settings MoP states (``MOP_SETTINGS``, each with its section), for MoP's
three model sizes on their node counts (8 x H200 per node) at one context:

- model state: ``formulas.model_state_bytes`` with MoP's precision preset ``"mop"`` (Sec. 2.1
  Eq. 1: 2 + 2 + 12 B per parameter; Sec. 3.5: the 12 B live on the host) at ZeRO stage 3 (Sec.
  3.2's "efficient sharding": each rank stores a 1/W shard, all-gathers a layer's weights before
  it fires and reduce-scatters its gradients) over W for the dense path and the experts and over
  P for the vocabulary projection (Table 1);
- activations: ``formulas.moe_activation_terms_per_layer`` with N = S / D tokens per rank (Ulysses
  sequence parallelism over D, Sec. 3.2; formulas' ``cp = D`` gives the same per-rank sizes in
  either layout), FlashAttention (no scores) and full activation checkpointing (each layer's
  input kept, one layer recomputed; MoP does not say, assumed);
- the vocabulary logits: one fp32 block of N V / P (formulas.py has no logits formula; the helper
  here);
- one layer's gathered dense weights (Sec. 3.2's all-gather before a layer fires).

Beside them, rows "Table 1 expression" evaluate MoP's own closed-form entries (Theta_x / W or / P
times Eq. 1's on-device 2 + 2 B; the host's 12 B): they restate the paper's formula. Table 1
prints no number, so every cell is ours (no-paper-value). MoP does not publish its architectures
or its D and P: the zoo's stand-ins (mop-120b, mop-600b, mop-1t) and D = W, P = 8 are assumptions.
``mop_plan_bytes`` is also what mop-table2 checks against HBM.
"""

from __future__ import annotations

from moe_repro.components.model.params import layer_params
from moe_repro.components.model.zoo import MoEModel, get_model
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources import formulas as F
from moe_repro.reproductions.spec import PaperValue, Reproduction, Result

PLATFORM = "h200"  # MoP Sec. 4 / Table 2: 8 x H200 nodes
MODELS = {"mop-120b": ("120B", 2), "mop-600b": ("600B", 8), "mop-1t": ("1T", 12)}
PRECISION = (
    "mop"  # formulas.PRECISION_PRESETS["mop"]: MoP Sec. 2.1 Eq. 1, optimizer on the host (Sec. 3.5)
)
ZERO_STAGE = 3  # Sec. 3.2: parameters, gradients and (host) optimizer state sharded over W
ACT_BYTES = 2  # bf16 activations (Eq. 1's bf16 working copy)
LOGIT_BYTES = 4  # fp32 logits for the loss (not stated by MoP)
PAPER_VALUES: list[PaperValue] = []

# What MoP states about its own setup (used value, what the paper says, where). "not stated":
# the paper does not say; the value used is an assumption.
MOP_SETTINGS: list[dict[str, str]] = [
    {
        "setting": "precision",
        "used": "bf16 weights 2 B + bf16 gradients 2 B + fp32 master, m, v 12 B "
        "= 16 B/param (formulas preset 'mop')",
        "paper": "'2Θ (weights) + 2Θ (grads) + 12Θ (optimizer state) = 16Θ bytes' under mixed-precision "
        "AdamW",
        "source": "Sec. 2.1 Eq. 1",
    },
    {
        "setting": "optimizer placement",
        "used": "host: 0 B on device, 12 B/param on the host",
        "paper": "optimizer state 'Host-resident; pipelined updates', 'small on-device working set'; "
        "'host-offloaded optimizer state'",
        "source": "Table 1, Sec. 3.5, Sec. 5",
    },
    {
        "setting": "ZeRO stage",
        "used": "3 (weights and gradients sharded) over W for dense and expert "
        "weights, over P for the vocabulary projection",
        "paper": "no stage named; 'each rank persistently stores Θ_dns/W parameters; ... an all-gather "
        "... reconstructs the full weight matrix ... Gradients follow the inverse schedule via "
        "reduce-scatter' (ZeRO-3's partitioning); expert weights Θ_exp/W, vocabulary Θ_voc/P",
        "source": "Sec. 3.2, Table 1",
    },
    {
        "setting": "recompute",
        "used": "full activation checkpointing (each layer's input kept, one layer "
        "recomputed at a time)",
        "paper": "not stated (activation checkpointing [1, 5] is named among the techniques that reduce "
        "transient memory, not said to be used)",
        "source": "Sec. 2.1, Sec. 3.1",
    },
    {
        "setting": "TP / PP",
        "used": "none (TP = PP = 1)",
        "paper": "'in contrast to pipeline or tensor parallelism, every parallelism we compose is "
        "data-parallel-like at the rank level'",
        "source": "Sec. 3.2",
    },
    {
        "setting": "SP",
        "used": "Ulysses-style over D ranks, N = S / D tokens per rank, D = W",
        "paper": "Ulysses-style sequence parallelism over a D-rank sub-group, N = S/D; D not stated",
        "source": "Sec. 3.1, Sec. 3.2",
    },
    {
        "setting": "CP",
        "used": "none besides SP (formulas' cp = D is used for SP's per-rank sizes)",
        "paper": "not stated (MoP's sequence axis is its SP)",
        "source": "Sec. 3.2",
    },
    {
        "setting": "attention kernel",
        "used": "FlashAttention: no S x S scores kept",
        "paper": "'the IO-aware FlashAttention kernel never materializes it'",
        "source": "Sec. 3.2",
    },
    {
        "setting": "MoE activations",
        "used": "un-chunked dispatch, intermediates and combine of one layer "
        "(capacity factor 1): an upper bound",
        "paper": "memory-efficient LLEP keeps 'only a small fraction of these buffers' resident; the "
        "fraction is not published",
        "source": "Sec. 3.3, Table 1",
    },
    {
        "setting": "vocabulary sub-group P",
        "used": "P = 8; logits one fp32 block of N V / P",
        "paper": "'an 8–16× reduction in practice at the sub-group sizes we use'; logit precision not "
        "stated",
        "source": "Sec. 3.4",
    },
    {
        "setting": "batch and sequence lengths",
        "used": "one sequence per step (B = 1); S from 64K to 1M",
        "paper": "'We assume a single sequence per step (batch size B=1)'; contexts 64K-1M",
        "source": "Sec. 3.1, Table 2",
    },
    {
        "setting": "hardware",
        "used": "8 x H200 141 GB per node; 2, 8 and 12 nodes; framework overhead "
        "from the h200 platform profile (an assumption)",
        "paper": "'on 2, 8, and 12 8×H200 nodes'",
        "source": "Sec. 1, Sec. 4, Table 2",
    },
]


def settings_lines(paper: str, settings: list[dict[str, str]]) -> list[str]:
    """One assumption line per setting: the value used, what the paper says, where."""
    return [
        f"{paper} setting, {s['setting']}: {s['used']} [paper: {s['paper']}; {s['source']}]"
        for s in settings
    ]


def mop_partition(m: MoEModel) -> dict[str, float]:
    """MoP Eq. 3 from formulas.parameters: Theta_exp = routed experts, Theta_voc = the output
    projection (V H), Theta_dns = the rest (attention, norms, routers, shared and dense FFNs, the
    input embedding)."""
    par = F.parameters(m)
    voc = par["lm_head"] or (
        par["embedding"] if m.tie_embeddings else 0
    )  # a tied head is the table
    exp = par["routed_experts"]
    return {"dns": par["total"] - exp - voc, "exp": exp, "voc": voc}


def _split_layer_terms(terms: dict[str, float]) -> tuple[float, float]:
    """(attention block + norms, MoE block) of formulas.moe_activation_terms_per_layer."""
    attn_keys = (
        "layernorm",
        "attention_input",
        "attention_qkv",
        "attention_out",
        "attention_dropout",
        "attention_core",
    )
    attn = sum(terms.get(k, 0.0) for k in attn_keys)
    return attn, sum(terms.values()) - attn


def largest_dense_layer(m: MoEModel) -> int:
    """Dense-path weights of the largest layer (attention, norms, router, shared experts; a dense
    layer's FFN): what one layer's all-gather reconstructs."""
    sizes = [layer_params(m, moe=True)[0]] if m.n_moe_layers else []
    if m.n_dense_layers:
        sizes.append(layer_params(m, moe=False)[0])
    return max(sizes)


def mop_plan_bytes(
    m: MoEModel, W: int, D: int, P: int, seq: int, overhead_bytes: float = 0.0
) -> dict[str, float]:
    """Per-rank device bytes of MoP's plan (module docstring), by Table 1 component."""
    part = mop_partition(m)
    state = lambda n, over: F.model_state_bytes(n, over, ZERO_STAGE, PRECISION)["total"]
    n = seq / D
    # Full checkpointing keeps every layer's input; FlashAttention keeps no scores, which formulas
    # counts as recompute="selective" for the layer being recomputed.
    kept = m.layers * F.moe_activation_bytes_per_layer(
        m, seq, 1, cp=D, recompute="full", bytes_per_value=ACT_BYTES
    )
    attn_ws, moe_ws = _split_layer_terms(
        F.moe_activation_terms_per_layer(
            m, seq, 1, cp=D, recompute="selective", bytes_per_value=ACT_BYTES
        )
    )
    return {
        "dense weights": state(part["dns"], W),
        "attention activations": kept + attn_ws,
        "expert weights": state(part["exp"], W),
        "MoE activations (bound)": moe_ws,
        "vocabulary weights": state(part["voc"], P),
        "vocabulary logits": LOGIT_BYTES * n * (m.vocab or 0) / P,
        "dense all-gather (one layer)": F.precision(PRECISION).weights * largest_dense_layer(m),
        "optimizer state (device)": sum(
            F.model_state_bytes(part[k], over, ZERO_STAGE, PRECISION)[s]
            for k, over in (("dns", W), ("exp", W), ("voc", P))
            for s in ("master", "optimizer")
        ),
        "framework overhead": overhead_bytes,
    }


def mop_host_bytes(m: MoEModel, W: int, P: int) -> float:
    """Host bytes per rank: the offloaded master + optimizer state (formulas' ``host``)."""
    part = mop_partition(m)
    return sum(
        F.model_state_bytes(part[k], over, ZERO_STAGE, PRECISION)["host"]
        for k, over in (("dns", W), ("exp", W), ("voc", P))
    )


def table1_expressions(m: MoEModel, W: int, P: int) -> dict[str, float]:
    """MoP's closed-form Table 1 entries in bytes: Theta_dns/W, Theta_exp/W, Theta_voc/P times
    Eq. 1's on-device 2 + 2 B (the 12 B are host-resident, Sec. 3.5), and Eq. 1's 12 B on the host."""
    part = mop_partition(m)
    on_device, host = 2 + 2, 12
    return {
        "dense weights": on_device * part["dns"] / W,
        "expert weights": on_device * part["exp"] / W,
        "vocabulary weights": on_device * part["voc"] / P,
        "optimizer state (host)": host * ((part["dns"] + part["exp"]) / W + part["voc"] / P),
    }


EXPRESSION = {
    "dense weights": "(2 + 2) B x Θ_dns / W",
    "expert weights": "(2 + 2) B x Θ_exp / W",
    "vocabulary weights": "(2 + 2) B x Θ_voc / P",
    "optimizer state (host)": "12 B x (Θ_dns / W + Θ_exp / W + Θ_voc / P)",
}
FORMULA = {
    "dense weights": "Θ_dns/W",
    "attention activations": "O(NH)",
    "expert weights": "Θ_exp/W",
    "MoE activations (bound)": "≪ O(NkH)",
    "vocabulary weights": "Θ_voc/P",
    "vocabulary logits": "O(NV/P)",
    "dense all-gather (one layer)": "not a row (Sec. 3.2's all-gather)",
    "optimizer state (device)": "small on-device working set",
    "framework overhead": "not a row",
    "optimizer state (host)": "host-resident",
}


# MoP Table 1's rows as printed (component, parallelism, per-rank memory) and the cell column of
# ours each row shows; the paper prints formulas, ours are GB per model (the grid transposes our
# model rows into its columns).
TABLE1_ROWS = [
    ("Dense weights Θ_dns", "Efficient sharding over W", "dense weights"),
    ("Attention activations", "Sequence parallelism over D", "attention activations"),
    ("Expert weights Θ_exp", "Hybrid EP x sharding (deg. W)", "expert weights"),
    ("MoE activations", "Memory-efficient LLEP", "MoE activations (bound)"),
    ("Vocabulary weights Θ_voc", "Data-tensor parallelism over P", "vocabulary weights"),
    ("Vocabulary logits", "Sharded online loss", "vocabulary logits"),
    (
        "Optimizer state {m, v, master}",
        "Host-resident; pipelined updates",
        "optimizer state (device)",
    ),
]


def paper_layout(model_rows: list[str]) -> dict:
    """Table 1 as printed, one column of ours per model (reports/html.py ``paper_grid``)."""
    return {
        "corner": "Component · parallelism · per-rank memory (MoP Table 1)",
        "groups": [
            {"label": "ours, per rank (GB)", "columns": [{"label": row} for row in model_rows]}
        ],
        "rows": [
            {
                "label": f"{name} · {how} · {FORMULA[col]}",
                "keys": [[row, col] for row in model_rows],
            }
            for name, how, col in TABLE1_ROWS
        ],
    }


def _note(comp: str, m: MoEModel, W: int, P: int, seq: int, v: float, part: dict) -> str:
    n, h = seq / W, m.d_model
    how = {
        "dense weights": f"model_state_bytes(Θ_dns = {part['dns'] / 1e9:.2f}B, dp = W = {W}, ZeRO-3, 'mop')",
        "expert weights": f"model_state_bytes(Θ_exp = {part['exp'] / 1e9:.1f}B, dp = W = {W}, ZeRO-3, 'mop')",
        "vocabulary weights": f"model_state_bytes(Θ_voc = {part['voc'] / 1e9:.2f}B, dp = P = {P}, ZeRO-3, 'mop')",
        "attention activations": f"{m.layers} checkpointed layer inputs (formulas, recompute='full', cp = D) + "
        f"the recomputed layer's attention and norm terms (FlashAttention) = "
        f"{v / (n * h):.1f} N H bytes at N = {n:.0f}",
        "MoE activations (bound)": f"one MoE layer's input, router, dispatch, expert intermediates, combine "
        f"and shared experts (formulas, c = 1, un-chunked) = "
        f"{v / (n * m.top_k * h):.2f} N k H bytes; MoP's LLEP chunking lowers it "
        "by an unpublished factor",
        "vocabulary logits": f"one fp32 block of N V / P, N = {n:.0f}, V = {m.vocab}, P = {P}",
        "dense all-gather (one layer)": "the largest layer's dense-path weights gathered in bf16",
        "optimizer state (device)": "preset 'mop' offloads master + moments (Sec. 3.5); MoP's on-device "
        "working set is not modelled",
        "framework overhead": "h200 platform profile (an assumption)",
    }[comp]
    return f"{how}; Table 1: {FORMULA[comp]}"


def compute(repro: Reproduction, params: dict) -> Result:
    seq, P = int(params["context"]), int(params["P"])
    if seq <= 0 or P <= 0:
        raise ValueError("context and P must be positive")
    p = load_builtin(PLATFORM)
    cells, extra = [], {}
    for key, (label, nodes) in MODELS.items():
        m = get_model(key)
        W = nodes * p.gpus_per_node
        part = mop_partition(m)
        mem = mop_plan_bytes(m, W, W, P, seq, p.overhead_bytes)
        row = f"{label} ({W} GPUs)"
        for comp, v in mem.items():
            cells.append(
                repro.compare(row, comp, v / 1e9, "GB", note=_note(comp, m, W, P, seq, v, part))
            )
        total = sum(mem.values())
        cells.append(
            repro.compare(
                row,
                "total",
                total / 1e9,
                "GB",
                note=f"device; vs {p.hbm_bytes / 1e9:g} GB HBM: "
                f"{'fits' if total <= p.hbm_bytes else 'OOM'}",
            )
        )
        host = mop_host_bytes(m, W, P)
        cells.append(
            repro.compare(
                row,
                "optimizer state (host)",
                host / 1e9,
                "GB",
                note="formulas model_state_bytes 'host' (fp32 master + m + v, 12 B/param "
                "of this rank's shards); Table 1: host-resident",
            )
        )
        expr = table1_expressions(m, W, P)
        for comp, v in expr.items():
            ours = host if comp == "optimizer state (host)" else mem[comp]
            cells.append(
                repro.compare(
                    f"{row}, Table 1 expression",
                    comp,
                    v / 1e9,
                    "GB",
                    echo=True,
                    note=f"MoP Table 1's {FORMULA[comp]} with Eq. 1's bytes, {EXPRESSION[comp]}: restates the "
                    "paper's formula; "
                    f"{'equals' if abs(ours - v) <= 1e-9 * max(v, 1.0) else 'differs from'} the "
                    "public-formulas row",
                )
            )
        extra[key] = {
            **part,
            "expert_share": part["exp"] / sum(part.values()),
            "W": W,
            "D": W,
            "P": P,
            "bytes": mem,
            "host_bytes": host,
            "table1_expression_bytes": expr,
        }
    assumptions = [
        f"Context {seq} tokens, one sequence; D = W (sequence parallel over all ranks), P = {P}; "
        "per-rank bytes from components/resources/formulas.py (model_state_bytes, "
        "moe_activation_terms_per_layer) under the settings below.",
        "Architectures are stand-ins (MoP publishes sizes only): gpt-oss-120b, DeepSeek-V3 with 224 "
        "experts, Kimi K2; the expert share of parameters is in extra (MoP Sec. 3.1: ~98-99% for 1T models).",
        *settings_lines("MoP", MOP_SETTINGS),
    ]
    model_rows = [f"{label} ({nodes * p.gpus_per_node} GPUs)" for label, nodes in MODELS.values()]
    return Result(
        cells=cells,
        assumptions=assumptions,
        extra={
            **extra,
            "paper_settings": {"mop": MOP_SETTINGS},
            "paper_layout": paper_layout(model_rows),
        },
    )


REPRODUCTION = Reproduction(
    id="mop-table1",
    paper_values=PAPER_VALUES,
    compute=compute,
    grade_class="exact",  # formula bytes
    defaults={"context": 131072, "P": 8},
)
