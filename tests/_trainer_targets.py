"""Rank targets for tests/test_trainer.py (several trainer configs in one world of ranks)."""

from __future__ import annotations

import torch

from moe_repro.components.training.pp_ep_trainer import (
    StepRunner,
    TrainConfig,
    build_rank,
    named_grads,
    train_rank,
)


def train_several(ctx, configs: list[dict]) -> list[dict]:
    """Run each config's training (with its reference check) one after another in this world."""
    return [train_rank(ctx, **config) for config in configs]


def schedule_gradients_differ(ctx, config: dict, schedules: list[str], steps: int) -> dict:
    """Train the same config under each schedule; max |grad difference| against the first one,
    over every parameter this rank holds and every step (the optimizer steps in between)."""
    grads = {}
    losses = {}
    for schedule in schedules:
        cfg = TrainConfig(**{**config, "schedule": schedule})
        state = build_rank(cfg, torch.device("cpu"))
        runner = StepRunner(state)
        grads[schedule], losses[schedule] = [], []
        for step in range(steps):
            losses[schedule].append(runner.step(step, optimizer_step=False)["loss"])
            grads[schedule].append(named_grads(state))
            state.optimizer.step()
    first = schedules[0]
    worst = 0.0
    for other in schedules[1:]:
        for a, b in zip(grads[first], grads[other]):
            assert a.keys() == b.keys()
            for name in a:
                worst = max(worst, (a[name][1] - b[name][1]).abs().max().item())
    return {
        "max_abs_diff": ctx.all_reduce_max(worst),
        "losses": losses,
        "n_params": len(grads[first][0]),
    }


def train_then_compare_schedules(ctx, configs: list[dict], compare: dict) -> dict:
    """Both of the above in one world (one launch: rank start-up dominates small runs)."""
    return {
        "reports": train_several(ctx, configs),
        "schedules": schedule_gradients_differ(ctx, **compare),
    }
