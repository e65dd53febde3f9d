"""Shared by piper-eq4 and piper-bubble: a cell whose "paper" value is one of Piper's formulas
evaluated at the run's configuration (the paper prints the formula, not numbers for our shapes),
and the training runs both reproductions measure (suite pp-ep-train)."""

from __future__ import annotations

from moe_repro.reproductions.spec import Cell, PaperValue, grade_of


def formula_cell(
    row: str,
    column: str,
    ours: float | None,
    unit: str,
    formula_value: float,
    printed: str,
    source: str,
    grade_class: str,
    note: str | None = None,
) -> Cell:
    """Compare ``ours`` with a formula of the paper evaluated for this run (``printed`` is how we
    write the evaluated value, ``source`` names the equation and the values put in), graded by
    the policy's ``grade_class`` (records/grading.py)."""
    pv = PaperValue(row, column, printed, unit, source)
    verdict = grade_of(pv, ours, grade_class)
    deviation = (
        (ours - formula_value) / formula_value if ours is not None and formula_value else None
    )
    return Cell(
        row=row,
        column=column,
        paper=formula_value,
        ours=ours,
        unit=unit,
        verdict=verdict,
        note=note,
        paper_printed=printed,
        paper_unit=unit,
        paper_source=source,
        deviation=deviation,
        grade_class=grade_class,
    )


def run_trainers(configs: list[dict], timeout_s: float = 600.0) -> list[dict]:
    """One real training run per config (suite pp-ep-train; runs of the same world share one
    launch); the trainer's report of each, in the order of ``configs``. Bad configs: ValueError.
    Config keys left out take the trainer's defaults."""
    from dataclasses import asdict

    from moe_repro.components.training.pp_ep_trainer import TrainConfig
    from moe_repro.reproductions.suite_runs import pick, run_grid
    from moe_repro.suites.pp_ep_train import CONFIG_KEYS, report_of

    defaults = {k: v for k, v in asdict(TrainConfig()).items() if k in CONFIG_KEYS}
    points = [{**defaults, **c, "backend": "gloo"} for c in configs]
    # timeout_s bounds one training run; one world runs every config of its size
    records = run_grid("pp-ep-train", points, repeats=1, timeout_s=float(timeout_s) * len(points))
    return [report_of(pick(records, **{k: p[k] for k in CONFIG_KEYS})) for p in points]
