"""feplb-table4: GEMM straggler (max - mean grouped-GEMM time per GPU, ms) per PP/EP and method
(FEPLB Table 4).

The same synthetic traces and balancers as feplb-table3; each device's grouped-GEMM time is
*modelled* (components/routing_trace.GemmTimeModel: roofline of one GLM-5 SwiGLU expert on an
H100, dgx-h100 profile), not measured: the GEMMs are H100 bf16 kernels this machine cannot run.
The model charges each expert group its weight traffic, so FasterMoE's split shadows (one small
group per device) cost more than FEPLB's whole-expert copies, the effect FEPLB Sec. 2 names.
"""

from __future__ import annotations

from moe_repro.reproductions import _feplb_traces as ft
from moe_repro.reproductions.spec import PaperValue, Reproduction, Result

_SRC = "FEPLB Table 4"
_PRINTED = {
    "4/2": ("0.316", "0.170", "-46", "0.157", "-50"),
    "4/4": ("0.652", "0.380", "-42", "0.247", "-62"),
    "2/8": ("1.110", "0.625", "-44", "0.352", "-68"),
}
METHODS = ("Before LB", "FasterMoE", "FEPLB")
PAPER_VALUES = [v for row, (b, f, fp, e, ep) in _PRINTED.items() for v in (
    PaperValue(row, "Before LB", b, "ms", _SRC),
    PaperValue(row, "FasterMoE", f, "ms", _SRC),
    PaperValue(row, "FasterMoE vs Before LB", fp, "%", _SRC),
    PaperValue(row, "FEPLB", e, "ms", _SRC),
    PaperValue(row, "FEPLB vs Before LB", ep, "%", _SRC),
)]


def compute(repro: Reproduction, params: dict) -> Result:
    ft.check(params)
    cells, inputs = [], []
    for row, ep in ft.CONFIGS:
        stats = ft.evaluate(params, ep, with_gemm=True)
        note = f"{ft.trace_note(params, ep)}; GEMM time modelled (roofline, H100), not measured"
        base = stats["Before LB"].gemm_straggler_s
        for i, method in enumerate(METHODS):
            value = stats[method].gemm_straggler_s
            cells.append(repro.compare(row, method, value * 1e3, "ms", note=note))
            if method != "Before LB":
                pct = 100.0 * (value - base) / base if base else None
                cell = repro.compare(row, f"{method} vs Before LB", pct, "%", note=note)
                printed = _PRINTED[row]
                check = ft.printed_percentage_note(printed[2 * i - 1], printed[0], printed[2 * i])
                if check:
                    cell.note = f"{note}; {check}"
                cells.append(cell)
        inputs.append({"pp_ep": row, "ep": ep,
                       **{m: stats[m].gemm_straggler_s * 1e3 for m in METHODS}})
    model = ft.gemm_model()
    assumptions = [ft.trace_assumption(params), *ft.ASSUMPTIONS,
                   f"GEMM time per expert group: max(2 rows H F n_mat / {model.flops_per_s:.3g} FLOP/s, "
                   f"(n_mat H F + rows (2H + 2F)) x 2 B / {model.bytes_per_s:.3g} B/s), H={model.d_model}, "
                   f"F={model.d_ffn}, forward only; a device's time is the sum over its groups."]
    return Result(cells=cells, assumptions=assumptions, extra={"inputs": inputs})


REPRODUCTION = Reproduction(
    id="feplb-table4",
    paper_values=PAPER_VALUES,
    compute=compute,
    defaults=dict(ft.DEFAULTS),
)
