"""xmoe-table4: activation memory per MoE layer, Large model, 256 GPUs, EP = 64 (X-MoE Table 4).

The 'Theoretical' column is analytic: the four padding-free activation tensors of one MoE layer
(X-MoE Table 2: 2 x k b s H + 2 x k b s H_FFN elements, bf16) for one sequence per GPU. The
DS-MoE, Tutel and X-MoE columns are measured maxima on Frontier; they are not reproduced here
(the measured, scaled-down part belongs to another issue's real runs).
"""

from __future__ import annotations

from moe_repro.components.memory_model import xmoe_activation_elements
from moe_repro.components.zoo import get_model
from moe_repro.reproductions.spec import PaperValue, Reproduction, Result

ROW, _SRC = "Memory (GB)", "X-MoE Table 4"
PAPER_VALUES = [PaperValue(ROW, c, p, "GB", _SRC) for c, p in
                (("DS-MoE", "2.81"), ("Tutel", "1.95"), ("X-MoE", "1.21"), ("Theoretical", "1.125"))]


def compute(repro: Reproduction, params: dict) -> Result:
    b = int(params["micro_batch"])
    m = get_model("xmoe-large")
    seq = 4096  # Table 3: Large is trained at 4096
    el = xmoe_activation_elements(b, seq, m.d_model, m.d_ffn, m.top_k)
    nbytes = 2 * sum(el.values())
    cell = repro.compare(ROW, "Theoretical", nbytes / 1e9, "GB")
    if cell.verdict == "deviates":
        gib = nbytes / 2 ** 30
        pv = repro.paper_value(ROW, "Theoretical")
        if abs(gib - pv.value) <= pv.half_unit:
            cell.note = (f"{nbytes:,} bytes = {gib:.3f} GiB: the printed 1.125 is GiB, while the "
                         "header says GB (the measured columns' unit cannot be checked)")
    cells = [cell]
    why = ("measured on Frontier (max over 256 GPUs); not reproduced by the analytic model: the "
           "measured part runs scaled-down on real processes in another issue")
    for col in ("DS-MoE", "Tutel", "X-MoE"):
        cells.append(repro.compare(ROW, col, None, "GB", note=why))
    assumptions = [
        f"Large: H={m.d_model}, H_FFN={m.d_ffn}, k={m.top_k}, s={seq}; {b} sequence(s) per GPU per "
        "micro-batch (X-MoE picks the largest power-of-two micro-batch that fits; 1 reproduces the column).",
        "Theoretical = 2 bytes x (A_dispatch + A_combine + A_interm0 + A_interm1), capacity factor 1, "
        "no dispatch metadata; EP size does not enter (each GPU receives k b s tokens when balanced).",
    ]
    return Result(cells=cells, assumptions=assumptions, extra={"elements": el, "bytes": nbytes})


REPRODUCTION = Reproduction(
    id="xmoe-table4", title="Activation memory per MoE layer (Large model): theory vs measured",
    paper="xmoe", element="Table 4", how="A+R",
    description="The theoretical activation memory of one padding-free MoE layer from the activation "
                "model; the measured framework columns are marked not reproduced.",
    paper_values=PAPER_VALUES, compute=compute, defaults={"micro_batch": 1},
)
