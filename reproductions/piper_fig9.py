"""piper-fig9: expert load distribution over a real (small) training run (Piper Fig. 9).

Piper's Fig. 9 (350M base model, 16 experts, no balancing loss) shows the expert-routing
distribution over training: skewed, even collapsed, early, changing as experts specialise. It
prints no numbers. We train a small MoE with 16 experts and no auxiliary loss on CPU on the
Python standard library's source (components/balance/routing_record.py) and record every layer's
per-expert counts at every step. Cells: per layer, the busiest expert's share over the mean
(max/mean) at the first, middle and last step, and the device-level max-min gap over 4 would-be
EP ranks. The figures plot, per layer, each expert's share of the routed tokens against the tokens
consumed (Fig. 9's form), and each layer's max/mean on one axis. All cells are real measurements
of *our* run (no-paper-value): the phenomenon, not Piper's numbers.
"""

from __future__ import annotations


from moe_repro.components.balance.routing_record import fig9_config, train_and_record
from moe_repro.components.provenance import remembering
from moe_repro.components.balance.routing_trace import contiguous_ranks, device_loads, max_min_gap
from moe_repro.reproductions.suite_runs import step_progress
from moe_repro.reproductions.spec import Figure, Reproduction, Result


@remembering(maxsize=2)
def real_trace(steps: int, batch: int, seed: int):
    """The recorded run, cached per process (piper-alg2 replays the same trace)."""
    return train_and_record(
        fig9_config(), steps, batch, sources=4, seed=seed, progress=step_progress("training")
    )


def compute(repro: Reproduction, params: dict) -> Result:
    steps, batch, seed = int(params["steps"]), int(params["batch"]), int(params["seed"])
    if steps < 3:
        raise ValueError("steps must be >= 3")
    trace, losses = real_trace(steps, batch, seed)
    per_expert = trace.counts.sum(2).double()  # [L, steps, E]
    ratio = per_expert.max(-1).values / per_expert.mean(-1)
    # Fig. 9's x axis is training progress in tokens ("balanced after almost one billion token
    # consumption", Sec. VI): tokens consumed by the end of each step, counted from the routing
    # itself (every token is routed to top_k experts in every layer).
    tokens = [int(v) for v in (per_expert[0].sum(-1).cumsum(0) / trace.top_k).round().tolist()]
    ranks = contiguous_ranks(trace.num_experts, 4)
    cells, series = [], []
    note = trace.source
    picks = {"first step": 0, "middle step": steps // 2, "last step": steps - 1}
    for layer in range(trace.num_layers):
        row = f"layer {layer}"
        for label, s in picks.items():
            cells.append(
                repro.compare(
                    row, f"max/mean expert load, {label}", float(ratio[layer, s]), "x", note=note
                )
            )
        for label, s in picks.items():
            loads = device_loads(per_expert[layer, s].long(), ranks, 4)
            cells.append(
                repro.compare(
                    row,
                    f"GPU max-min gap / mean, {label} (EP=4)",
                    max_min_gap(loads) / float(loads.double().mean()),
                    "x",
                    note=note,
                )
            )
        series.append(
            {
                "label": f"layer {layer} (ours, real run)",
                "x": tokens,
                "y": [float(v) for v in ratio[layer]],
                "kind": "ours",
            }
        )
    cells.append(repro.compare("training", "loss first step", losses[0], "nats/byte", note=note))
    cells.append(repro.compare("training", "loss last step", losses[-1], "nats/byte", note=note))
    # Fig. 9 itself: the expert load distribution over training, per layer (caption and Sec. VI),
    # drawn as each expert's share of the layer's routed tokens; then the imbalance in one number.
    share = 100.0 * per_expert / per_expert.sum(-1, keepdim=True)
    figures = [
        Figure(
            name=f"piper-fig9-layer{layer}",
            title=f"Expert load distribution over training, layer {layer} (real CPU run, no aux loss)",
            xlabel="tokens consumed (training)",
            ylabel="expert load (% of routed tokens)",
            series=[
                {
                    "label": f"expert {e}",
                    "x": tokens,
                    "y": [float(v) for v in share[layer, :, e]],
                    "kind": "ours",
                }
                for e in range(trace.num_experts)
            ],
        )
        for layer in range(trace.num_layers)
    ]
    figures.append(
        Figure(
            name="piper-fig9",
            title="Expert load imbalance over training (real CPU run, no aux loss)",
            xlabel="tokens consumed (training)",
            ylabel="busiest expert / mean expert load",
            series=series,
        )
    )
    assumptions = [
        f"Trace: {trace.source}.",
        "Piper's run: 350M base model, 16 experts, expert frequency 0.5, ~1B tokens; ours is a "
        "tiny model for minutes of CPU, so only the qualitative shape can be compared.",
        "max/mean = E when one expert takes everything; 1 when perfectly balanced. top-2 routing: "
        "the floor for a collapsed router is E/2 = 8 with two experts sharing all tokens.",
    ]
    return Result(
        cells=cells,
        assumptions=assumptions,
        figures=figures,
        extra={"counts": per_expert.long().tolist(), "losses": losses},
    )


REPRODUCTION = Reproduction(
    id="piper-fig9",
    paper_values=[],
    compute=compute,
    defaults={"steps": 80, "batch": 8, "seed": 0},
)
