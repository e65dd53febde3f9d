"""mop-llep: least-loaded EP vs plain EP on skewed routing, over real gloo ranks (MoP Sec. 3.3).

MoP adopts LLEP (Nguyen et al.) "unchanged as our routing layer" and recaps it: "up to 5x
MoE-layer speedup and 4x peak-memory reduction over standard expert parallelism". Those are
"up to" figures from another paper's GPUs, so they are notes, not paper values. We run
components/least_loaded_ep.LeastLoadedMoELayer and plain components/moe_layer.MoELayer on the
same skewed routing over ``ranks`` real gloo processes on this CPU and report: rows computed on
the busiest rank (token straggler), forward+backward wall time (median of ``repeats``, the
slowest rank per repeat), and the largest difference between the two layers' outputs and input
gradients (LLEP is exact: it moves compute, not the assignment of tokens to experts).
"""

from __future__ import annotations

import statistics
import time

from moe_repro.runtime.launch import run_ranks
from moe_repro.reproductions.spec import Reproduction, Result


def llep_rank(ctx, tokens: int, d_model: int, d_ffn: int, experts: int, top_k: int, skew: float,
              repeats: int, seed: int) -> dict:
    """Rank target: both layers, same weights and inputs; times and rows per rank."""
    import torch
    import torch.distributed as dist

    from moe_repro.components.balance.least_loaded_ep import LeastLoadedMoELayer
    from moe_repro.components.moe.moe_layer import MoELayer

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    gate = torch.randn(d_model, experts, generator=g) * d_model ** -0.5
    gate[0] = torch.linspace(0.0, skew, experts)        # feature 0 is constant: a fixed skew
    layers = {"plain EP": MoELayer(d_model, d_ffn, experts, top_k, expert_parallel=True),
              "LLEP": LeastLoadedMoELayer(d_model, d_ffn, experts, top_k, expert_parallel=True)}
    full = {n: torch.randn(experts, *p.shape[1:], generator=g) * p.shape[1] ** -0.5
            for n, p in layers["LLEP"].experts.named_parameters()}
    for layer in layers.values():
        with torch.no_grad():
            layer.gate.weight.copy_(gate)
            for n, p in layer.experts.named_parameters():
                p.copy_(full[n][layer.local_experts])
    gx = torch.Generator().manual_seed(seed * 100 + ctx.rank)
    x = torch.randn(tokens, d_model, generator=gx)
    x[:, 0] = 1.0
    grad_out = torch.randn(tokens, d_model, generator=gx)
    out = {}
    for name, layer in layers.items():
        times, result = [], None
        for _ in range(repeats + 1):                      # the first call warms up
            xi = x.clone().requires_grad_(True)
            dist.barrier()
            t0 = time.perf_counter()
            y = layer(xi)
            (y * grad_out).sum().backward()
            times.append(ctx.all_reduce_max(time.perf_counter() - t0))
            result = (y.detach(), xi.grad)
        out[name] = {"time_s": statistics.median(times[1:]), "y": result[0], "dx": result[1]}
    plan = layers["LLEP"].last_plan
    counts = torch.tensor(plan.loads_before, dtype=torch.float64)
    return {"rows_plain": plan.loads_before, "rows_llep": plan.loads_after,
            "time_plain_s": out["plain EP"]["time_s"], "time_llep_s": out["LLEP"]["time_s"],
            "max_out_diff": float((out["LLEP"]["y"] - out["plain EP"]["y"]).abs().max()),
            "max_dx_diff": float((out["LLEP"]["dx"] - out["plain EP"]["dx"]).abs().max()),
            "mean_rows": float(counts.mean())}


def compute(repro: Reproduction, params: dict) -> Result:
    ranks = int(params["ranks"])
    if ranks < 2 or int(params["experts"]) % ranks:
        raise ValueError("need ranks >= 2 dividing experts")
    kwargs = {k: params[k] for k in ("tokens", "d_model", "d_ffn", "experts", "top_k", "skew",
                                     "repeats", "seed")}
    res = run_ranks("moe_repro.reproductions.mop_llep:llep_rank", kwargs, world_size=ranks,
                    timeout_s=300)
    r0 = res[0]
    note = (f"real: {ranks} gloo ranks on this CPU, {params['tokens']} tokens/rank, E={params['experts']}, "
            f"top-{params['top_k']}, skew {params['skew']} (synthetic router bias)")
    cells = []
    for name, rows, t in (("plain EP", r0["rows_plain"], r0["time_plain_s"]),
                          ("LLEP", r0["rows_llep"], r0["time_llep_s"])):
        cells.append(repro.compare(name, "rows on busiest rank", float(max(rows)), "rows", note=note))
        cells.append(repro.compare(name, "token straggler (max - mean)", max(rows) - r0["mean_rows"],
                                   "rows", note=note))
        cells.append(repro.compare(name, "layer fwd+bwd time (median)", t * 1e3, "ms",
                                   note=note + "; slowest rank per repeat"))
    cells.append(repro.compare("LLEP", "speedup vs plain EP", r0["time_plain_s"] / r0["time_llep_s"],
                               "x", note=note + "; MoP Sec. 3.3 recaps 'up to 5x' on GPUs (not comparable)"))
    err = max(max(r["max_out_diff"], r["max_dx_diff"]) for r in res)
    cells.append(repro.compare("LLEP", "max |LLEP - plain EP| (output, input grad)", err, "abs",
                               note="exact semantics: differences are fp32 summation order only"))
    assumptions = ["Router skew: feature 0 of every token is 1 and the gate's row 0 rises linearly "
                   "over the experts, so later experts are preferred (a synthetic, fixed skew).",
                   "LLEP plan: capacity ceil(N/W) per rank, excess to the least-loaded rank "
                   "(components/balance/least_loaded_ep.py; MoP does not print LLEP's algorithm).",
                   "CPU timings with gloo: the all-to-alls and weight copies cost more than on "
                   "NVLink, so the speedup is this machine's, not the paper's regime.",
                   "Default 2 ranks: this machine has 2 cores; with more ranks than cores the ranks "
                   "share cores and the busiest rank's extra work no longer sets the time."]
    return Result(cells=cells, assumptions=assumptions, extra={"ranks": res})


REPRODUCTION = Reproduction(
    id="mop-llep",
    title="Least-loaded EP vs plain EP on skewed routing (real gloo ranks)",
    paper="mop",
    element="Sec. 3.3",
    how="R",
    description="LLEP and plain EP layers on the same skewed routing over real ranks: busiest-rank "
                "rows, layer time, exactness.",
    paper_values=[],
    compute=compute,
    defaults={"ranks": 2, "tokens": 512, "d_model": 64, "d_ffn": 256, "experts": 8, "top_k": 2,
              "skew": 4.0, "repeats": 5, "seed": 0},
)
