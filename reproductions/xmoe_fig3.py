"""xmoe-fig3: per-GPU memory of one MoE layer, conventional vs fine-grained (X-MoE Fig. 3).

Analytic part: a 6.7B base (GPT-3 6.7B: H = 4096, h' = 16384), e = 16 experts (M_conv, k = 1)
vs e m = 128 experts of h'/8 (M_spec, k = 8), ZeRO-1 data parallelism with EP = number of
experts on 256 GPUs. Per GPU: the local expert's bf16 weights and gradients (4 B/param), its fp32
master + Adam states sharded over the 256/EP replicas (12 B/param / DP), and the four activation
tensors of X-MoE Table 2 (bf16). Fig. 3 prints no numbers, so cells carry no paper value; the
measured bars are not reproduced here (real, scaled-down runs belong to another issue).
"""

from __future__ import annotations

from moe_repro.components.memory_model import xmoe_activation_elements
from moe_repro.reproductions.spec import Figure, PaperValue, Reproduction, Result

COLS = ("expert weights+grads", "optimizer states (ZeRO-1)", "A_dispatch+A_combine", "A_interm0+A_interm1")
PAPER_VALUES: list[PaperValue] = []


def compute(repro: Reproduction, params: dict) -> Result:
    h, hp, e, m, gpus = 4096, 16384, 16, 8, 256
    b, s = int(params["micro_batch"]), int(params["seq"])
    if b <= 0 or s <= 0:
        raise ValueError("micro_batch and seq must be positive")
    cells, bars = [], {}
    for row, E, hf, k in (("M_conv", e, hp, 1), ("M_spec", e * m, hp // m, m)):
        EP = E  # X-MoE Sec. 3.2: EP size equal to the number of experts
        dp = gpus // EP
        expert_params = (E // EP) * 2 * h * hf  # X-MoE Table 1: 2 h h' per expert
        el = xmoe_activation_elements(b, s, h, hf, k)
        values = [4 * expert_params, 12 * expert_params / dp,
                  2 * (el["A_dispatch"] + el["A_combine"]), 2 * (el["A_interm0"] + el["A_interm1"])]
        for col, v in zip(COLS, values):
            cells.append(repro.compare(row, col, v / 2 ** 30, "GiB"))
        bars[row] = values
        cells.append(repro.compare(row, "measured (Frontier)", None, "GiB",
                                   note="measured per-GPU memory on 256 MI250X GCDs; not reproduced by the "
                                        "analytic model (scaled real runs are another issue's)"))
    fig = Figure(name="xmoe-fig3", title="One MoE layer per GPU: M_conv vs M_spec (analytic)",
                 xlabel="component (0 weights+grads, 1 optimizer, 2 dispatch+combine, 3 intermediates)",
                 ylabel="GiB", series=[{"label": r, "x": [0, 1, 2, 3], "y": [v / 2 ** 30 for v in vals],
                                        "kind": "ours"} for r, vals in bars.items()])
    assumptions = [
        "6.7B base: H=4096, h'=16384 (GPT-3 6.7B); e=16, m=8 (caption); two-matrix experts (X-MoE Table 1).",
        f"256 GPUs, EP = number of experts, ZeRO-1 over the 256/EP expert replicas; {b} sequence(s) of "
        f"{s} tokens per GPU (Fig. 3 does not state them); bf16 activations, capacity factor 1.",
    ]
    return Result(cells=cells, assumptions=assumptions, figures=[fig])


REPRODUCTION = Reproduction(
    id="xmoe-fig3", title="Memory distribution of one conventional vs fine-grained MoE layer",
    paper="xmoe", element="Fig. 3", how="A+R",
    description="Per-GPU model-state and activation memory of one M_conv and one M_spec layer from "
                "the memory model; the measured bars are marked not reproduced.",
    paper_values=PAPER_VALUES, compute=compute, defaults={"micro_batch": 1, "seq": 2048},
)
