"""Figures in the paper's form and readable: bars where the paper has bars, stacked where it stacks,
OOM where it prints OOM; the legend never covers data; identical points do not hide each other;
colour encodes one factor and line style the other; categories are never joined by lines.

Each test draws a small figure and looks at what matplotlib laid out (in display coordinates),
not at the renderer's own decisions."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgba
from matplotlib.patches import Rectangle

from moe_repro.reports import figures


@pytest.fixture
def drawn(monkeypatch) -> list:
    """Each figure drawn, kept open until the test has looked at it."""
    kept = []
    real_close = plt.close

    def keep(f):
        f.canvas.draw()
        kept.append(f)

    monkeypatch.setattr(figures.plt, "close", keep)
    yield kept
    for f in kept:
        real_close(f)


def _bars(ax) -> list[Rectangle]:
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() > 0]


MODELS = ["Mixtral 8x7B", "Mixtral 8x22B", "Llama 4 Scout"]


def test_bars_are_grouped_per_category_with_the_papers_bars_hatched_in_ours_colour(drawn):
    figures.render_figure(
        {
            "title": "t",
            "xlabel": "model",
            "ylabel": "TFLOP/s",
            "form": "bars",
            "series": [
                {"label": "TFLOPS", "x": MODELS, "y": [100.0, 55.0, 20.0]},
                {"label": "TFLOPS", "kind": "paper", "x": MODELS, "y": [102.8, 55.4, 74.2]},
            ],
        }
    )
    (f,) = drawn
    ax = f.axes[0]
    bars = _bars(ax)
    assert len(bars) == 6
    assert [t.get_text() for t in ax.get_xticklabels()] == MODELS
    # one pair per category, side by side around the category's tick
    centres = sorted(b.get_x() + b.get_width() / 2 for b in bars)
    for i in range(3):
        pair = centres[2 * i : 2 * i + 2]
        assert pair[0] < i < pair[1]
    ours = [b for b in bars if not b.get_hatch()]
    paper = [b for b in bars if b.get_hatch()]
    assert len(ours) == 3 and len(paper) == 3
    # the paper's bar is outlined in ours' colour, not filled with it
    assert paper[0].get_edgecolor()[:3] == pytest.approx(ours[0].get_facecolor()[:3])
    assert paper[0].get_facecolor() != ours[0].get_facecolor()
    assert sorted(b.get_height() for b in paper) == pytest.approx([55.4, 74.2, 102.8])


def test_stacked_bars_stack_the_series_with_ours_and_the_papers_side_by_side(drawn):
    cats = ["DeepSpeed", "X-MoE"]
    figures.render_figure(
        {
            "title": "t",
            "xlabel": "method",
            "ylabel": "time (ms)",
            "form": "stacked-bars",
            "series": [
                {"label": "gating", "x": cats, "y": [3.0, 1.0]},
                {"label": "dispatch", "x": cats, "y": [5.0, 2.0]},
                {"label": "gating", "kind": "paper", "x": cats, "y": [2.5, 0.8]},
                {"label": "dispatch", "kind": "paper", "x": cats, "y": [6.0, 2.2]},
            ],
        }
    )
    (f,) = drawn
    bars = _bars(f.axes[0])
    assert len(bars) == 8
    columns: dict = {}
    for b in bars:
        columns.setdefault(round(b.get_x(), 6), []).append(b)
    assert len(columns) == 4  # ours and the paper's, per category
    for stack in columns.values():
        stack.sort(key=lambda b: b.get_y())
        assert stack[0].get_y() == 0
        assert stack[1].get_y() == pytest.approx(stack[0].get_height())  # on top of the first
    tops = sorted(stack[1].get_y() + stack[1].get_height() for stack in columns.values())
    assert tops == pytest.approx([3.0, 3.0, 8.0, 8.5])


def test_an_oom_point_is_an_empty_slot_labelled_oom(drawn):
    figures.render_figure(
        {
            "title": "t",
            "xlabel": "model",
            "ylabel": "TFLOP/s",
            "form": "bars",
            "series": [
                {"label": "ours", "x": MODELS, "y": [10.0, None, 30.0], "oom": ["Mixtral 8x22B"]},
                {"label": "ours", "kind": "paper", "x": MODELS, "y": [11.0, 12.0, None]},
            ],
        }
    )
    (f,) = drawn
    ax = f.axes[0]
    labels = [t for t in ax.texts if t.get_text() == "OOM"]
    assert len(labels) == 1  # the paper's missing bar is not OOM: it lists no oom
    x = labels[0].get_position()[0]
    assert 0.5 < x < 1.5  # in Mixtral 8x22B's group
    assert all(not (b.get_x() <= x <= b.get_x() + b.get_width()) for b in _bars(ax))  # empty slot


def _data_points(ax, samples: int = 30) -> np.ndarray:
    """Display coordinates of everything drawn as data: line vertices and points along each
    drawn segment, and the corners and centres of bars."""
    pts = []
    for line in ax.lines:
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        xy = xy[np.isfinite(xy).all(axis=1)]
        pts.append(xy)
        if line.get_linestyle() not in ("None", "none", "", " ") and len(xy) > 1:
            t = np.linspace(0, 1, samples)[:, None]
            for a, b in zip(xy, xy[1:]):
                pts.append(a + t * (b - a))
    for b in _bars(ax):
        e = b.get_window_extent()
        pts.append(
            np.array(
                [
                    [e.x0, e.y0],
                    [e.x1, e.y1],
                    [e.x0, e.y1],
                    [e.x1, e.y0],
                    [(e.x0 + e.x1) / 2, (e.y0 + e.y1) / 2],
                ]
            )
        )
    return np.vstack(pts)


def _inside(box, pts) -> int:
    return int(
        (
            (pts[:, 0] >= box.x0)
            & (pts[:, 0] <= box.x1)
            & (pts[:, 1] >= box.y0)
            & (pts[:, 1] <= box.y1)
        ).sum()
    )


@pytest.mark.parametrize(
    "series",
    [
        # an X across the plot and lines along its top and bottom: no corner is empty
        [
            {"label": "up", "x": [0, 10], "y": [0, 10]},
            {"label": "down", "x": [0, 10], "y": [10, 0]},
            {"label": "top", "x": [0, 10], "y": [9.6, 9.6]},
            {"label": "floor", "x": [0, 10], "y": [0.4, 0.4]},
        ],
        # one line rising from the lower left: the upper left is empty
        [
            {"label": "a", "x": [1, 2, 3, 4], "y": [1, 2, 4, 8]},
            {"label": "a", "kind": "paper", "x": [4], "y": [8.2]},
        ],
        # a paper point in the upper left, where a legend used to sit (piper-fig13)
        [
            {"label": "ours", "x": [1, 2, 3], "y": [1, 1.5, 2]},
            {"label": "other", "kind": "paper", "x": [1], "y": [9.0]},
            {"label": "more", "kind": "paper", "x": [3], "y": [9.5]},
        ],
        # five series filling the plot from bottom to top: no place inside is free
        [
            {
                "label": f"level {i}",
                "x": list(range(11)),
                "y": [2.0 * i + (k % 2) for k in range(11)],
            }
            for i in range(5)
        ],
        # a dozen series: the legend goes outside the axes
        [{"label": f"s{i}", "x": [1, 2, 4], "y": [i, i + 1, i + 2]} for i in range(12)],
    ],
)
def test_the_legend_never_covers_data(drawn, series):
    figures.render_figure({"title": "t", "xlabel": "x", "ylabel": "y", "series": series})
    (f,) = drawn
    ax = f.axes[0]
    legend = ax.get_legend()
    assert legend is not None
    box = legend.get_window_extent()
    assert _inside(box, _data_points(ax)) == 0


def test_the_legend_of_bars_never_covers_a_bar(drawn):
    figures.render_figure(
        {
            "title": "t",
            "xlabel": "model",
            "ylabel": "y",
            "form": "bars",
            "series": [{"label": f"m{i}", "x": MODELS, "y": [9.0, 9.5, 10.0]} for i in range(3)],
        }
    )
    (f,) = drawn
    ax = f.axes[0]
    box = ax.get_legend().get_window_extent()
    assert not any(b.get_window_extent().overlaps(box) for b in _bars(ax))


def test_identical_points_of_two_series_are_both_visible(drawn):
    same = {"x": [1, 2, 3], "y": [5.0, 6.0, 7.0]}
    figures.render_figure(
        {
            "title": "t",
            "xlabel": "x",
            "ylabel": "y",
            "series": [{"label": "flat", **same}, {"label": "HALO", **same}],
        }
    )
    (f,) = drawn
    a, b = [line.get_transform().transform(line.get_xydata()) for line in f.axes[0].lines[:2]]
    gaps = np.hypot(*(a - b).T)
    assert (gaps >= 3).all(), gaps  # pixels apart: neither marker sits on the other


def test_colour_encodes_one_factor_and_line_style_the_other(drawn):
    labels = ["flat / 4 KiB", "HALO / 4 KiB", "flat / 64 KiB", "HALO / 64 KiB"]
    figures.render_figure(
        {
            "title": "t",
            "xlabel": "nodes",
            "ylabel": "ms",
            "series": [{"label": l, "x": [1, 2], "y": [i, i + 1]} for i, l in enumerate(labels)],
        }
    )
    (f,) = drawn
    style = {
        line.get_label(): (to_rgba(line.get_color()), line.get_linestyle())
        for line in f.axes[0].lines
    }
    assert style["flat / 4 KiB"][0] == style["flat / 64 KiB"][0]
    assert style["HALO / 4 KiB"][0] == style["HALO / 64 KiB"][0]
    assert style["flat / 4 KiB"][0] != style["HALO / 4 KiB"][0]
    assert style["flat / 4 KiB"][1] == style["HALO / 4 KiB"][1]
    assert style["flat / 4 KiB"][1] != style["flat / 64 KiB"][1]


def test_the_papers_points_take_the_colour_of_ours(drawn):
    figures.render_figure(
        {
            "title": "t",
            "xlabel": "x",
            "ylabel": "y",
            "series": [
                {"label": "A", "x": [1, 2], "y": [1, 2]},
                {"label": "B", "x": [1, 2], "y": [3, 4]},
                {"label": "B", "kind": "paper", "x": [2], "y": [4.4]},
            ],
        }
    )
    (f,) = drawn
    colour = {line.get_label(): to_rgba(line.get_color()) for line in f.axes[0].lines}
    assert colour["B (paper)"] == colour["B"] != colour["A"]


def test_the_papers_bars_take_the_colour_of_ours_named_after_them(drawn):
    sizes = ["Small", "Medium"]
    figures.render_figure(
        {
            "title": "t",
            "xlabel": "model",
            "ylabel": "y",
            "form": "bars",
            "series": [
                {"label": "X-MoE", "kind": "paper", "x": sizes, "y": [44.0, 24.2]},
                {"label": "Piper", "kind": "paper", "x": sizes, "y": [90.44, 57.83]},
                {"label": "Piper, ours (estimate)", "x": sizes, "y": [74.9, 66.8]},
            ],
        }
    )
    (f,) = drawn
    bars = _bars(f.axes[0])
    ours = next(b for b in bars if not b.get_hatch())
    edges = {tuple(round(v, 3) for v in b.get_edgecolor()[:3]) for b in bars if b.get_hatch()}
    assert tuple(round(v, 3) for v in ours.get_facecolor()[:3]) in edges
    assert len(edges) == 2  # X-MoE keeps a colour of its own


def test_a_papers_series_with_qualifiers_takes_the_colour_of_ours_with_the_same_stem(drawn):
    # MoP Table 2: the paper's "FSDP-best, MoP Table 2" beside ours "MoP (ours)" and
    # "FSDP-best (ours)" is FSDP-best's colour, not MoP's
    figures.render_figure(
        {
            "title": "t",
            "xlabel": "x",
            "ylabel": "y",
            "series": [
                {"label": "MoP (ours)", "x": [1, 2], "y": [1, 2]},
                {"label": "FSDP-best (ours)", "x": [1, 2], "y": [3, 4]},
                {"label": "FSDP-best, MoP Table 2", "kind": "paper", "x": [2], "y": [4.4]},
            ],
        }
    )
    (f,) = drawn
    colour = {line.get_label(): to_rgba(line.get_color()) for line in f.axes[0].lines}
    assert (
        colour["FSDP-best, MoP Table 2 (paper)"]
        == colour["FSDP-best (ours)"]
        != colour["MoP (ours)"]
    )


def test_categories_on_x_are_never_joined_by_a_line(drawn):
    figures.render_figure(
        {
            "title": "t",
            "xlabel": "model",
            "ylabel": "y",
            "series": [
                {"label": "ours", "x": ["DeepSeek-V3", "Kimi K2", "Arctic"], "y": [1.0, 3.0, 2.0]}
            ],
        }
    )
    (f,) = drawn
    (line,) = f.axes[0].lines
    assert line.get_linestyle() in ("None", "none", "")
    assert line.get_marker() not in (None, "", "None", "none")
