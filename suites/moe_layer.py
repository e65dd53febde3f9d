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
    ``fallback``: components/moe/kernel_choice.py), at the point's mean tokens per expert
    (tokens * ranks * top_k / experts rows on each expert's rank); in every record."""

    from moe_repro.components.moe.kernel_choice import choose_kernel
    from moe_repro.suites._moe_stages import DTYPES

    from moe_repro.components.moe.overlap import chunks_for

    ranks = int(p["ranks"])
    chunks = {
        "overlap_chunks": chunks_for(
            p.get("overlap", "auto"), ranks > 1, "flat", int(p["experts"]) // ranks
        )
    }
    if p["gemm"] != "auto":
        return {"gemm_used": p["gemm"], "gemm_rule": "named", **chunks}
    device = resolve_device(p["device"]).type  # the device the layer runs on (runtime rule)
    rows = int(p["tokens"]) * int(p["ranks"]) * int(p["top_k"]) / int(p["experts"])
    choice = choose_kernel(device, DTYPES[p["dtype"]], rows, int(p["d_model"]), int(p["d_ffn"]))
    return {"gemm_used": choice.kernel, "gemm_rule": choice.source, **chunks}


def setup(params: dict, ctx=None) -> dict:
    if params["stage"] not in (*STAGES, "layer"):
        raise ValueError(f"moe-layer stages: {', '.join(STAGES)}, layer")
    check_gemm_name(params["gemm"])  # ValueError naming the registered kernels
    return setup_stage(params, ctx)


def kernels_used(records: list[dict]) -> list[str]:
    """Under the table: the expert GEMM kernel each point ran (auto's choice and its rule) and
    the overlap chunks, one line per distinct combination."""
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
    return [
        f"{impl}: gemm={asked} ran {used} ({rule}), overlap chunks {chunks}"
        f" [{', '.join(sorted(set(dtypes)))}]"
        for (impl, asked, used, rule, chunks), dtypes in seen.items()
    ]


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
        "megatron-nodrop, deepspeed, deepspeed-einsum at ranks=1 (their own "
        "gating, dispatch and combine around our experts)",
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
