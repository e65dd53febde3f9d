"""``repro plan``: PP x EP candidates for a model on a platform (Piper Sec. III-C, IV-C)."""

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
    from moe_repro.components.model.zoo import get_model

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
        rows.append([str(c.pp), str(c.ep), str(c.micro_batches), f"{c.micro_batch:g}",
                     _gb(c.peak_bytes) if c.peak_bytes else "-", str(c.peak_stage),
                     "yes" if c.checkpointing else "no",
                     f"{e.bubble:.1%}" if e else "-",
                     f"{(e.alltoall_s + e.p2p_s) * 1e3:.1f}" if e else "-",
                     f"{e.step_s:.2f}" if e else "-",
                     f"{e.tflops_per_gpu:.1f}" if e else "-",
                     f"{e.mfu:.1%}" if e else "-",
                     "yes" if c.feasible else "no", c.why_not or ""])
    head = (f"plan: {pl.model} on {pl.platform}, {pl.nodes} nodes = {pl.gpus} GPUs, seq {pl.seq}, "
            f"global batch {pl.global_batch}")
    out = [head, table(["pp", "ep", "M", "mb/gpu", "peak GB", "stage", "ckpt", "bubble",
                        "comm ms/mb", "step s", "TFLOPS/gpu", "MFU", "feasible", "why not"], rows)]
    if pl.rejected:
        out.append("rejected (Eq. 8-10):")
        out += [f"  pp={r['pp']} ep={r['ep']}: {r['why_not']}" for r in pl.rejected]
    out.append("assumptions:")
    out += [f"  - {a}" for a in pl.assumptions]
    best = pl.best
    out.append(f"best: pp={best.pp} ep={best.ep} (estimated MFU {best.estimate.mfu:.1%})" if best
               else "best: none fits; add nodes, enable ZeRO (--zero 1) or shorten --seq")
    return "\n".join(out)


@click.command("plan", short_help="Rank memory-feasible PP x EP layouts for a model on a platform.")
@click.option("--model", "model_key", required=True, help="Model zoo key, e.g. deepseek-v3.")
@click.option("--platform", "platform_name", required=True,
              help="Built-in profile (frontier, dgx-h100, h200, local) or a profile JSON file.")
@click.option("--nodes", type=int, required=True, help="Number of nodes (n in Eq. 7).")
@click.option("--seq", type=int, default=4096, show_default=True, help="Sequence length (tokens).")
@click.option("--global-batch", type=int, default=None,
              help="Sequences per step (default 4 x GPUs: 1 per GPU per micro-batch, M = 4 PP).")
@click.option("--micro-batches", type=int, default=None, help="Micro-batches per step M (default 4 x PP).")
@click.option("--zero", "zero_stage", type=click.IntRange(0, 3), default=0, show_default=True,
              help="ZeRO stage for the state replicated over the EP group.")
@click.option("--no-flash", is_flag=True, help="Materialised attention scores (4 b H s^2).")
@click.option("--no-checkpointing", is_flag=True, help="Never fall back to activation checkpointing.")
@click.option("--causal-flops", is_flag=True, help="Halve attention FLOPs for the causal mask.")
@click.option("--schedule", type=click.Choice(["1f1b", "gpipe"]), default="1f1b", show_default=True)
@click.option("--pp", type=int, default=None, help="Evaluate only this pipeline degree (with --ep).")
@click.option("--ep", type=int, default=None, help="Evaluate only this expert-parallel degree (with --pp).")
@click.option("--json", "json_path", type=OutputFile(), default=None,
              help="Write the plan (candidates, rejected, assumptions) to this file.")
def command(model_key, platform_name, nodes, seq, global_batch, micro_batches, zero_stage, no_flash,
            no_checkpointing, causal_flops, schedule, pp, ep, json_path) -> None:
    """Enumerate PP x EP layouts (Eq. 7-10), reject those that do not fit in HBM (Eq. 11, binding
    term named), and rank the rest by estimated MFU (Eq. 12).

    Example: repro plan --model deepseek-v3 --platform frontier --nodes 64 --json p.json
    """
    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.components.resources.planner import plan

    for name, v in (("--nodes", nodes), ("--seq", seq), ("--global-batch", global_batch),
                    ("--micro-batches", micro_batches), ("--pp", pp), ("--ep", ep)):
        if v is not None and v <= 0:
            raise BadInput(f"{name} must be positive, got {v}")
    if (pp is None) != (ep is None):
        raise BadInput("--pp and --ep go together")
    model = load_model(model_key)
    platform = load_platform(platform_name)
    try:
        pl = plan(model, platform, nodes, seq=seq, global_batch=global_batch, micro_batches=micro_batches,
                  zero_stage=zero_stage, flash=not no_flash, allow_checkpointing=not no_checkpointing,
                  causal=causal_flops, schedule=schedule, layout=None if pp is None else (pp, ep))
    except ValueError as e:
        raise BadInput(str(e)) from None
    click.echo(format_plan(pl))
    if json_path:
        atomic_write_json(json_path, pl.to_dict())
