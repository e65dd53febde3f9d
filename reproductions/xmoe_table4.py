"""xmoe-table4: activation memory per MoE layer, Large model, 256 GPUs, EP = 64 (X-MoE Table 4).

The 'Theoretical' column is X-MoE's own formula evaluated by the paper: the four padding-free
activation tensors of one MoE layer (Table 2: 2 x k b s H + 2 x k b s H_FFN elements, half
precision) for one sequence per GPU. We evaluate it two ways, under the settings X-MoE states
(``XMOE_COMMON`` and ``TABLE4_SETTINGS``, each with its section):

- ours, from the public formulas: the dispatch, expert-intermediate and combine terms of
  ``formulas.moe_activation_terms_per_layer`` for the zoo's xmoe-large (bf16, no recomputation,
  TP = 1, capacity factor 1) -- the evidence, graded (exact class) against the printed 1.125; the
  GiB-for-GB cause is tried by recomputing it in GiB (the counterfactual);
- X-MoE's Table 2 expression (components.resources.memory_model.xmoe_activation_elements):
  restates the paper's formula, graded echo.

The DS-MoE, Tutel and X-MoE columns are measured maxima on Frontier at full size; those cells stay
not reproduced.

Measured, scaled (real, this machine): the Large layer with H and H_FFN divided by ``shape_div``,
E by ``experts_div`` and the sequence by ``seq_div`` (k = 8 kept), one fp32 forward of the
padding-free layer (X-MoE's pipeline, components/moe/moe_layer.py) and of the capacity-padded layer
(DS-MoE's pipeline, components/moe/padded_moe.py, capacity factor 1.25). We count the bytes autograd
saves for backward and the forward's peak memory rise (components/training/activation_memory.py) and set
them beside Table 2's theory at the same scaled config. Sec. 5.4.1's claim (X-MoE's memory
significantly lower than DS-MoE's) is graded on the two scaled layers: a direction, since ours
is measured here and the paper's on Frontier.
"""

from __future__ import annotations

from moe_repro.components.model.zoo import get_model
from moe_repro.components.resources import formulas as F
from moe_repro.components.resources.memory_model import xmoe_activation_elements
from moe_repro.reproductions._activation_cells import measured_cells
from moe_repro.records.grading import PREDICTION_TOLERANCE, comparable
from moe_repro.reproductions.spec import PaperClaim, PaperValue, Reproduction, Result
from moe_repro.reproductions.xmoe_fig3 import ACT_BYTES, XMOE_COMMON, settings_lines

SCALED_IMPLS = {
    "pft": "X-MoE pipeline (padding-free), scaled",
    "padded": "DS-MoE pipeline (padded, c=1.25), scaled",
}

ROW, _SRC = "Memory (GB)", "X-MoE Table 4"
EXPR_ROW = "Memory (GB), X-MoE Table 2 expression"
SEQ = 4096  # Table 3: Large is trained at 4096
PAPER_VALUES = [
    PaperValue(ROW, c, p, "GB", _SRC)
    for c, p in (("DS-MoE", "2.81"), ("Tutel", "1.95"), ("X-MoE", "1.21"), ("Theoretical", "1.125"))
] + [PaperValue(EXPR_ROW, "Theoretical", "1.125", "GB", _SRC + " (the Theoretical column)")]
LOWER = ("X-MoE vs DS-MoE pipeline (scaled, measured here)", "direction")
PAPER_CLAIMS = [
    PaperClaim(
        *LOWER,
        "X-MoE achieves significantly lower memory consumption than both DeepSpeed-MoE and Tutel",
        "X-MoE Sec. 5.4.1, on Table 4",
    )
]
MOE_TERMS = ("dispatch", "expert_intermediate", "combine")  # Table 2's four tensors in formulas.py

TABLE4_SETTINGS: list[dict[str, str]] = [
    {
        "setting": "ZeRO stage",
        "used": "1 (model state does not enter an activation table)",
        "paper": "'ZeRO-style data parallelism', stage not stated for Table 4; 'We enable ZeRO-1 DP and set "
        "EP=64' for the same Large / 256-GPU setup of Fig. 13",
        "source": "Sec. 5.4.1, Sec. 5.4.3",
    },
    {
        "setting": "EP",
        "used": "64 (does not change a GPU's activations under balanced routing)",
        "paper": "'training the Large model on 256 GPUs, using EP=64'",
        "source": "Sec. 5.4.1",
    },
    {
        "setting": "TP / SP",
        "used": "TP = 1, no SSMB",
        "paper": "not stated for Table 4 (Fig. 13 varies TP 1-4 with SSMB)",
        "source": "Sec. 5.4.1, Sec. 5.4.3",
    },
    {
        "setting": "model and sequence length",
        "used": "Large: H = 7168, H_FFN = 2048, k = 8, s = 4096",
        "paper": "Table 3 (Large: seq. length 4096)",
        "source": "Table 3",
    },
    {
        "setting": "what is reported",
        "used": "one MoE layer's activations on one GPU",
        "paper": "'the per-layer activation memory usage ... the maximum memory usage across all ranks'",
        "source": "Sec. 5.4.1, Table 4",
    },
]


def formulas_bytes(m, b: int, seq: int = SEQ) -> dict[str, float]:
    """One MoE layer's activation terms from the public formulas (bf16, no recompute, TP 1, c = 1)."""
    return F.moe_activation_terms_per_layer(
        m, seq, b, recompute="none", bytes_per_value=ACT_BYTES, capacity_factor=1.0
    )


def compute(repro: Reproduction, params: dict) -> Result:
    b = int(params["micro_batch"])
    if b <= 0:
        raise ValueError("micro_batch must be positive")
    m = get_model("xmoe-large")
    terms = formulas_bytes(m, b)
    ours = sum(terms[k] for k in MOE_TERMS)
    el = xmoe_activation_elements(b, SEQ, m.d_model, m.d_ffn, m.top_k)
    expr = ACT_BYTES * sum(el.values())
    cell = repro.compare(
        ROW,
        "Theoretical",
        ours / 1e9,
        "GB",
        note="public formulas: moe_activation_terms_per_layer dispatch + expert_intermediate "
        f"+ combine (xmoe-large, b = {b}, s = {SEQ}, bf16, no recompute, c = 1)",
    )
    # The cause tried: the printed 1.125 is GiB under a "GB" header. The counterfactual is our
    # bytes divided by 2^30; the policy grades it under the same (exact) class.
    gib = ours / 2**30
    cell.explain(
        "unit-convention",
        f"{ours:,.0f} bytes = {gib:.4f} GiB; the header says GB",
        counterfactual=gib,
        removed="our bytes divided by 2^30 instead of 10^9",
    )
    cells = [
        cell,
        repro.compare(
            EXPR_ROW,
            "Theoretical",
            expr / 1e9,
            "GB",
            echo=True,
            note=f"X-MoE Table 2's 2 k b s H + 2 k b s H_FFN elements x {ACT_BYTES} B = {expr:,.0f} bytes "
            f"({expr / 2**30:.4f} GiB): restates the paper's formula; "
            f"{'equals' if expr == ours else 'differs from'} the public-formulas count",
        ),
    ]
    whole = sum(
        v
        for k, v in terms.items()
        if k
        not in (
            "layernorm",
            "attention_input",
            "attention_qkv",
            "attention_out",
            "attention_dropout",
            "attention_core",
        )
    )
    cells.append(
        repro.compare(
            ROW,
            "MoE block, all terms (ours)",
            whole / 1e9,
            "GB",
            note=f"public formulas, the MoE block's terms beyond Table 2's four: MLP input "
            f"{terms['mlp_input'] / 2**20:.0f} MiB and router probabilities {terms['router'] / 2**20:.0f} MiB "
            f"(= {whole / 2**30:.3f} GiB); the attention block is not in Table 4",
        )
    )
    why = (
        "measured on Frontier (max over 256 GPUs) at full size; not reproduced here: see the "
        "scaled rows, measured on this machine"
    )
    for col in ("DS-MoE", "Tutel", "X-MoE"):
        cells.append(
            repro.compare(
                ROW,
                col,
                None,
                "GB",
                note=why + ("; Tutel's pipeline is not implemented" if col == "Tutel" else ""),
            )
        )
    scaled = _measure_scaled(m, SEQ, params)
    for impl, label in SCALED_IMPLS.items():
        cells += measured_cells(repro, label, scaled["measurements"][impl], scaled["device"])
    cells.append(_lower_claim(repro, scaled["measurements"], scaled["device"]))
    sc = scaled["config"]
    assumptions = [
        f"Scaled measurement: H={sc['d_model']}, H_FFN={sc['d_ffn']}, E={sc['num_experts']}, "
        f"k={sc['top_k']}, S={sc['tokens']} tokens (Large / shape_div, experts_div, seq_div); GELU "
        "two-matrix experts, grouped_mm GEMM, fp32 on " + scaled["device"] + ".",
        f"Large: H={m.d_model}, H_FFN={m.d_ffn}, k={m.top_k}, s={SEQ}; {b} sequence(s) per GPU per "
        "micro-batch (1 reproduces the column).",
        "Theoretical (ours) = the dispatch, expert-intermediate and combine terms of "
        "formulas.moe_activation_terms_per_layer (2 B values, capacity factor 1, no dispatch metadata); "
        "EP size does not enter (each GPU receives k b s tokens when balanced).",
        *settings_lines("X-MoE", XMOE_COMMON),
        *settings_lines("X-MoE Table 4", TABLE4_SETTINGS),
    ]
    extra = {
        "elements": el,
        "bytes": ours,
        "formulas_terms": terms,
        "paper_expression_bytes": expr,
        "paper_settings": {"xmoe": XMOE_COMMON, "xmoe-table4": TABLE4_SETTINGS},
        "scaled_config": sc,
        "scaled": {impl: vars(mm) for impl, mm in scaled["measurements"].items()},
        # Table 4 as printed: one row, the three systems' measured memory and the theory
        "paper_layout": {
            "corner": "",
            "groups": [
                {
                    "label": "activation memory per MoE layer (GB)",
                    "columns": [
                        {"label": col, "column": col}
                        for col in ("DS-MoE", "Tutel", "X-MoE", "Theoretical")
                    ],
                }
            ],
            "rows": [ROW],
        },
    }
    return Result(cells=cells, assumptions=assumptions, extra=extra)


def _lower_claim(repro: Reproduction, meas: dict, device: str):
    """Sec. 5.4.1's claim on our scaled measurement (other hardware: the direction only): the
    padding-free layer keeps less for backward than the capacity-padded one, by more than the
    policy's "comparable" (grading.comparable) for "significantly"."""
    pft, padded = meas["pft"].saved_bytes_beyond_input, meas["padded"].saved_bytes_beyond_input
    holds = pft < padded and not comparable(pft, padded)
    return repro.claim(
        *LOWER,
        holds,
        pft / padded,
        "x",
        note=f"scaled, measured on {device}: saved for backward, padding-free "
        f"{pft / 2**20:.2f} MiB vs padded (c = 1.25) {padded / 2**20:.2f} MiB; "
        f"holds if lower beyond {PREDICTION_TOLERANCE:.0%}. Tutel is not implemented",
    )


def _measure_scaled(m, seq: int, params: dict) -> dict:
    from moe_repro.components.training.activation_memory import measure_config
    from moe_repro.reproductions.suite_runs import device_words

    divs = {k: int(params[k]) for k in ("shape_div", "experts_div", "seq_div")}
    if min(divs.values()) < 1:
        raise ValueError(f"shape_div, experts_div and seq_div must be >= 1, got {divs}")
    config = {
        "tokens": max(1, seq // divs["seq_div"]),
        "d_model": max(16, m.d_model // divs["shape_div"]),
        "d_ffn": max(16, m.d_ffn // divs["shape_div"]),
        "num_experts": max(m.top_k, m.n_experts // divs["experts_div"]),
        "top_k": m.top_k,
    }
    return {"config": config, "device": device_words(), "measurements": measure_config(**config)}


REPRODUCTION = Reproduction(
    id="xmoe-table4",
    paper_values=PAPER_VALUES,
    compute=compute,
    paper_claims=PAPER_CLAIMS,
    # The Theoretical column is the paper's formula evaluated (exact); the measured columns were
    # measured on Frontier and ours at a scaled config here: only Sec. 5.4.1's direction is graded.
    grade_class="exact",
    defaults={"micro_batch": 1, "shape_div": 8, "experts_div": 4, "seq_div": 4},
)
