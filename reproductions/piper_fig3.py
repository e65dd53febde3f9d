"""piper-fig3: attention throughput vs sequence length per model shape (Piper Fig. 3, Sec. IV-A1).

Real measurement on the machine it runs on (suite attention): causal SDPA with each zoo model's
head_dim and GQA ratio, ``heads`` query heads (scaled down from the model's own to fit a CPU;
throughput per head is what the figure compares), batch ``batch``, TFLOP/s vs sequence length.

Piper's Fig. 3 (MI250X, fp16, flash attention, B = 4) prints no numbers; the reader's guide
(piper-review.md Sec. 9.1) reads "roughly 60-120 TFLOPS" off it, which is a GPU range and
not comparable to a CPU. Cells are no-paper-value; at the paper's sequence lengths and full
head counts the CPU run is not-reproduced (too slow), stated per model.
"""

from __future__ import annotations

from moe_repro.reproductions.spec import Figure, Reproduction, Result


def compute(repro: Reproduction, params: dict) -> Result:
    from moe_repro.components.model.attention import shape_from_model
    from moe_repro.components.model.zoo import get_model
    from moe_repro.reproductions.suite_runs import (
        csv_param,
        device_words,
        run_grid,
        without_samples,
    )

    models, seqs = csv_param(params["models"]), csv_param(params["seq_lens"], int)
    base = {
        "batch": int(params["batch"]),
        "heads": int(params["heads"]),
        "backward": False,
        "dtype": str(params["dtype"]),
        "device": "auto",
        "threads": int(params["threads"]),
    }
    points = [dict(base, model=m, seq_len=s) for m in models for s in seqs]
    records = run_grid("attention", points, int(params["repeats"]))
    device = device_words()
    tf = {(r["model"], r["seq_len"]): r for r in records}
    cells, series = [], []
    for m in models:
        full = shape_from_model(get_model(m))
        run = tf[(m, seqs[0])]
        label = f"{m} (d={full.head_dim}, H={full.heads}/{full.kv_heads} kv)"
        for s in seqs:
            r = tf[(m, s)]
            cells.append(
                repro.compare(
                    label,
                    f"s={s}",
                    r["tflops"],
                    "TFLOP/s",
                    note=f"{int(r['heads_used'])} of {full.heads} query heads, IQR "
                    f"{r['tflops_iqr']:.3g}, #wrong {r.get('wrong', 'n/a')}; "
                    f"measured on {device}",
                )
            )
        cells.append(
            repro.compare(
                label,
                "paper scale (B=4, all heads, fp16 flash, MI250X)",
                None,
                "TFLOP/s",
                note=f"not reproduced: {full.heads} heads x B=4 on this CPU would take "
                f"{full.heads * 4 // max(1, int(run['heads_used']) * base['batch'])}x "
                "the measured time per point"
                + (", and fp16 flash kernels need a GPU" if device.startswith("cpu") else ""),
            )
        )
        series.append(
            {
                "label": f"{m} d={full.head_dim}",
                "x": seqs,
                "y": [tf[(m, s)]["tflops"] for s in seqs],
                "kind": "ours",
            }
        )
    figure = Figure(
        name="piper-fig3",
        title=f"Causal attention throughput vs sequence length ({device})",
        xlabel="sequence length",
        ylabel="TFLOP/s (median)",
        series=series,
        xscale="log",
    )
    assumptions = [
        f"Device: {device}; {base['threads']} CPU thread(s) where on CPU; dtype {base['dtype']}; "
        f"batch {base['batch']}; {base['heads']} query heads per model (0 = all), keeping head_dim "
        "and the GQA ratio. Forward only.",
        "FLOPs = 4 b H s^2 d / 2 (causal), the FlashAttention benchmark convention.",
        "head_dim = d_model / n_heads where the zoo has none (DeepSeek's MLA is 192/128 wide: "
        "approximate).",
        "Piper Fig. 3 prints no numbers; compare the trend with sequence length and head size, "
        "not absolute TFLOP/s (the paper's are MI250X fp16).",
    ]
    return Result(
        cells=cells,
        assumptions=assumptions,
        figures=[figure],
        extra={"device": device, "records": without_samples(records)},
    )


REPRODUCTION = Reproduction(
    id="piper-fig3",
    paper_values=[],
    compute=compute,
    defaults={
        "models": "mixtral-8x7b,qwen3-30b-a3b,xmoe-small,deepseek-v3",
        "seq_lens": "256,512,1024,2048",
        "batch": 1,
        "heads": 8,
        "dtype": "float32",
        "threads": 1,
        "repeats": 3,
    },
)
