"""Category axes: a range the paper states for one category is drawn (a band over one x has no
width), and category names that would run into each other are tilted while short ones stay level."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.collections import LineCollection, PolyCollection

from moe_repro.reports import figures


def _keep(monkeypatch) -> list:
    """The axes of each figure drawn, looked at before it is closed."""
    drawn = []
    real_close = plt.close

    def keep(f):
        ax = f.axes[0]
        drawn.append(
            {
                "spans": [c for c in ax.collections if isinstance(c, LineCollection)],
                "bands": [c for c in ax.collections if isinstance(c, PolyCollection)],
                "rotations": [t.get_rotation() for t in ax.get_xticklabels() if t.get_text()],
                "ylim": ax.get_ylim(),
            }
        )
        real_close(f)

    monkeypatch.setattr(figures.plt, "close", keep)
    return drawn


def test_a_range_over_one_category_is_a_vertical_span(monkeypatch):
    drawn = _keep(monkeypatch)
    fig = {
        "title": "t",
        "xlabel": "method",
        "ylabel": "%",
        "series": [
            {
                "label": "ours",
                "x": ["A", "B", "C"],
                "y": [0.5, 40.0, 0.0],
                "kind": "ours",
                "line": False,
            },
            {"label": "C: < 1%", "x": ["C"], "lo": 0.0, "hi": 1.0, "kind": "paper-range"},
        ],
    }
    svg = figures.render_figure(fig)["svg"].decode()
    (d,) = drawn
    assert not d["bands"]
    (span,) = d["spans"]
    (seg,) = span.get_segments()
    assert seg[0][0] == seg[1][0] == 2  # at category "C", the third
    assert sorted([seg[0][1], seg[1][1]]) == [0.0, 1.0]
    assert "C: &lt; 1% (paper)" in svg or "C: < 1% (paper)" in svg  # in the legend


def test_a_range_over_several_x_stays_a_band(monkeypatch):
    drawn = _keep(monkeypatch)
    fig = {
        "title": "t",
        "xlabel": "nodes",
        "ylabel": "x",
        "series": [
            {"label": "ours", "x": [8, 16, 64], "y": [1.0, 2.0, 3.0], "kind": "ours"},
            {
                "label": "1.1x - 9x",
                "x": [16, 64],
                "y": [1.1, 9.0],
                "lo": 1.1,
                "hi": 9.0,
                "kind": "paper-range",
            },
        ],
    }
    figures.render_figure(fig)
    (d,) = drawn
    assert len(d["bands"]) == 1 and not d["spans"]


def test_long_category_names_are_tilted_and_short_ones_stay_level(monkeypatch):
    drawn = _keep(monkeypatch)
    long_names = [f"a rather long stage name number {i}" for i in range(6)]
    for names in (["A", "B", "C"], long_names):
        figures.render_figure(
            {
                "title": "t",
                "xlabel": "stage",
                "ylabel": "ms",
                "series": [{"label": "s", "x": names, "y": [1.0] * len(names)}],
            }
        )
    short, crowded = drawn
    assert set(short["rotations"]) == {0.0}
    assert set(crowded["rotations"]) == {30.0}


def test_numeric_axes_are_never_tilted(monkeypatch):
    drawn = _keep(monkeypatch)
    figures.render_figure(
        {
            "title": "t",
            "xlabel": "bytes",
            "ylabel": "s",
            "series": [{"label": "s", "x": list(range(1, 60)), "y": [1.0] * 59}],
        }
    )
    assert set(drawn[0]["rotations"]) == {0.0}
