"""vocab-loss: the sharded vocabulary projection + cross-entropy over P real ranks, beside the dense
one (MoP Sec. 3.4): per-rank peak resident memory, time, exactness.

Every rank holds its own batch of ``tokens`` tokens (x: tokens x hidden, random targets) and,
for ``impl=sharded``, a 1/P column shard of W_voc (hidden x vocab, the same full matrix on
every rank, drawn from ``seed``); ``impl=dense`` projects onto the whole vocabulary and calls
torch's cross-entropy (the N x V logits materialised). The measured call is one forward +
backward of the summed per-token loss.

Set-up does one instrumented call after a warm-up call at the same size (thread pools, gloo
buffers and lazily built kernels then exist before the measured region):
- ``peak_bytes``: the call's peak resident-memory rise (components/training/peak_memory.py:
  kernel high-water mark with glibc's mmap threshold pinned), max over ranks;
- sharded only: the largest difference from the dense loss and gradients of the same batch
  (the sharded weight gradient sums every rank's batch, so it is compared with the dense
  gradients summed over the group), max over ranks.
#wrong: sharded -- loss, input-gradient and weight-gradient elements off from the dense ones by
more than 1e-5 + 1e-4 |dense|; dense -- losses of the first 64 tokens off from a float64
log-sum-exp by as much.
"""

from __future__ import annotations

import torch

from moe_repro.suites.base import SEED, Metric, Rule, Suite, fits_in_memory, one_of, whole

IMPLS = ("sharded", "dense")
RTOL, ATOL = 1e-4, 1e-5
CHECKED_TOKENS = 64


def _inputs(params: dict, ctx) -> dict:
    from moe_repro.components.model.vocab_parallel_loss import shard_bounds

    tokens, hidden, vocab = int(params["tokens"]), int(params["hidden"]), int(params["vocab"])
    seed = int(params["seed"])
    g = torch.Generator().manual_seed(seed)
    w_full = torch.randn(hidden, vocab, generator=g) * 0.05
    g_rank = torch.Generator().manual_seed(seed + 1 + ctx.rank)
    x = torch.randn(tokens, hidden, generator=g_rank)
    targets = torch.randint(0, vocab, (tokens,), generator=g_rank)
    lo, hi = shard_bounds(vocab, ctx.world_size)[ctx.rank]
    return {
        "x": x,
        "targets": targets,
        "w_full": w_full,
        "w_local": w_full[:, lo:hi].clone(),
        "bounds": (lo, hi),
        "vocab": vocab,
    }


def _sharded(state: dict):
    from moe_repro.components.model.vocab_parallel_loss import vocab_parallel_cross_entropy

    xs = state["x"].clone().requires_grad_(True)
    ws = state["w_local"].clone().requires_grad_(True)
    loss = vocab_parallel_cross_entropy(xs, ws, state["targets"], state["vocab"])
    loss.sum().backward()
    return loss.detach(), xs.grad, ws.grad


def _dense(state: dict):
    import torch.nn.functional as F

    xd = state["x"].clone().requires_grad_(True)
    wd = state["w_full"].clone().requires_grad_(True)
    loss = F.cross_entropy(xd @ wd, state["targets"], reduction="none")
    loss.sum().backward()
    return loss.detach(), xd.grad, wd.grad


def _count_off(got: torch.Tensor, want: torch.Tensor) -> int:
    return int((~torch.isclose(got, want, rtol=RTOL, atol=ATOL)).sum())


def setup(params: dict, ctx) -> dict:
    import torch.distributed as dist

    from moe_repro.components.training.peak_memory import (
        measure_peak_rss,
        peak_supported,
        return_freed_memory_to_os,
    )

    if params["impl"] not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {params['impl']!r}")
    tokens, hidden, vocab = int(params["tokens"]), int(params["hidden"]), int(params["vocab"])
    if min(tokens, hidden, vocab) < 1 or not 1 <= ctx.world_size <= vocab:
        raise ValueError("tokens, hidden, vocab must be positive and the group size in [1, vocab]")
    if not peak_supported():
        raise ValueError("vocab-loss measures peak RSS through /proc/self/clear_refs (Linux only)")
    return_freed_memory_to_os()
    state = _inputs(params, ctx)
    call = _sharded if params["impl"] == "sharded" else _dense
    state["call"] = call

    call(state)  # warm-up at the real size
    ctx.barrier()
    with measure_peak_rss() as peak:
        loss, grad_x, grad_w = call(state)
    ctx.barrier()
    state["peak_bytes"] = ctx.all_reduce_max(float(peak.peak_bytes))
    state["baseline_rss_bytes"] = ctx.all_reduce_max(float(peak.baseline_rss_bytes))

    if params["impl"] == "sharded":
        loss_d, gx_d, gw_d = _dense(state)
        dist.all_reduce(gw_d)
        lo, hi = state["bounds"]
        gw_d = gw_d[:, lo:hi]
        diffs = {
            "max_abs_loss_diff": (loss - loss_d).abs().max(),
            "max_abs_grad_x_diff": (grad_x - gx_d).abs().max(),
            "max_abs_grad_w_diff": (grad_w - gw_d).abs().max(),
            "max_abs_loss": loss_d.abs().max(),
        }
        state["diffs"] = {k: ctx.all_reduce_max(float(v)) for k, v in diffs.items()}
        state["wrong"] = (
            _count_off(loss, loss_d) + _count_off(grad_x, gx_d) + _count_off(grad_w, gw_d)
        )
    else:
        n = min(CHECKED_TOKENS, tokens)
        logits = state["x"][:n].double() @ state["w_full"].double()
        targets = state["targets"][:n]
        reference = torch.logsumexp(logits, dim=1) - logits[torch.arange(n), targets]
        state["diffs"] = {}
        state["wrong"] = _count_off(loss[:n].double(), reference)
    return state


def run(state: dict) -> None:
    state["call"](state)


def derive(params: dict, state: dict, time_s: float) -> dict:
    return {
        "peak_bytes": state["peak_bytes"],
        "baseline_rss_bytes": state["baseline_rss_bytes"],
        **state["diffs"],
    }


def check(state: dict) -> int:
    return state["wrong"]


SUITE = Suite(
    name="vocab-loss",
    schema={
        "impl": one_of(*IMPLS),
        "ranks": whole(1, 65536),
        "backend": one_of("gloo"),
        "tokens": whole(1),
        "hidden": whole(1, 2**16),
        "vocab": whole(1, 2**24),
        "seed": SEED,
    },
    rules=(
        Rule(
            lambda p: int(p["ranks"]) <= int(p["vocab"]),
            "ranks={ranks} exceeds vocab={vocab} (every rank holds a slice of the vocabulary)",
            {"ranks": "4", "vocab": "2"},
        ),
        # the full projection, logits and their gradient on every rank (float32)
        fits_in_memory(
            lambda p: (
                4
                * int(p["ranks"])
                * (2 * int(p["hidden"]) * int(p["vocab"]) + 3 * int(p["tokens"]) * int(p["vocab"]))
            ),
            {"tokens": str(2**20), "vocab": str(2**24)},
        ),
    ),
    choices={"impl": IMPLS, "backend": ("gloo",)},
    params={
        "impl": list(IMPLS),
        "ranks": [1, 2, 4],
        "backend": ["gloo"],
        "tokens": [2048],
        "hidden": [256],
        "vocab": [32768],
        "seed": [0],
    },
    quick={"ranks": [1, 2], "tokens": [256], "hidden": [32], "vocab": [4096]},
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    world_params=("ranks", "backend"),
    table_metrics=("time_s", "peak_bytes", "max_abs_loss_diff"),
    metrics=[
        Metric(
            "peak_bytes",
            "B",
            "lower",
            description="peak resident-memory rise of one forward+backward, max over ranks",
        ),
        Metric(
            "baseline_rss_bytes",
            "B",
            "none",
            description="resident memory at the start of the measured region, max over ranks",
        ),
        Metric(
            "max_abs_loss_diff",
            "nats",
            "lower",
            description="sharded only: largest |loss - dense loss|, all ranks",
        ),
        Metric(
            "max_abs_grad_x_diff",
            "abs",
            "lower",
            description="sharded only: largest input-gradient difference from dense",
        ),
        Metric(
            "max_abs_grad_w_diff",
            "abs",
            "lower",
            description="sharded only: largest weight-gradient difference from dense "
            "(summed over the group)",
        ),
        Metric("max_abs_loss", "nats", "none", description="sharded only: largest dense loss"),
    ],
    param_help={
        "impl": "sharded (W_voc split by columns over the ranks) or dense (one rank's "
        "full projection + torch cross-entropy)",
        "ranks": "group size P (real processes)",
        "backend": "gloo",
        "tokens": "N, tokens per rank (each rank its own batch)",
        "hidden": "H",
        "vocab": "V",
        "seed": "weight and batch seed",
    },
)
