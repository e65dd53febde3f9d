"""xmoe-table2: activation sizes of an equivalent conventional vs fine-grained MoE (X-MoE Table 2).

Table 2 is symbolic: with fine-grained factor m, M_conv (e experts of H_FFN = h', k = 1) and
M_spec (e m experts of h'/m, k = m) have A_dispatch = A_combine = bsh vs m bsh and
A_interm = bsh' for both. We evaluate our activation model (components.resources.memory_model,
X-MoE's k B S H / k B S H_FFN per tensor) on concrete shapes and express each tensor in the
table's units (bsh for dispatch/combine, bsh' for the intermediates); the paper's symbolic
entries are evaluated at the same m.
"""

from __future__ import annotations

from moe_repro.components.resources.memory_model import xmoe_activation_elements
from moe_repro.reproductions.spec import PaperValue, Reproduction, Result

COLS = ("A_dispatch", "A_combine", "A_interm0", "A_interm1")
_SRC = "X-MoE Table 2 (symbolic entry evaluated at m = 8)"
# As printed: M_conv: bsh, bsh, bsh', bsh'; M_spec: mbsh, mbsh, bsh', bsh'. At m = 8:
PAPER_VALUES = [
    PaperValue("M_conv", c, "1", u, _SRC) for c, u in zip(COLS, ("bsh", "bsh", "bsh'", "bsh'"))
] + [
    PaperValue("M_spec", c, p, u, _SRC)
    for c, p, u in zip(COLS, ("8", "8", "1", "1"), ("bsh", "bsh", "bsh'", "bsh'"))
]


def compute(repro: Reproduction, params: dict) -> Result:
    m, b, s, h, h_ffn = (int(params[k]) for k in ("m", "b", "s", "h", "h_ffn"))
    if m != 8:
        raise ValueError("the paper's symbolic entries are evaluated at m = 8 here; keep m=8")
    if h_ffn % m:
        raise ValueError(f"h_ffn={h_ffn} must be divisible by m={m}")
    cells = []
    for row, k, hf in (("M_conv", 1, h_ffn), ("M_spec", m, h_ffn // m)):
        el = xmoe_activation_elements(b, s, h, hf, k)
        for col in COLS:
            unit = b * s * (h if col in ("A_dispatch", "A_combine") else h_ffn)
            # Our activation model is X-MoE's own per-tensor formula, so evaluating it restates
            # the table: an echo (a check of our code against the paper's algebra), not evidence.
            cells.append(
                repro.compare(
                    row,
                    col,
                    el[col] / unit,
                    "bsh" if unit == b * s * h else "bsh'",
                    echo=True,
                    note="X-MoE's formula evaluated; restates the table",
                )
            )
    conv = sum(xmoe_activation_elements(b, s, h, h_ffn, 1).values())
    spec = sum(xmoe_activation_elements(b, s, h, h_ffn // m, m).values())
    assumptions = [
        f"Evaluated at b={b}, s={s}, h={h}, h'={h_ffn}, m={m} (any shapes give the same ratios).",
        "Padding-free buffers (capacity factor 1), as Table 2; the bsh' units are the dense FFN width.",
        f"Total of the four tensors: M_spec / M_conv = {spec / conv:.2f} at these shapes "
        f"(dispatch+combine dominate once m h > h').",
    ]
    return Result(
        cells=cells, assumptions=assumptions, extra={"elements_conv": conv, "elements_spec": spec}
    )


REPRODUCTION = Reproduction(
    id="xmoe-table2",
    paper_values=PAPER_VALUES,
    compute=compute,
    grade_class="exact",  # formula evaluations
    defaults={"m": 8, "b": 4, "s": 2048, "h": 4096, "h_ffn": 16384},
)
