"""``repro plan``: parallel layouts for a model on a platform.

Default (``--method parallel``): components.resources.parallel_planner searches DP with ZeRO 0-3,
TP with sequence parallelism, PP (1F1B / interleaved), EP with expert TP, CP and recompute (none,
selective, full, or full of the first N layers per stage), checks memory per
GPU and ranks by predicted step time. ``--method piper``: Piper's PP x EP planner (Sec. III-C,
IV-C; Eq. 7-11), with the output it always had."""

from __future__ import annotations

import click

from moe_repro.cli.errors import BadInput, OutputFile


def load_platform(name_or_path: str):
    """A built-in profile by name, or a JSON file (a copied and edited profile); bad input exits 2."""
    from moe_repro.components.network.platform import load_platform as load

    try:
        return load(name_or_path)
    except ValueError as e:
        raise BadInput(str(e)) from None


def load_model(key: str):
    """A zoo model by key, or the model a JSON file describes (a Hugging Face config.json or a
    moe-repro model spec: docs/model-spec.md)."""
    from moe_repro.components.model.zoo import get_model

    if key.endswith(".json"):
        from moe_repro.components.model.hf_config import ModelConfigError, load_model_file

        try:
            return load_model_file(key)
        except ModelConfigError as e:
            raise BadInput(str(e)) from None
    try:
        return get_model(key)
    except KeyError as e:
        raise BadInput(e.args[0]) from None


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f}"


def format_plan(pl) -> str:
    from moe_repro.reports.terminal import table

    rows = []
    for c in pl.candidates:
        e = c.estimate
        rows.append(
            [
                str(c.pp),
                str(c.ep),
                str(c.micro_batches),
                f"{c.micro_batch:g}",
                _gb(c.peak_bytes) if c.peak_bytes else "-",
                str(c.peak_stage),
                "yes" if c.checkpointing else "no",
                f"{e.bubble:.1%}" if e else "-",
                f"{(e.alltoall_s + e.p2p_s) * 1e3:.1f}" if e else "-",
                f"{e.step_s:.2f}" if e else "-",
                f"{e.tflops_per_gpu:.1f}" if e else "-",
                f"{e.mfu:.1%}" if e else "-",
                "yes" if c.feasible else "no",
                c.why_not or "",
            ]
        )
    head = (
        f"plan: {pl.model} on {pl.platform}, {pl.nodes} nodes = {pl.gpus} GPUs, seq {pl.seq}, "
        f"global batch {pl.global_batch}"
    )
    out = [
        head,
        table(
            [
                "pp",
                "ep",
                "M",
                "mb/gpu",
                "peak GB",
                "stage",
                "ckpt",
                "bubble",
                "comm ms/mb",
                "step s",
                "TFLOPS/gpu",
                "MFU",
                "feasible",
                "why not",
            ],
            rows,
        ),
    ]
    if pl.rejected:
        out.append("rejected (Eq. 8-10):")
        out += [f"  pp={r['pp']} ep={r['ep']}: {r['why_not']}" for r in pl.rejected]
    out.append("assumptions:")
    out += [f"  - {a}" for a in pl.assumptions]
    best = pl.best
    if best:  # Piper's estimate is its own composition of the time model, never scored
        out.append(
            "how far to trust the estimate: Piper's performance model is not among repro validate's "
            "predictors; repro run piper-fig11 and piper-fig12 grade it against Piper's own Frontier "
            "measurements (the default method's step time is scored by repro validate)"
        )
    out.append(
        f"best: pp={best.pp} ep={best.ep} (estimated MFU {best.estimate.mfu:.1%})"
        if best
        else "best: none fits; add nodes, enable ZeRO (--zero 1) or shorten --seq"
    )
    return "\n".join(out)


def _si(x: float, unit: str = "") -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.0f} {unit}".rstrip()


def _params(n: float) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:.0f}"


def _gib(x: float) -> str:
    return f"{x / 2**30:.1f}"


def model_summary(pl, name: str) -> str:
    f = pl.flops_per_token
    return (
        f"model: {pl.model} ({name}): {_params(pl.params['total'])} parameters, "
        f"{_params(pl.params['active'])} active per token; {_si(f['forward'], 'FLOP')} forward, "
        f"{_si(f['training'], 'FLOP')} training per token at seq {pl.seq} (causal attention; "
        f"6N = {_si(f['training_6n'], 'FLOP')})"
    )


def _layout(c) -> str:
    parts = [
        f"TP {c.tp}{' (SP)' if c.sp else ''}",
        f"PP {c.pp}" + (f" (VPP {c.vpp})" if c.vpp > 1 else ""),
        f"DP {c.dp}",
    ]
    if c.ep > 1:
        parts.append(f"EP {c.ep}")
    if c.cp > 1:
        parts.append(f"CP {c.cp}")
    if c.etp > 1:
        parts.append(f"ETP {c.etp}")
    return " x ".join(parts) + (
        f", ZeRO-{c.zero}, recompute {c.recompute_note}, micro-batch {c.micro_batch}, "
        f"M {c.micro_batches}"
    )


# Headroom the planner keeps below HBM by default: the order of the memory model's error against
# measured peaks; to be set from repro validate's memory error (docs/planner.md, "Memory kinds")
DEFAULT_MEMORY_MARGIN = 0.10
PLAN_MEMORY_KIND = "device"  # what must fit in HBM: what nvidia-smi shows for the process
KIND_MEANS = {
    "allocated": "torch.cuda.max_memory_allocated",
    "reserved": "torch.cuda.max_memory_reserved",
    "device": "nvidia-smi",
    None: "live tensors + the profile's framework overhead",
}


def _margin(value: str | None) -> float:
    if value is None:
        return DEFAULT_MEMORY_MARGIN
    try:
        out = float(value)
    except ValueError:
        out = -1.0
    if not 0 <= out < 1:
        raise BadInput(f"--memory-margin must be a fraction of HBM in [0, 1), got {value!r}")
    return out


def format_memory(
    memory: dict, stage: int, layout: str, kind: str | None, hbm: float, margin: float
) -> str:
    """Every memory term of one stage (a plan's ``memory`` dict) as one table: GiB, share of the
    total, what kind of memory first counts it, and its source's citation; the rule of each term
    below (memory_terms.SOURCES)."""
    from moe_repro.components.resources.memory_terms import CITATIONS, KIND_OF, SOURCES
    from moe_repro.reports.terminal import table

    total = memory["total"]
    names = [k for k in memory if k not in ("total", "host")]
    rows = [
        [
            k,
            f"{memory[k] / 2**30:.2f}",
            f"{memory[k] / total:.1%}" if total else "-",
            KIND_OF.get(k, "live tensors"),
            CITATIONS[k],
        ]
        for k in names
    ]
    rows.append(["total", f"{total / 2**30:.2f}", "100.0%", "", ""])
    usable = hbm * (1 - margin)
    verdict = "fits" if total <= usable else "does not fit"
    out = [
        f"memory of stage {stage} (the binding stage) of {layout}; kind {kind or 'live'} "
        f"({KIND_MEANS[kind]}):",
        table(["term", "GiB", "share", "counted from", "source"], rows),
        f"HBM {hbm / 2**30:.1f} GiB - margin {margin:.0%} = {usable / 2**30:.1f} GiB usable: "
        f"{verdict} ({(usable - total) / 2**30:+.1f} GiB)",
    ]
    if memory.get("host"):
        out.append(f"host (offloaded, not in the total): {memory['host'] / 2**30:.2f} GiB")
    out.append("how each term is counted:")
    out += [f"  - {k}: {SOURCES[k]}" for k in names]
    return "\n".join(out)


def format_parallel(
    pl,
    name: str,
    top: int,
    trust: str | None = None,
    explain: str | None = None,
    margin: float = 0.0,
) -> str:
    """The plan as text; ``explain`` (format_memory) and ``trust`` (the step-time predictor's
    record) go just above the closing ``best:`` line, which stays last. ``margin``: the fraction
    of HBM the plan kept free (``pl.hbm_bytes`` is what remained usable)."""
    from moe_repro.reports.terminal import table

    shown = pl.candidates[:top]
    any_miss = any(not c.feasible for c in shown)
    rows = []
    for i, c in enumerate(shown, 1):
        mem = c.memory
        row = [
            str(i),
            str(c.tp),
            "y" if c.sp else "n",
            str(c.pp),
            str(c.vpp),
            str(c.dp),
            str(c.ep),
            str(c.cp),
            str(c.etp),
            str(c.zero),
            c.recompute_note,
            str(c.micro_batch),
            str(c.micro_batches),
            _gib(mem["weights"]),
            _gib(mem["grads"]),
            _gib(mem["optimizer"]),
            _gib(mem["activations"]),
            _gib(mem["buffers"]),
            _gib(mem["total"]),
            f"{c.step_s:.2f}" if c.feasible else "-",
            f"{c.mfu:.1%}" if c.feasible else "-",
        ]
        if any_miss:
            row.append(c.why_not or "")
        rows.append(row)
    headers = [
        "#",
        "TP",
        "SP",
        "PP",
        "VPP",
        "DP",
        "EP",
        "CP",
        "ETP",
        "ZeRO",
        "recompute",
        "mb",
        "M",
        "weights",
        "grads",
        "optim",
        "activ",
        "buffers",
        "total GiB",
        "step s",
        "MFU",
    ]
    if any_miss:
        headers.append("why not")
    s = pl.search
    out = [
        model_summary(pl, name),
        f"plan: {pl.platform}, {pl.nodes} node{'s' if pl.nodes != 1 else ''} x {pl.gpus_per_node} = "
        f"{pl.gpus} GPUs, seq {pl.seq}, "
        f"global batch {pl.global_batch} ({pl.global_batch * pl.seq / 1e6:.2f}M tokens), precision "
        f"{pl.precision}, HBM {pl.hbm_bytes / (1 - margin) / 2**30:.1f} GiB per GPU"
        + (f" ({pl.hbm_bytes / 2**30:.1f} usable, {margin:.0%} kept free)" if margin else "")
        + f"; {s['layouts']} layouts searched "
        f"in {s['seconds']:.2f} s, {s['feasible']} layout x ZeRO-stage candidates fit",
    ]
    if shown:
        label = (
            "top candidates"
            if not any_miss or shown[0].feasible
            else "no candidate fits; the closest misses"
        )
        out.append(f"{label} (memory per GPU in GiB on the binding stage; step time predicted):")
        out.append(table(headers, rows))
    else:
        out.append("no candidate: every layout was rejected (see below)")
    if pl.rejected:
        out.append("rejected (count: reason):")
        width = len(str(max(r["count"] for r in pl.rejected)))
        out += [f"  {r['count']:>{width}}: {r['reason']}" for r in pl.rejected]
    out.append("assumptions:")
    out += [f"  - {a}" for a in pl.assumptions]
    best = pl.best
    if explain:
        out.append(explain)
    if trust:
        out.append(trust)
    out.append(
        f"best: {_layout(best)}: step {best.step_s:.2f} s, MFU {best.mfu:.1%}"
        if best
        else "best: none fits; add nodes, allow ZeRO-3 or full recompute, or shorten --seq"
    )
    return "\n".join(out)


def _stages(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        out = tuple(int(x) for x in value.split(","))
    except ValueError:
        out = ()
    if not out or any(z not in (0, 1, 2, 3) for z in out):
        raise BadInput(f"--zero must be ZeRO stages 0-3, comma-separated, got {value!r}")
    return out


def _modes(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    out = tuple(x.strip() for x in value.split(","))
    ok = lambda x: (
        x in ("none", "selective", "block", "full")
        or (x.startswith("full:") and x[5:].isdigit() and int(x[5:]) > 0)
    )
    if not out or not all(ok(x) for x in out):
        raise BadInput(
            f"--recompute must be none, selective or full, block (the smallest N layers per stage "
            f"that fits) or full:N (comma-separated), got {value!r}"
        )
    return out


def _presets() -> list[str]:
    from moe_repro.components.resources.formulas import PRECISION_PRESETS

    return list(PRECISION_PRESETS)


@click.command(
    "plan", short_help="Rank parallel layouts (ZeRO/DP, TP+SP, PP, EP, CP, recompute) for a model."
)
@click.option(
    "--model",
    "model_key",
    required=True,
    help="Model zoo key (e.g. gpt3-175b, deepseek-v3), or a JSON file: a Hugging Face config.json "
    "(Mixtral, Qwen2/Qwen3-MoE, DeepSeek-V2/V3, OLMoE, GPT-OSS) or a model spec (docs/model-spec.md).",
)
@click.option(
    "--platform",
    "platform_name",
    required=True,
    help="Built-in profile (frontier, dgx-h100, h200, local) or a profile JSON file.",
)
@click.option("--nodes", type=int, required=True, help="Number of nodes.")
@click.option(
    "--method",
    type=click.Choice(["parallel", "piper"]),
    default="parallel",
    show_default=True,
    help="parallel: DP/ZeRO x TP x PP x EP x CP search; piper: Piper's PP x EP planner (Eq. 7-11).",
)
@click.option("--seq", type=int, default=4096, show_default=True, help="Sequence length (tokens).")
@click.option(
    "--global-batch",
    type=int,
    default=None,
    help="Sequences per step (default: ~4M tokens, a multiple of the GPUs; piper: 4 x GPUs).",
)
@click.option("--micro-batches", type=int, default=None, help="Fix the micro-batches per step M.")
@click.option(
    "--precision",
    default=None,
    help="Precision preset of formulas.PRECISION_PRESETS (bf16-adam, megatron, fp8-params, "
    "deepseek-v3-fp8, adam-8bit, ...); default bf16-adam. An unknown name lists them.",
)
@click.option(
    "--zero",
    "zero",
    default=None,
    help="ZeRO stages to consider, e.g. 1 or 1,3 (default all; piper: one stage, default 0).",
)
@click.option(
    "--recompute",
    default=None,
    help="Recompute modes to consider: none, selective, full, block (full recompute of the "
    "smallest N layers per stage that fits; Megatron's --recompute-method block) or full:N "
    "(N fixed), comma-separated (default none,selective,block,full).",
)
@click.option("--tp", type=int, default=None, help="Fix the tensor-parallel degree.")
@click.option("--pp", type=int, default=None, help="Fix the pipeline degree (piper: with --ep).")
@click.option(
    "--vpp", type=int, default=None, help="Fix the virtual pipeline stages per GPU (1: plain 1F1B)."
)
@click.option(
    "--ep", type=int, default=None, help="Fix the expert-parallel degree (piper: with --pp)."
)
@click.option(
    "--cp", type=int, default=None, help="Fix the context-parallel degree (offered from seq 16K)."
)
@click.option(
    "--etp",
    type=int,
    default=None,
    help="Fix the expert tensor-parallel degree (MoE models; default: search 1 and TP).",
)
@click.option(
    "--sp/--no-sp",
    "sp",
    default=None,
    help="Fix sequence parallelism on or off for TP > 1 (Megatron's --sequence-parallel; "
    "default: search both).",
)
@click.option("--top", type=int, default=10, show_default=True, help="Candidates to print.")
@click.option(
    "--dropout/--no-dropout",
    "dropout",
    default=None,
    help="Count dropout masks in the activations (default: the model's own setting, e.g. on for "
    "gpt3-175b, off for the Llama 3 family).",
)
@click.option(
    "--no-flash", is_flag=True, help="Materialised attention scores instead of FlashAttention."
)
@click.option(
    "--no-overlap-dp",
    is_flag=True,
    help="ZeRO 0/1: reduce the gradients once after the last backward instead of overlapping "
    "the reduction with it (Megatron-LM before --overlap-grad-reduce).",
)
@click.option(
    "--no-overlap-tp",
    is_flag=True,
    help="Expose the backward's TP all-reduces instead of overlapping them with the weight-gradient "
    "GEMMs (Megatron-LM before its asynchronous TP all-reduce, 2021-09).",
)
@click.option(
    "--dispatcher",
    type=click.Choice(["alltoall", "deepep", "hybrid-ep", "deepep-ll"]),
    default=None,
    help="EP token dispatcher the EP time models (default alltoall): alltoall: Megatron-core's "
    "NCCL all-to-all, every top-k copy sent apart (flat); deepep / hybrid-ep: the flex "
    "dispatcher's node-deduplicated kernels (a token crosses the network once per node it "
    "reaches, then NVLink forwarding; DeepSeek-V3's node-limited routing applied); deepep-ll: "
    "DeepEP's low-latency kernels, every copy sent directly. Timed as the network simulator's "
    "EP model (components/resources/ep_time.py); exposed, not overlapped with compute, unless "
    "--overlap-ep.",
)
@click.option(
    "--overlap-ep",
    is_flag=True,
    help="Hide each micro-batch's EP all-to-alls behind another micro-batch's compute, exposing "
    "only the excess (Megatron-core --overlap-moe-expert-parallel-comm, DualPipe).",
)
@click.option(
    "--unfused-grad-accumulation",
    is_flag=True,
    help="Add each micro-batch's gradients to the held ones in a separate HBM pass instead of "
    "inside the weight-gradient GEMM (Megatron-LM before --gradient-accumulation-fusion).",
)
@click.option(
    "--no-checkpointing", is_flag=True, help="piper: never fall back to activation checkpointing."
)
@click.option(
    "--causal-flops", is_flag=True, help="piper: halve attention FLOPs for the causal mask."
)
@click.option(
    "--schedule", type=click.Choice(["1f1b", "gpipe"]), default=None, help="piper: schedule (1f1b)."
)
@click.option(
    "--explain-memory",
    is_flag=True,
    help="Print every memory term of the chosen layout's binding stage (the best candidate, or "
    "the closest miss when none fits; fix a layout with --tp/--pp/--ep/--cp/--vpp/--zero/"
    "--recompute): GiB, share of the total, and source (example below).",
)
@click.option(
    "--gemm-precision",
    type=click.Choice(["bf16", "fp8"]),
    default=None,
    help="Precision of the linear layers' GEMMs (default bf16): fp8 runs them at the profile's "
    "achievable BF16 rate times the data sheet's dense FP8/BF16 peak ratio (Transformer Engine's "
    "FP8 and MXFP8 recipes); the attention core and memory-bound kernels are unchanged. Memory "
    "follows --precision (e.g. deepseek-v3-fp8).",
)
@click.option(
    "--first-stage-layers",
    type=int,
    default=None,
    metavar="N",
    help="Layers of the first pipeline stage (Megatron-LM --decoder-first-pipeline-num-layers): "
    "the stages between share the rest evenly. Example: 61 layers at --pp 4 with "
    "--first-stage-layers 16 --last-stage-layers 15 (two stages of 15 between).",
)
@click.option(
    "--last-stage-layers",
    type=int,
    default=None,
    metavar="N",
    help="Layers of the last pipeline stage (Megatron-LM --decoder-last-pipeline-num-layers).",
)
@click.option(
    "--framework",
    type=click.Choice(["auto", "megatron-core", "torchtitan"]),
    default=None,
    help="How the framework that will run the plan allocates memory, with the settings the "
    "memory validation set scores its runs with (reproductions/validation_points.json, "
    "memory_settings): torchtitan: FSDP2, "
    "torch's cross-entropy on fp32 logits, eager SwiGLU, its per-op selective checkpointing, "
    "expandable segments; megatron-core: its distributed optimizer, vocab-parallel "
    "cross-entropy, fused SwiGLU, Korthikanti's selective recompute. auto (default): FSDP2 at "
    "ZeRO-3, Megatron-core otherwise.",
)
@click.option(
    "--memory-margin",
    default=None,
    metavar="FRACTION",
    help=f"Fraction of HBM the planner keeps free (default {DEFAULT_MEMORY_MARGIN:g}, the order "
    "of the memory model's error; to be set from repro validate's measured memory error). The "
    "parallel method checks device memory (nvidia-smi: live tensors, transients, allocator, CUDA "
    "context, NCCL buffers) against the rest. Example: --memory-margin 0.05",
)
@click.option(
    "--json",
    "json_path",
    type=OutputFile(),
    default=None,
    help="Write the plan (summary, candidates, rejected, assumptions) to this file.",
)
def command(
    model_key,
    platform_name,
    nodes,
    method,
    seq,
    global_batch,
    micro_batches,
    precision,
    zero,
    recompute,
    tp,
    pp,
    vpp,
    ep,
    cp,
    etp,
    sp,
    top,
    dropout,
    no_flash,
    no_overlap_dp,
    no_overlap_tp,
    dispatcher,
    overlap_ep,
    unfused_grad_accumulation,
    no_checkpointing,
    causal_flops,
    schedule,
    explain_memory,
    gemm_precision,
    first_stage_layers,
    last_stage_layers,
    framework,
    memory_margin,
    json_path,
) -> None:
    """Search parallel layouts for a model on NODES nodes of a platform, reject those that break a
    rule or do not fit in HBM (grouped reasons with counts), and rank the rest by predicted step
    time, with the memory per GPU by term and the MFU. --method piper: Piper's PP x EP planner.

    Example: repro plan --model gpt3-175b --nodes 64 --platform dgx-h100 --json p.json

    Example: repro plan --model mixtral-8x7b --nodes 2 --platform dgx-h100 --explain-memory
    """
    from moe_repro.records.atomic import atomic_write_json

    for name, v in (
        ("--nodes", nodes),
        ("--seq", seq),
        ("--global-batch", global_batch),
        ("--micro-batches", micro_batches),
        ("--tp", tp),
        ("--pp", pp),
        ("--vpp", vpp),
        ("--ep", ep),
        ("--cp", cp),
        ("--etp", etp),
        ("--top", top),
        ("--first-stage-layers", first_stage_layers),
        ("--last-stage-layers", last_stage_layers),
    ):
        if v is not None and v <= 0:
            raise BadInput(f"{name} must be positive, got {v}")
    zeros, modes = _stages(zero), _modes(recompute)
    margin = _margin(memory_margin)
    if precision is not None and precision not in _presets():
        import difflib

        close = difflib.get_close_matches(precision, _presets(), n=3, cutoff=0.5)
        raise BadInput(
            f"unknown precision preset {precision!r}; "
            + (f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(_presets())}")
        )
    if method == "piper":
        for name, v in (
            ("--tp", tp),
            ("--vpp", vpp),
            ("--cp", cp),
            ("--etp", etp),
            ("--sp/--no-sp", sp),
            ("--recompute", recompute),
            ("--precision", precision),
            ("--dropout/--no-dropout", dropout),
            ("--no-overlap-dp", no_overlap_dp or None),
            ("--no-overlap-tp", no_overlap_tp or None),
            ("--dispatcher", dispatcher),
            ("--overlap-ep", overlap_ep or None),
            ("--unfused-grad-accumulation", unfused_grad_accumulation or None),
            ("--memory-margin", memory_margin),
            ("--framework", framework),
            ("--gemm-precision", gemm_precision),
            ("--first-stage-layers", first_stage_layers),
            ("--last-stage-layers", last_stage_layers),
        ):
            if v is not None:
                raise BadInput(
                    f"{name} applies to --method parallel (the default), not --method piper"
                )
        if zeros is not None and len(zeros) > 1:
            raise BadInput("--method piper takes one ZeRO stage (--zero 0, 1, 2 or 3)")
        _piper(
            model_key,
            platform_name,
            nodes,
            seq,
            global_batch,
            micro_batches,
            zeros[0] if zeros else 0,
            no_flash,
            no_checkpointing,
            causal_flops,
            schedule or "1f1b",
            pp,
            ep,
            json_path,
            explain_memory,
        )
        return
    for name, v in (
        ("--no-checkpointing", no_checkpointing or None),
        ("--causal-flops", causal_flops or None),
        ("--schedule", schedule),
    ):
        if v is not None:
            raise BadInput(
                f"{name} applies to --method piper; the default method searches "
                + (
                    "--recompute"
                    if name == "--no-checkpointing"
                    else "1F1B and interleaved schedules"
                    if name == "--schedule"
                    else "with causal attention FLOPs"
                )
            )
    from moe_repro.components.resources.parallel_planner import plan_parallel

    model = load_model(model_key)
    platform = load_platform(platform_name)
    settings = None
    if framework not in (None, "auto"):
        from moe_repro.reproductions.validation import framework_memory_settings

        settings = framework_memory_settings(framework)
    try:
        pl = plan_parallel(
            model,
            platform,
            nodes,
            seq=seq,
            global_batch=global_batch,
            precision=precision or "bf16-adam",
            zero=zeros,
            recompute=modes,
            tp=tp,
            pp=pp,
            ep=ep,
            cp=cp,
            vpp=vpp,
            micro_batches=micro_batches,
            flash_attention=not no_flash,
            etp=etp,
            dropout=model.dropout if dropout is None else dropout,
            overlap_dp=not no_overlap_dp,
            fused_grad_accumulation=not unfused_grad_accumulation,
            overlap_tp=not no_overlap_tp,
            dispatcher=dispatcher or "alltoall",
            overlap_ep=overlap_ep,
            sp=sp,
            memory_kind=PLAN_MEMORY_KIND,
            memory_margin=margin,
            memory_settings=settings,
            gemm_precision=gemm_precision or "bf16",
            first_stage_layers=first_stage_layers,
            last_stage_layers=last_stage_layers,
        )
    except ValueError as e:
        raise BadInput(str(e)) from None
    if not pl.candidates:
        # a degree the user fixed that breaks a rule on its own: say what does not divide,
        # not "none fits"
        for name, value in (("tp", tp), ("ep", ep), ("pp", pp), ("cp", cp), ("etp", etp)):
            why = [
                r["reason"]
                for r in pl.rejected
                if value is not None and r["reason"].startswith(f"{name.upper()} {value}")
            ]
            if why:
                raise BadInput(f"--{name} {value}: {'; '.join(why)}")
        uneven = [r["reason"] for r in pl.rejected if r["reason"].startswith("uneven split")]
        if uneven and (first_stage_layers or last_stage_layers):
            raise BadInput(f"--first/--last-stage-layers: {uneven[0]}")
    track = step_time_track_record(platform.name) if pl.best else None
    explain = None
    if explain_memory and pl.candidates:
        c = pl.candidates[0]
        explain = format_memory(
            c.memory, c.memory_stage, _layout(c), PLAN_MEMORY_KIND, platform.hbm_bytes, margin
        )
    trust = track["line"] if track else None
    click.echo(format_parallel(pl, model.name, top, trust, explain, margin))
    if json_path:
        atomic_write_json(
            json_path,
            {
                "method": "parallel",
                **pl.to_dict(),
                "memory_kind": PLAN_MEMORY_KIND,
                "memory_margin": margin,
                "framework": framework or "auto",
                "memory_settings": settings,
                "step_time_validation": track,
            },
            make_parents=False,
        )


def step_time_track_record(platform_name: str) -> dict:
    """How far the planner's step time has held against published runs (`repro validate`'s
    step-time predictor, scored afresh: it is quick), with where it was and was not
    scored. Printed under every plan so a predicted step time never stands alone."""
    from moe_repro.reproductions.validation import track_record

    t = track_record("step-time")
    where = (
        "this platform"
        if platform_name in t["platforms"]
        else f"{', '.join(t['platforms'])} only, not this platform"
    )
    t["line"] = (
        (
            f"how far to trust the step time: scored against {t['points']} published runs "
            f"({', '.join(t['model_families'])} models, {where}), the planner came out "
            f"{t['min_error']:+.0%} to {t['max_error']:+.0%} (MAPE {t['mape']:.1%}; negative = predicted "
            f"faster than measured); see repro validate"
        )
        if t["points"]
        else "how far to trust the step time: not scored against any published run (repro validate)"
    )
    return t


def _piper(
    model_key,
    platform_name,
    nodes,
    seq,
    global_batch,
    micro_batches,
    zero_stage,
    no_flash,
    no_checkpointing,
    causal_flops,
    schedule,
    pp,
    ep,
    json_path,
    explain_memory=False,
) -> None:
    """Piper's PP x EP planner, its output unchanged (Eq. 7-10 layouts, Eq. 11 memory, MFU);
    ``explain_memory``: the terms of its best layout's binding stage, as its memory check counts
    them (live tensors + the profile's framework overhead)."""
    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.components.resources.planner import plan

    if (pp is None) != (ep is None):
        raise BadInput("--pp and --ep go together")
    model = load_model(model_key)
    platform = load_platform(platform_name)
    try:
        pl = plan(
            model,
            platform,
            nodes,
            seq=seq,
            global_batch=global_batch,
            micro_batches=micro_batches,
            zero_stage=zero_stage,
            flash=not no_flash,
            allow_checkpointing=not no_checkpointing,
            causal=causal_flops,
            schedule=schedule,
            layout=None if pp is None else (pp, ep),
        )
    except ValueError as e:
        raise BadInput(str(e)) from None
    click.echo(format_plan(pl))
    if explain_memory and pl.best:
        from moe_repro.components.resources.memory_model import MemoryOptions, all_stages

        b = pl.best
        opts = MemoryOptions(
            flash_attention=not no_flash,
            checkpointing=b.checkpointing,
            zero_stage=zero_stage,
            overhead_bytes=platform.overhead_bytes,
        )
        stages = all_stages(
            model, b.pp, b.ep, int(b.micro_batch), seq, b.micro_batches, schedule, opts
        )
        peak = max(stages, key=lambda st: st.total)
        layout = f"PP {b.pp} x EP {b.ep}, micro-batch {b.micro_batch:g}, M {b.micro_batches}"
        click.echo(format_memory(peak.to_dict(), peak.stage, layout, None, platform.hbm_bytes, 0.0))
    if json_path:
        atomic_write_json(json_path, pl.to_dict(), make_parents=False)
