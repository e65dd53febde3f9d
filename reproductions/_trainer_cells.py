"""Shared by piper-eq4 and piper-bubble: a cell whose "paper" value is one of Piper's formulas
evaluated at the run's configuration (the paper prints the formula, not numbers for our shapes),
and the trainer launch both reproductions use."""

from __future__ import annotations

from moe_repro.reproductions.spec import Cell, PaperValue, Tolerance, verdict_for


def formula_cell(row: str, column: str, ours: float | None, unit: str, formula_value: float,
                 printed: str, source: str, tolerance: Tolerance, note: str | None = None) -> Cell:
    """Compare ``ours`` with a formula of the paper evaluated for this run (``printed`` is how we
    write the evaluated value, ``source`` names the equation and the values put in)."""
    pv = PaperValue(row, column, printed, unit, source)
    verdict = verdict_for(pv, ours, tolerance)
    deviation = (ours - formula_value) / formula_value if ours is not None and formula_value else None
    return Cell(row=row, column=column, paper=formula_value, ours=ours, unit=unit, verdict=verdict,
                note=note, paper_printed=printed, paper_unit=unit, paper_source=source,
                deviation=deviation)


def run_trainer(**config) -> dict:
    """One real training run (its own gloo ranks); rank 0's report. Bad configs: ValueError."""
    from moe_repro.components.training.pp_ep_trainer import TrainConfig, launch_training

    timeout_s = float(config.pop("timeout_s", 600))
    cfg = TrainConfig(**config)
    cfg.validate()
    return launch_training(cfg, timeout_s=timeout_s)
