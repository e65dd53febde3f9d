"""``repro train``: the PP x EP (x DP) pipelined MoE trainer (Piper Sec. III-D), for real.

Launches its own gloo ranks on this machine unless it was started by torchrun / srun / mpirun,
in which case it joins that world (NCCL when a GPU is present) and rank 0 reports.
"""

from __future__ import annotations

import click

from moe_repro.cli.finite import FiniteFloatRange
from moe_repro.cli.errors import BadInput, OutputFile, RunFailure

# fp32 end to end: distributed and single-process gradients agree to rounding (summation order).
REFERENCE_TOLERANCE = 1e-5


class LayerAllToAllChoice(click.Choice):
    """The registered all-to-all algorithms (each one's dispatcher trains), read from the
    registry when the option is parsed or its help shown (importing it at startup would load
    torch for every command)."""

    def __init__(self):
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        from moe_repro.components.alltoall import algorithm_names

        return tuple(algorithm_names())

    @choices.setter
    def choices(self, _ignored) -> None:
        pass  # click.Choice.__init__ assigns a fixed tuple; the registry stays the source


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def format_report(r: dict) -> str:
    c = r["config"]
    lines = [
        f"train {c['model']}: PP={c['pp']} EP={c['ep']} DP={c['dp']} schedule={c['schedule']} "
        f"all-to-all={c.get('alltoall', 'flat')} "
        f"M={c['micro_batches']} x {c['micro_batch_size']} seq, {r['world_size']} ranks "
        f"({r['backend']}, {r['device']})"
    ]
    for i, loss in enumerate(r["losses"]):
        ref = f"  reference {r['reference_losses'][i]:.6f}" if "reference_losses" in r else ""
        lines.append(f"  step {i}: loss {loss:.6f}{ref}")
    lines.append(
        f"  tokens/s {r['tokens_per_s']:.0f} (median step {r['step_s'] * 1e3:.1f} ms over "
        f"{len(r['step_s_all'])} timed steps; MFU {r['mfu']:.2%} of the measured GEMM peak)"
    )
    lines.append(
        f"  bubble measured {r['bubble_measured']:.3f} (1 - busiest rank's compute / "
        f"schedule time), (PP-1)/(vM+PP-1) = {r['bubble_theory']:.3f}; idle fraction "
        f"incl. stage imbalance, mean over stages {r['idle_fraction_mean']:.3f}"
    )
    for s in r["per_stage"]:
        lines.append(
            f"  stage {s['pp_rank']}: activation peak {_mib(s['activation_peak_bytes'])}, "
            f"static {_mib(s['static_bytes'])}, idle fraction {s['idle_fraction']:.3f}"
        )
    split = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in r["time_split_s"].items())
    lines.append(f"  time split per step, ms (mean over ranks): {split}")
    if "reference_max_abs_diff" in r:
        lines.append(
            f"  reference_max_abs_diff {r['reference_max_abs_diff']:.3g} (grads "
            f"{r['reference_max_abs_diff_grads']:.3g}, losses "
            f"{r['reference_max_abs_diff_losses']:.3g})"
        )
    return "\n".join(lines)


def _check_fits_in_memory(cfg, launched: bool) -> None:
    """Refuse a local run whose weights and optimizer state alone exceed this machine's memory
    (under an external launcher the world may span GPUs and nodes: not checked here)."""
    import os

    if launched:
        return
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return
    need = cfg.static_bytes_per_rank() * cfg.world_size
    if need > 0.5 * physical:
        raise BadInput(
            f"{cfg.model} needs ~{need / 2**30:.1f} GiB of weights, gradients and Adam "
            f"state over {cfg.world_size} ranks, more than half of this machine's "
            f"{physical / 2**30:.0f} GiB; use --layers N, or run under torchrun on GPUs"
        )


@click.command("train")
@click.option("--model", default="tiny-moe", show_default=True, help="Model zoo key.")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline stages.")
@click.option(
    "--ep", type=int, default=1, show_default=True, help="Expert-parallel ranks per stage."
)
@click.option(
    "--dp", type=int, default=1, show_default=True, help="Data-parallel replicas (outside)."
)
@click.option(
    "--schedule",
    type=click.Choice(["1f1b", "gpipe", "interleaved"]),
    default="1f1b",
    show_default=True,
)
@click.option("--micro-batches", type=int, default=4, show_default=True, help="M per step.")
@click.option(
    "--micro-batch-size",
    type=int,
    default=2,
    show_default=True,
    help="Sequences per micro-batch per pipeline.",
)
@click.option("--steps", type=int, default=4, show_default=True)
@click.option("--seq-len", type=int, default=None, help="Default: the zoo's value for the model.")
@click.option("--layers", "n_layers", type=int, default=None, help="Override the layer count.")
@click.option(
    "--virtual-stages",
    type=int,
    default=2,
    show_default=True,
    help="Stages per rank for --schedule interleaved.",
)
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option(
    "--aux-loss-coef",
    type=float,
    default=0.01,
    show_default=True,
    help="Router load-balancing loss weight (Switch Transformer).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--checkpoint/--no-checkpoint",
    default=False,
    show_default=True,
    help="Activation checkpointing of every transformer block.",
)
@click.option(
    "--alltoall",
    type=LayerAllToAllChoice(),
    default="flat",
    show_default=True,
    help="Expert dispatcher inside each stage's EP group (halo: Piper Sec. V; rbd: "
    "X-MoE Sec. 4.2).",
)
@click.option(
    "--ranks-per-node",
    type=int,
    default=None,
    help="Emulated node size of a local launch (default: one node); HALO's phases "
    "and RBD's pilots follow it.",
)
@click.option(
    "--check-reference",
    is_flag=True,
    help="Also run the same steps in one process and report reference_max_abs_diff.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloatRange(1),
    default=600.0,
    show_default=True,
    help="Kill every rank and fail if the run takes longer (s).",
)
@click.option(
    "--json",
    "json_path",
    type=OutputFile(),
    default=None,
    help="Write the report (losses, tokens_per_s, per_stage, bubble, time split, MFU).",
)
def command(
    model,
    pp,
    ep,
    dp,
    schedule,
    micro_batches,
    micro_batch_size,
    steps,
    seq_len,
    n_layers,
    virtual_stages,
    lr,
    aux_loss_coef,
    seed,
    checkpoint,
    alltoall,
    ranks_per_node,
    check_reference,
    timeout_s,
    json_path,
) -> None:
    """Train an MoE transformer with PP x EP (x DP) and a pipeline schedule, on real text.

    Reports the loss of every step, tokens/s, per-stage peak memory (Piper Eq. 4), the measured
    pipeline bubble next to (PP-1)/(M+PP-1), the time split (attention, experts, all-to-all,
    P2P, idle) and estimated MFU. Example:

      repro train --model tiny-moe --pp 2 --ep 2 --steps 4 --check-reference --json t.json
    """
    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.components.training.pp_ep_trainer import TrainConfig, launch_training, train_rank
    from moe_repro.records.environment import collect_environment
    from moe_repro.runtime.launch import RankFailure, init_launched_world, launched_world_size

    cfg = TrainConfig(
        model=model,
        pp=pp,
        ep=ep,
        dp=dp,
        schedule=schedule,
        micro_batches=micro_batches,
        micro_batch_size=micro_batch_size,
        steps=steps,
        seq_len=seq_len,
        n_layers=n_layers,
        virtual_stages=virtual_stages,
        lr=lr,
        aux_loss_coef=aux_loss_coef,
        seed=seed,
        checkpoint=checkpoint,
        alltoall=alltoall,
        ranks_per_node=ranks_per_node,
        check_reference=check_reference,
    )
    try:
        cfg.validate()
    except (ValueError, KeyError) as e:
        raise BadInput(str(e).strip("'\"")) from None
    launched = launched_world_size()
    _check_fits_in_memory(cfg, launched=bool(launched))
    if not launched:
        from moe_repro.runtime.launch import local_rank_limit

        limit, why = local_rank_limit()
        if cfg.world_size > limit:  # refused before any rank starts
            raise BadInput(
                f"dp x pp x ep = {cfg.world_size} local ranks; this machine runs at most "
                f"{limit} ({why}); start a larger world with torchrun, mpiexec or srun"
            )
    if launched:
        from moe_repro.runtime.device import auto_backend

        if launched != cfg.world_size:
            raise BadInput(
                f"the launcher started {launched} ranks; dp x pp x ep = {cfg.world_size}"
            )
        from moe_repro.runtime.worker import watch_launched_world

        # no supervisor of ours watches a launched world's ranks: each ends itself past --timeout
        # or when a peer on its node stops making progress
        watch = watch_launched_world(timeout_s)
        ctx = init_launched_world(
            auto_backend(launched)[0] or "gloo"
        )  # nccl when every rank has a GPU
        report = train_rank(ctx, **cfg.__dict__)
        watch.finish()
        if ctx.rank != 0:
            return
    else:
        try:
            report = launch_training(cfg, timeout_s=timeout_s)
        except RankFailure as e:
            raise RunFailure(str(e)) from None
    report["environment"] = collect_environment()
    click.echo(format_report(report))
    if json_path:
        atomic_write_json(json_path, report, make_parents=False)
    if check_reference and report["reference_max_abs_diff"] > REFERENCE_TOLERANCE:
        raise RunFailure(
            f"reference_max_abs_diff {report['reference_max_abs_diff']:.3g} > "
            f"{REFERENCE_TOLERANCE:g}: the distributed run differs from one process"
        )
