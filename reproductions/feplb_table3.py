"""feplb-table3: token straggler (max - mean tokens per GPU) per PP/EP and method (FEPLB Table 3).

Replays a synthetic routing trace (reproductions/_feplb_traces.py) through no balancing,
FasterMoE shadow experts and FEPLB's greedy balancer (components/balance/load_balance_eval.py) and
reports FEPLB Sec. 3.1's token straggler, averaged over layers and micro-batches, and the
reduction relative to Before LB that Table 3 prints in parentheses.
"""

from __future__ import annotations

from moe_repro.reproductions import _feplb_traces as ft
from moe_repro.reproductions.spec import PaperValue, Reproduction, Result

_SRC = "FEPLB Table 3"
_PRINTED = {  # row: (Before LB, FasterMoE, FasterMoE %, FEPLB, FEPLB %), as printed
    "4/2": ("2,278", "1,014", "-55", "1,107", "-51"),
    "4/4": ("4,649", "2,471", "-47", "1,697", "-63"),
    "2/8": ("6,666", "4,036", "-39", "2,021", "-70"),
}
METHODS = ("Before LB", "FasterMoE", "FEPLB")
PAPER_VALUES = [v for row, (b, f, fp, e, ep) in _PRINTED.items() for v in (
    PaperValue(row, "Before LB", b, "tokens", _SRC),
    PaperValue(row, "FasterMoE", f, "tokens", _SRC),
    PaperValue(row, "FasterMoE vs Before LB", fp, "%", _SRC),
    PaperValue(row, "FEPLB", e, "tokens", _SRC),
    PaperValue(row, "FEPLB vs Before LB", ep, "%", _SRC),
)]


def compute(repro: Reproduction, params: dict) -> Result:
    ft.check(params)
    cells, inputs = [], []
    for row, ep in ft.CONFIGS:
        stats = ft.evaluate(params, ep)
        note = ft.trace_note(params, ep)
        base = stats["Before LB"].token_straggler
        for method in METHODS:
            value = stats[method].token_straggler
            cells.append(repro.compare(row, method, value, "tokens", note=note))
            if method != "Before LB":
                pct = 100.0 * (value - base) / base if base else None
                pct_cell = repro.compare(row, f"{method} vs Before LB", pct, "%", note=note)
                printed = _PRINTED[row]
                check = ft.printed_percentage_note(printed[1 if method == "FasterMoE" else 3],
                                                   printed[0], printed[2 if method == "FasterMoE" else 4])
                if check:
                    pct_cell.note = f"{note}; {check}"
                cells.append(pct_cell)
        inputs.append({"pp_ep": row, "ep": ep, **{m: stats[m].token_straggler for m in METHODS},
                       "samples": stats["Before LB"].samples})
    return Result(cells=cells, assumptions=[ft.trace_assumption(params), *ft.ASSUMPTIONS], extra={"inputs": inputs})


REPRODUCTION = Reproduction(
    id="feplb-table3",
    paper_values=PAPER_VALUES,
    compute=compute,
    defaults=dict(ft.DEFAULTS),
)
