"""xmoe-fig3: per-GPU memory of one MoE layer, conventional vs fine-grained (X-MoE Fig. 3).

Analytic part: a 6.7B base (GPT-3 6.7B: H = 4096, h' = 16384), e = 16 experts (M_conv, k = 1)
vs e m = 128 experts of h'/8 (M_spec, k = 8), ZeRO-1 data parallelism with EP = number of
experts on 256 GPUs. Per GPU: the local expert's bf16 weights and gradients (4 B/param), its fp32
master + Adam states sharded over the 256/EP replicas (12 B/param / DP), and the four activation
tensors of X-MoE Table 2 (bf16). Fig. 3 prints no numbers, so cells carry no paper value.

Measured, scaled (real, this machine): the same two layers with H and h' divided by
``shape_div`` (e = 16 and e m = 128 experts, k = 1 and 8 kept) on ``measured_seq`` tokens, one
fp32 forward of the padding-free layer each: bytes autograd saves for backward and the forward's
peak memory rise (components/moe/activation_memory.py), beside Table 2's theory at that config. The
measured bars are activations only; the model-state bars stay analytic (they are parameter
counts, not something a run changes). Fig. 3's own measured bars (Frontier) are not reproduced.
"""

from __future__ import annotations

from moe_repro.components.resources.memory_model import xmoe_activation_elements
from moe_repro.reproductions._activation_cells import MIB, measured_cells
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
                                   note="measured per-GPU memory on 256 MI250X GCDs at full size; not "
                                        "reproduced here: see the scaled rows, measured on this machine"))
    fig = Figure(name="xmoe-fig3", title="One MoE layer per GPU: M_conv vs M_spec (analytic)",
                 xlabel="component (0 weights+grads, 1 optimizer, 2 dispatch+combine, 3 intermediates)",
                 ylabel="GiB", series=[{"label": r, "x": [0, 1, 2, 3], "y": [v / 2 ** 30 for v in vals],
                                        "kind": "ours"} for r, vals in bars.items()])
    scaled, device = _measure_scaled(h, hp, e, m, params)
    for row, meas in scaled.items():
        cells += measured_cells(repro, f"{row} scaled", meas, device)
    labels = ("Table 2 theory", "saved for backward", "forward peak")
    figures = [fig, Figure(
        name="xmoe-fig3-measured",
        title=f"Scaled layer activations, measured (H={h // int(params['shape_div'])}, "
              f"{int(params['measured_seq'])} tokens, fp32, {device.split(':')[0]})",
        xlabel="layer (0 M_conv, 1 M_spec)", ylabel="MiB",
        series=[{"label": label, "x": [0, 1], "kind": "ours",
                 "y": [v / MIB for v in (
                     [mm.theory_bytes for mm in scaled.values()] if label == labels[0] else
                     [mm.saved_bytes_beyond_input for mm in scaled.values()] if label == labels[1] else
                     [mm.peak_bytes for mm in scaled.values()])]} for label in labels])]
    assumptions = [
        "6.7B base: H=4096, h'=16384 (GPT-3 6.7B); e=16, m=8 (caption); two-matrix experts (X-MoE Table 1).",
        f"256 GPUs, EP = number of experts, ZeRO-1 over the 256/EP expert replicas; {b} sequence(s) of "
        f"{s} tokens per GPU (Fig. 3 does not state them); bf16 activations, capacity factor 1.",
    ]
    assumptions.append(
        f"Scaled measurement: H={h // int(params['shape_div'])}, h'={hp // int(params['shape_div'])} "
        f"(M_conv: e={e}, k=1; M_spec: e m={e * m} experts of h'/{m}, k={m}), "
        f"{int(params['measured_seq'])} tokens, GELU two-matrix experts, grouped_mm, fp32, one process "
        "(EP does not change a GPU's activations when routing is balanced).")
    return Result(cells=cells, assumptions=assumptions, figures=figures,
                  extra={"scaled": {row: vars(mm) for row, mm in scaled.items()}})


def _measure_scaled(h: int, hp: int, e: int, m: int, params: dict):
    from moe_repro.components.moe.activation_memory import measure_config
    from moe_repro.reproductions._suite_runs import device_words

    div, seq = int(params["shape_div"]), int(params["measured_seq"])
    if div < 1 or seq < 1:
        raise ValueError("shape_div and measured_seq must be >= 1")
    hs, hps = max(16, h // div), max(16 * m, hp // div)
    out = {
        "M_conv": measure_config(seq, hs, hps, e, 1, impls=("pft",))["pft"],
        "M_spec": measure_config(seq, hs, hps // m, e * m, m, impls=("pft",))["pft"],
    }
    return out, device_words()


REPRODUCTION = Reproduction(
    id="xmoe-fig3",
    paper_values=PAPER_VALUES, compute=compute, defaults={"micro_batch": 1, "seq": 2048,
                                                         "shape_div": 8, "measured_seq": 1024},
)
