"""moe-layer: forward time breakdown of one MoE layer, pft vs padded, over real EP ranks (X-MoE Fig. 11).

Stages (suites/_moe_stages.py): gating, buffer_dispatch, dispatch_a2a, expert, combine_a2a,
buffer_combine, and ``layer`` (the whole forward). Each rank holds E/ranks experts and its own
``tokens``; a stage's time is the slowest rank's (the runner's barrier + max). With ranks = 1
the all-to-all stages are no-ops (nothing leaves the rank).

Peers (``[peers]`` extra): Megatron-core and DeepSpeed run their own gating, dispatch and
combine around the same expert weights, on one rank (ranks=1, stages gating, buffer_dispatch,
expert, buffer_combine, layer); each record's ``peer`` names the package and version. On ranks
> 1 (and with ``backward`` = 1) megatron, megatron-nodrop and deepspeed run their own
expert-parallel layers with their own all-to-alls (stage layer), forward or forward + backward,
checked against a one-rank reference like ours: ``repro bench moe-layer --ranks 4 --impl
pft,megatron,deepspeed --backward 1 --stage layer``.

Defaults: the X-MoE Small layer scaled to this machine: H = 1024 (Small: 2048), F = 704
(Small: 1408), E = 64, k = 6, capacity factor 1.25, 1024 tokens per rank, 2 ranks.
"""

from __future__ import annotations

from moe_repro.runtime.device import resolve_device
from moe_repro.components.moe.grouped_gemm import check_gemm_name, gemm_choices
from moe_repro.components.moe.overlap import parse_overlap
from moe_repro.suites._moe_stages import (
    IMPLS,
    MEMORY_RULES,
    STAGES,
    check_layer_pass,
    derive_stage,
    peer_params,
    run_stage,
    setup_stage,
)
from moe_repro.suites.base import (
    DEVICE,
    THREADS,
    Metric,
    Param,
    Suite,
    divides,
    one_of,
    registered,
    top_k_within_experts,
    whole,
)


def check_params(p: dict) -> dict:
    """Refuse a grid point before any rank starts (one line, exit 2 from the CLI)."""
    import math

    for key, allowed in (
        ("impl", IMPLS),
        ("stage", (*STAGES, "layer")),
        ("dtype", ("float32", "bfloat16")),
        ("device", ("auto", "cpu", "cuda")),
    ):
        if p[key] not in allowed:
            raise ValueError(f"{key} must be one of {', '.join(allowed)}, got {p[key]!r}")
    check_gemm_name(p["gemm"])  # ValueError naming the registered kernels
    parse_overlap(p.get("overlap", "auto"))
    for key in ("ranks", "d_model", "d_ffn", "experts", "top_k"):
        if int(p[key]) < 1:
            raise ValueError(f"{key} must be >= 1, got {p[key]}")
    if str(p.get("backward", 0)) not in ("0", "1"):
        raise ValueError(f"backward must be 0 or 1, got {p['backward']!r}")
    if int(p["tokens"]) < 0:
        raise ValueError(f"tokens must be >= 0, got {p['tokens']}")
    if int(p["top_k"]) > int(p["experts"]):
        raise ValueError(f"top_k={p['top_k']} exceeds experts={p['experts']}")
    if int(p["experts"]) % int(p["ranks"]):
        raise ValueError(f"experts={p['experts']} must be divisible by ranks={p['ranks']}")
    cf = float(p["capacity_factor"])
    if not (math.isfinite(cf) and cf > 0):
        raise ValueError(
            f"capacity_factor must be a positive finite number, got {p['capacity_factor']}"
        )
    return {**peer_params(p), **gemm_used(p)}  # a peer's package and version; the kernel


def gemm_used(p: dict) -> dict:
    """The kernel the point's expert GEMMs run and why (``named``, or for ``auto`` ``table`` /
    ``fallback``: components/moe/kernel_choice.py; ``fixed`` for an implementation that runs
    its own, components/moe/impls.py's expert_kernel), at the point's mean tokens per expert
    (tokens * ranks * top_k / experts rows on each expert's rank), and the overlap chunks (1
    for an implementation our pipelining does not apply to); in every record."""

    from moe_repro.components.moe.kernel_choice import choose_kernel
    from moe_repro.components.moe.impls import get_impl
    from moe_repro.suites._moe_stages import DTYPES

    from moe_repro.components.moe.overlap import chunks_for

    ranks, impl = int(p["ranks"]), get_impl(p.get("impl", "pft"))
    device = resolve_device(p["device"]).type  # the device the layer runs on (runtime rule)
    pipelined = impl.pipelines and p.get("stage", "layer") == "layer"
    chunks = {
        "overlap_chunks": chunks_for(
            p.get("overlap", "auto"), ranks > 1, "flat", int(p["experts"]) // ranks, device
        )
        if pipelined
        else 1
    }
    if impl.expert_kernel is not None:
        return {"gemm_used": impl.expert_kernel, "gemm_rule": "fixed", **chunks}
    if p["gemm"] != "auto":
        return {"gemm_used": p["gemm"], "gemm_rule": "named", **chunks}
    rows = int(p["tokens"]) * int(p["ranks"]) * int(p["top_k"]) / int(p["experts"])
    training = bool(int(p.get("backward", 0)))  # auto's rule for a differentiated call
    choice = choose_kernel(
        device, DTYPES[p["dtype"]], rows, int(p["d_model"]), int(p["d_ffn"]), training=training
    )
    return {"gemm_used": choice.kernel, "gemm_rule": choice.source, **chunks}


def setup(params: dict, ctx=None) -> dict:
    if params["stage"] not in (*STAGES, "layer"):
        raise ValueError(f"moe-layer stages: {', '.join(STAGES)}, layer")
    check_gemm_name(params["gemm"])  # ValueError naming the registered kernels
    return setup_stage(params, ctx)


def kernels_used(records: list[dict]) -> list[str]:
    """Under the table: the expert GEMM kernel each point ran (auto's choice and its rule) and
    the overlap chunks, one line per distinct combination; then the side-by-side of whole-layer
    points (:func:`side_by_side`)."""
    seen: dict[tuple, list[str]] = {}
    for r in records:
        if "gemm_used" not in r:
            continue
        key = (
            r.get("impl"),
            r["gemm"],
            r["gemm_used"],
            r.get("gemm_rule"),
            r.get("overlap_chunks"),
        )
        seen.setdefault(key, []).append(str(r.get("dtype")))
    lines = [
        f"{impl}: gemm={asked} ran {used} ({rule}), overlap chunks {chunks}"
        f" [{', '.join(sorted(set(dtypes)))}]"
        for (impl, asked, used, rule, chunks), dtypes in seen.items()
    ]
    return lines + side_by_side(records)


SHAPE_KEYS = ("ranks", "dtype", "backward", "tokens", "d_model", "d_ffn", "experts", "top_k")


def expert_flops(r: dict) -> float:
    """The expert GEMMs' useful FLOPs of one whole-layer call over all ranks: every rank's
    tokens * top_k rows through the SwiGLU expert (3 matrices of H x F, 2 FLOPs per
    multiply-add), three times that with the backward (input and weight gradients)."""
    rows = int(r["ranks"]) * int(r["tokens"]) * int(r["top_k"])
    passes = 3 if int(r.get("backward", 0)) else 1
    return 2.0 * rows * int(r["d_model"]) * int(r["d_ffn"]) * 3 * passes


def gemm_ceiling(r: dict) -> float | None:
    """The machine's measured grouped-GEMM rate (FLOP/s) at the point's expert shape and dtype,
    for the cores the point's ranks run on: the kernel table's rate there (the expert-gemm
    suite's fastest correct kernel, components/moe/kernel_choice.py) times the cores (CPU:
    ranks x threads, at most the machine's; a GPU: ranks, one device each). None when the
    table has no measurement near the shape."""
    import os

    from moe_repro.components.moe.kernel_choice import nearest_entry
    from moe_repro.suites._moe_stages import DTYPES

    device = str(r.get("device_used", r.get("device", "cpu"))).split(":")[0]
    if device not in ("cpu", "cuda"):
        device = resolve_device(str(r.get("device", "auto"))).type
    rows = int(r["tokens"]) * int(r["ranks"]) * int(r["top_k"]) / int(r["experts"])
    entry = nearest_entry(device, DTYPES[str(r["dtype"])], rows, int(r["d_model"]), int(r["d_ffn"]))
    if entry is None or not entry.get("threads"):
        return None
    ranks = int(r["ranks"])
    if device == "cuda":
        return float(entry["tflops"]) * 1e12 * ranks
    per_rank = int(r.get("threads", 0) or 0) or max(1, (os.cpu_count() or 1) // ranks)
    cores = min(ranks * per_rank, os.cpu_count() or 1)
    return float(entry["tflops"]) * 1e12 * cores / int(entry["threads"])


def side_by_side(records: list[dict]) -> list[str]:
    """Whole-layer points (stage layer) of several implementations at the same shape: each
    one's median time, its ratio to the best peer's, the expert kernel it ran, the expert GEMMs'
    achieved rate (useful FLOPs over the layer's time: :func:`expert_flops`) and that rate's
    fraction of the machine's measured grouped-GEMM ceiling (:func:`gemm_ceiling`)."""
    from moe_repro.components.moe.impls import get_impl

    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if r.get("stage") == "layer" and r.get("time_s"):
            groups.setdefault(tuple(str(r.get(k)) for k in SHAPE_KEYS), []).append(r)
    groups = {k: v for k, v in groups.items() if len({r.get("impl") for r in v}) > 1}
    if not groups:
        return []
    lines = [
        "side by side (whole layer): impl, ranks, dtype, backward, median time, x best peer, "
        "expert kernel, overlap chunks, expert GFLOP/s, % of the measured grouped-GEMM ceiling"
    ]
    for rows in groups.values():
        peers = [r["time_s"] for r in rows if get_impl(str(r["impl"])).form == "peer"]
        best = min(peers) if peers else None
        for r in rows:
            time_s, ceiling = float(r["time_s"]), gemm_ceiling(r)
            rate = expert_flops(r) / time_s
            lines.append(
                f"  {r['impl']:<16} ranks {r['ranks']:<3} {r['dtype']:<8}"
                f" bwd {r.get('backward', 0)}  {time_s:.3f} s"
                f"  x best peer {f'{time_s / best:.2f}' if best else '-'}"
                f"  {r.get('gemm_used', '-')}  chunks {r.get('overlap_chunks', '-')}"
                f"  {rate / 1e9:.1f} GFLOP/s"
                f"  {f'{rate / ceiling:.0%}' if ceiling else '- (no ceiling measured here)'}"
            )
    return lines


class MoELayerSuite(Suite):
    """With ``backward`` 1 (whole-layer passes) and no stage asked for, the stage is the whole
    layer: the other stages are forward cuts of our layer alone."""

    def grid(self, overrides: dict[str, list] | None = None, quick: bool = False) -> list[dict]:
        overrides = dict(overrides or {})
        if "stage" not in overrides and [str(v) for v in overrides.get("backward", ())] == ["1"]:
            overrides["stage"] = ["layer"]
        return super().grid(overrides, quick)


SUITE = MoELayerSuite(
    name="moe-layer",
    schema={
        "impl": one_of(*IMPLS),
        "stage": one_of(*STAGES, "layer"),
        "ranks": whole(1, 65536),
        "backend": one_of("gloo"),
        "tokens": whole(0),
        "d_model": whole(1, 2**16),
        "d_ffn": whole(1, 2**16),
        "experts": whole(1, 2**16),
        "top_k": whole(1, 2**10),
        "capacity_factor": Param(float, 0.01, 1000.0),
        "gemm": registered("gemm", gemm_choices),
        "dtype": one_of("float32", "bfloat16"),
        "device": DEVICE,
        "threads": THREADS,
        "backward": whole(0, 1),
        "overlap": Param(str, check=parse_overlap, bad=("0", "sometimes")),
    },
    rules=(
        top_k_within_experts(),
        divides("ranks", "experts", {"ranks": "3", "experts": "8"}),
        *MEMORY_RULES,
    ),
    params={
        "impl": ["pft", "padded"],
        "stage": [*STAGES, "layer"],
        "ranks": [2],
        "backend": ["gloo"],
        "tokens": [1024],
        "d_model": [1024],
        "d_ffn": [704],
        "experts": [64],
        "top_k": [6],
        "capacity_factor": [1.25],
        "gemm": ["auto"],
        "dtype": ["float32"],
        "device": ["auto"],
        "threads": [0],
        "backward": [0],
        "overlap": ["auto"],
    },
    quick={
        "tokens": [128],
        "d_model": [128],
        "d_ffn": [96],
        "experts": [8],
        "top_k": [2],
        "stage": ["dispatch_a2a", "expert", "layer"],
    },
    derived_params=check_params,
    summary=kernels_used,
    setup=setup,
    run=run_stage,
    derive=derive_stage,
    check=check_layer_pass,
    world_params=("ranks", "backend"),
    metrics=[
        Metric(
            "peak_bytes",
            "B",
            "lower",
            description="peak memory of one call above the memory held before it, max over ranks",
        ),
        Metric(
            "buffer_rows",
            "rows",
            "lower",
            kind="analytic",
            description="rows of this rank's dispatch buffer: retained pairs (pft) or E*C (padded)",
        ),
    ],
    param_help={
        "impl": "pft or padded; with pip install -e \".[peers]\" also megatron, "
        "megatron-nodrop, deepspeed (their own gating, dispatch and combine around our "
        "experts; on ranks > 1 their own expert-parallel layers and all-to-alls, stage "
        "layer) and deepspeed-einsum (ranks=1)",
        "stage": f"{', '.join(STAGES)} or layer",
        "ranks": "EP ranks (real processes)",
        "backend": "gloo (CPU) or nccl (GPUs)",
        "tokens": "tokens per rank",
        "d_model": "H",
        "d_ffn": "expert width F",
        "experts": "E (divisible by ranks)",
        "top_k": "k",
        "capacity_factor": "padded: C = ceil(cf S k / E); pft: per-expert drop limit",
        "gemm": f"pft expert GEMM kernel: {', '.join(gemm_choices())} (auto: the fastest "
        "correct kernel for the device, dtype and shape; the record's gemm_used names it)",
        "dtype": "float32 or bfloat16",
        "device": "auto, cpu or cuda",
        "threads": "CPU intra-op threads per rank (0: the launcher's share of the cores)",
        "overlap": "stage layer of pft under EP: auto, off or N chunks of dispatch/combine "
        "pipelined with the expert GEMMs (components/moe/overlap.py); records say overlap_chunks",
        "backward": "1: time forward + backward of the whole layer (stage=layer), each "
        "implementation's own expert-parallel path, checked against a "
        "one-rank reference",
    },
)
