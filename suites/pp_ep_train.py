"""pp-ep-train: the PP x EP (x DP) pipelined trainer over real ranks (Piper Sec. III-D, Eq. 3-5).

One grid point is one training run of components/training/pp_ep_trainer.py: ``steps`` steps of
``model`` with pipeline degree ``pp``, expert-parallel degree ``ep``, data-parallel degree
``dp`` (ranks = dp x pp x ep), ``micro_batches`` micro-batches of ``micro_batch_size``
sequences per step, by ``schedule``, on byte-level text. Set-up runs that training (the
instrumented pass, :func:`~moe_repro.components.training.pp_ep_trainer.train_rank`) and keeps
rank 0's report; the measured call is then one more training step of a freshly built copy of
the same configuration, so ``time_s`` is the wall time of one step (slowest rank).

The report's numbers become metrics (constant over repeats; their meaning is the trainer's,
see its module docstring):
  step_s, tokens_per_s         median step (slowest rank) over the steps after the first
  bubble_measured              1 - busiest rank's compute / schedule step, median over steps
  idle_fraction_mean           1 - busy / step per rank, mean over stages (imbalance included)
  mfu                          model FLOPs / (measured GEMM peak x ranks x step time)
  split_<part>_s               time split, mean over ranks (attention, experts, alltoall,
                               p2p, idle, other, grad_sync)
  stage<i>_<field>             per pipeline stage i (max over its ranks): activation_peak_bytes
                               (bytes autograd held for backward, peak over steps),
                               static_bytes (weights, grads, Adam m and v),
                               activation_per_microbatch_bytes, peak_over_mean_microbatch,
                               in_flight_at_peak (micro-batches in flight at that peak),
                               idle_fraction, peak_bytes, cuda_max_allocated_bytes (GPU runs)
  loss_step<j>                 training loss of step j (mean over shards and micro-batches)
:func:`report_of` turns a record back into the trainer's report layout.
#wrong: steps whose loss is not finite.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from moe_repro.suites.base import SEED, Metric, Param, Suite, fits_in_memory, one_of, whole

CONFIG_KEYS = (
    "model",
    "pp",
    "ep",
    "dp",
    "schedule",
    "micro_batches",
    "micro_batch_size",
    "steps",
    "lr",
    "seed",
)
SPLIT = ("attention", "experts", "alltoall", "p2p", "idle", "other", "grad_sync")
STAGE_FIELDS = (
    "activation_peak_bytes",
    "static_bytes",
    "activation_per_microbatch_bytes",
    "peak_over_mean_microbatch",
    "in_flight_at_peak",
    "idle_fraction",
    "peak_bytes",
    "cuda_max_allocated_bytes",
)
INT_FIELDS = (
    "activation_peak_bytes",
    "static_bytes",
    "in_flight_at_peak",
    "peak_bytes",
    "cuda_max_allocated_bytes",
)  # counts: integers in the trainer's report
SUMMARY = (
    "step_s",
    "tokens_per_s",
    "bubble_measured",
    "idle_fraction_mean",
    "bubble_theory",
    "mfu",
)


def train_config(params: dict):
    """The trainer's TrainConfig of a grid point; ValueError if it cannot run."""
    from moe_repro.components.training.pp_ep_trainer import TrainConfig

    cfg = TrainConfig(**{k: params[k] for k in CONFIG_KEYS})
    cfg.validate()
    return cfg


def memory_bytes(p: dict) -> float:
    """What one grid point holds at its largest, over all its local ranks (float32): every
    rank's weights, gradients and Adam state (the trainer's static_bytes_per_rank, which
    `repro train` checks too), the activations autograd keeps for the micro-batches in flight
    at once (formulas.py's count per layer and micro-batch at 4 bytes a value; the logits, their
    log-softmax and gradient on the last stage), and the global batch every rank draws."""
    from moe_repro.components.model.zoo import get_model
    from moe_repro.components.resources.formulas import moe_activation_bytes_per_layer

    cfg = train_config(p)
    mc, zoo = cfg.model_config(), get_model(cfg.model)
    v, pp, m = cfg.stages_per_rank, cfg.pp, cfg.micro_batches
    per_layer = moe_activation_bytes_per_layer(
        zoo, s=mc.seq_len, b=cfg.micro_batch_size, moe=zoo.n_moe_layers > 0, bytes_per_value=4
    )
    layers_per_chunk = -(-mc.n_layers // (pp * v))
    activations = 0.0
    for i in range(pp):  # micro-batch chunks a stage holds before its first backward
        if cfg.schedule == "gpipe":
            chunks = m
        elif cfg.schedule == "interleaved":
            chunks = min(m * v, 2 * (pp - i - 1) + (v - 1) * pp + 1)
        else:
            chunks = min(m, pp - i)
        activations += chunks * layers_per_chunk * per_layer
    last = m if cfg.schedule == "gpipe" else 1
    activations += last * 3 * 4 * cfg.micro_batch_size * mc.seq_len * mc.vocab
    batch = 2 * 8 * cfg.dp * cfg.ep * m * cfg.micro_batch_size * (mc.seq_len + 1)
    return (
        cfg.static_bytes_per_rank() * cfg.world_size
        + cfg.dp * cfg.ep * activations
        + cfg.world_size * batch
    )


def derived_params(p: dict) -> dict:
    return {"ranks": train_config(p).world_size}


def flatten_report(report: dict) -> dict:
    out = {k: float(report[k]) for k in SUMMARY}
    out.update({f"split_{k}_s": float(report["time_split_s"][k]) for k in SPLIT})
    for stage in report["per_stage"]:
        for field in STAGE_FIELDS:
            if stage[field] is not None:
                out[f"stage{stage['pp_rank']}_{field}"] = float(stage[field])
    out.update({f"loss_step{j}": float(loss) for j, loss in enumerate(report["losses"])})
    return out


def setup(params: dict, ctx) -> dict:
    import torch
    import torch.distributed as dist

    from moe_repro.components.training.pp_ep_trainer import StepRunner, build_rank, train_rank

    cfg = train_config(params)
    report = train_rank(ctx, **asdict(cfg))  # the instrumented run; the report is rank 0's
    shared = [report if ctx.rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    device = ctx.device  # the runtime's rule: cuda:LOCAL_RANK under nccl, else cpu
    torch.manual_seed(cfg.seed)
    runner = StepRunner(build_rank(cfg, device))  # a fresh copy for the timed steps
    return {
        "report": flatten_report(shared[0]),
        "losses": shared[0]["losses"],
        "runner": runner,
        "next_step": cfg.steps,
    }


def run(state: dict) -> None:
    state["runner"].step(state["next_step"])
    state["next_step"] += 1


def derive(params: dict, state: dict, time_s: float) -> dict:
    return dict(state["report"])


def check(state: dict) -> int:
    return sum(1 for loss in state["losses"] if not math.isfinite(loss))


def report_of(record: dict) -> dict:
    """The trainer's report layout (the keys piper-eq4 and piper-bubble read) from a record."""
    cfg = train_config(record)
    per_stage = []
    for p in range(cfg.pp):
        stage = {"pp_rank": p, "stages": [p + v * cfg.pp for v in range(cfg.stages_per_rank)]}
        for f in STAGE_FIELDS:
            value = record.get(f"stage{p}_{f}")
            stage[f] = int(value) if f in INT_FIELDS and value is not None else value
        per_stage.append(stage)
    return {
        **{k: record[k] for k in SUMMARY},
        "per_stage": per_stage,
        "time_split_s": {k: record[f"split_{k}_s"] for k in SPLIT},
        "losses": [record[f"loss_step{j}"] for j in range(cfg.steps)],
        "config": asdict(cfg),
        "model_config": asdict(cfg.model_config()),
    }


def _known_model(key: str) -> None:
    from moe_repro.components.model.zoo import get_model

    try:
        get_model(key)
    except KeyError as e:
        raise ValueError(str(e).strip("'\"")) from None


SUITE = Suite(
    name="pp-ep-train",
    schema={
        "model": Param(str, check=_known_model, bad=("nosuch",)),
        "pp": whole(1, 64),
        "ep": whole(1, 1024),
        "dp": whole(1, 1024),
        "schedule": one_of("1f1b", "gpipe", "interleaved"),
        "micro_batches": whole(1, 1024),
        "micro_batch_size": whole(1, 1024),
        "steps": whole(1, 10**5),
        "lr": Param(float, 1e-12, 10.0),
        "seed": SEED,
        "backend": one_of("gloo", "nccl"),
    },
    rules=(
        fits_in_memory(
            memory_bytes,
            {"model": "gpt3-175b"},
            what="weights, gradients, Adam state, activations and batch",
        ),
    ),
    params={
        "model": ["tiny-moe"],
        "pp": [2],
        "ep": [1],
        "dp": [1],
        "schedule": ["1f1b"],
        "micro_batches": [4],
        "micro_batch_size": [2],
        "steps": [4],
        "lr": [1e-3],
        "seed": [0],
        "backend": ["gloo"],
    },
    quick={"steps": [2]},
    derived_params=derived_params,
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    world_params=("ranks", "backend"),
    table_keys=("model", "pp", "ep", "dp", "schedule", "micro_batches"),
    table_metrics=("time_s", "bubble_measured", "tokens_per_s"),
    metrics=[
        Metric("step_s", "s", "lower", description="median training step of the run, slowest rank"),
        Metric("tokens_per_s", "tokens/s", "higher", description="tokens per step / step_s"),
        Metric(
            "bubble_measured",
            "fraction",
            "lower",
            description="1 - busiest rank's compute / schedule step, median over steps",
        ),
        Metric(
            "idle_fraction_mean",
            "fraction",
            "lower",
            description="1 - busy / step per rank, mean over stages",
        ),
        Metric(
            "bubble_theory",
            "fraction",
            "none",
            kind="analytic",
            description="(PP-1)/(vM+PP-1) for equal stages",
        ),
        Metric("mfu", "fraction", "higher", description="model FLOPs utilisation (Piper Eq. 12)"),
        Metric(
            "stage0_activation_peak_bytes",
            "B",
            "lower",
            description="first stage's peak bytes held for backward (stage<i>_* for the others)",
        ),
        Metric(
            "loss_step0",
            "nats/token",
            "none",
            description="loss of the first step (loss_step<j> for the others)",
        ),
    ],
    param_help={
        "model": "zoo key (byte-level vocabulary)",
        "pp": "pipeline stages (ranks)",
        "ep": "expert-parallel degree",
        "dp": "data-parallel degree",
        "schedule": "1f1b, gpipe or interleaved",
        "micro_batches": "M, micro-batches per step",
        "micro_batch_size": "sequences per micro-batch",
        "steps": "steps of the run",
        "lr": "AdamW learning rate",
        "seed": "weights and data seed",
        "backend": "gloo (CPU) or nccl (GPUs)",
    },
)
