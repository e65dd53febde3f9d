"""Figures stay readable with many series: no two series share a colour and line style, and a
long legend sits beside the axes (issue 16; piper-fig8's cost-model figure has 12 series)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from moe_repro.reports import figures


def test_twelve_series_are_twelve_distinct_styles(monkeypatch):
    drawn = []
    real_close = plt.close

    def keep(f):  # look at the figure before it is closed
        drawn.append([(line.get_color(), line.get_linestyle()) for line in f.axes[0].get_lines()])
        real_close(f)

    monkeypatch.setattr(figures.plt, "close", keep)
    series = [{"label": f"s{i}", "x": [1, 2, 4], "y": [i, i + 1, i + 2]} for i in range(12)]
    out = figures.render_figure({"series": series, "xlabel": "nodes", "ylabel": "x", "title": "t",
                                 "xscale": "log"})
    assert out["png"].startswith(b"\x89PNG")
    (styles,) = drawn
    assert len(styles) == 12 and len(set(styles)) == 12
