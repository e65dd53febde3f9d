"""Bars are lengths from zero, and a log axis has no zero: a bar figure asked for on a log axis is
drawn as dots at the bars' places (issue 51: a 4.4x ratio looked like 30x on log bars), and a
stacked one stays on a linear axis."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
from matplotlib.patches import Rectangle

from moe_repro.reports import figures


@pytest.fixture
def drawn(monkeypatch) -> list:
    kept = []
    real_close = plt.close

    def keep(f):
        f.canvas.draw()
        kept.append(f)

    monkeypatch.setattr(figures.plt, "close", keep)
    yield kept
    for f in kept:
        real_close(f)


def bars(form: str, yscale: str) -> dict:
    return {
        "form": form,
        "title": "t",
        "xlabel": "model",
        "ylabel": "time [ms]",
        "yscale": yscale,
        "series": [
            {"label": "ours", "x": ["a", "b", "c"], "y": [1.0, 4.4, 300.0]},
            {"label": "ours", "kind": "paper", "x": ["a", "b", "c"], "y": [1.1, 4.0, 280.0]},
        ],
    }


def _bar_patches(ax) -> list:
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() > 0]


def test_bars_on_a_log_axis_become_dots(drawn):
    figures.render_figure(bars("bars", "log"))
    ax = drawn[-1].axes[0]
    assert ax.get_yscale() == "log"
    assert _bar_patches(ax) == []  # no bar on the log axis
    dots = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert len(dots) == 2 and sorted(len(d.get_xdata()) for d in dots) == [3, 3]
    # the paper's dots are hollow, ours filled, in one colour
    faces = sorted(str(d.get_markerfacecolor()) for d in dots)
    assert "white" in faces


def test_bars_on_a_linear_axis_stay_bars_and_stacked_bars_refuse_log(drawn):
    figures.render_figure(bars("bars", "linear"))
    assert len(_bar_patches(drawn[-1].axes[0])) == 6
    figures.render_figure(bars("stacked-bars", "log"))
    ax = drawn[-1].axes[0]
    assert ax.get_yscale() == "linear" and len(_bar_patches(ax)) == 6
