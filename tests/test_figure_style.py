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
    out = figures.render_figure(
        {"series": series, "xlabel": "nodes", "ylabel": "x", "title": "t", "xscale": "log"}
    )
    assert out["png"].startswith(b"\x89PNG")
    (styles,) = drawn
    assert len(styles) == 12 and len(set(styles)) == 12


def _tick_texts(axis) -> list[str]:
    return [t.get_text() for t in axis.get_ticklabels(which="both") if t.get_text()]


def test_log_axes_are_labelled_with_plain_numbers(monkeypatch):
    """No mathtext on a log axis: 1K and 0.2, not 10^3 and 2x10^-1 (issue 16)."""
    drawn = []
    real_close = plt.close

    def keep(f):
        ax = f.axes[0]
        drawn.append((_tick_texts(ax.xaxis), _tick_texts(ax.yaxis)))
        real_close(f)

    monkeypatch.setattr(figures.plt, "close", keep)
    # x over six decades; y within one decade, where matplotlib labels the minor ticks too
    series = [{"label": "s", "x": [1, 10, 1e3, 1e6], "y": [0.15, 0.2, 0.5, 0.9]}]
    out = figures.render_figure(
        {
            "series": series,
            "xlabel": "bytes",
            "ylabel": "s",
            "title": "t",
            "xscale": "log",
            "yscale": "log",
        }
    )
    ((xs, ys),) = drawn
    for text in xs + ys:
        assert "10^" not in text and "\\times" not in text and "$" not in text, text
    assert {"1", "10", "100", "1K", "1M"} <= set(xs), xs
    assert {"0.1", "0.2", "0.4"} <= set(ys), ys
    svg = out["svg"].decode()
    assert ">1K<" in svg and ">1M<" in svg  # the SVG keeps its labels as text


def test_swept_axis_ticks_sit_at_the_grid_values(monkeypatch):
    """A size axis reads 1K, 16K, 1M (K = 1,024) at the values that were run, with the spread."""
    drawn = []
    real_close = plt.close

    def keep(f):
        drawn.append([t.get_text() for t in f.axes[0].get_xticklabels()])
        real_close(f)

    monkeypatch.setattr(figures.plt, "close", keep)
    fig = {
        "series": [
            {
                "label": "s",
                "x": [1024, 16384, 1048576],
                "y": [1, 2, 3],
                "lo": [0.9, 1.8, 2.5],
                "hi": [1.2, 2.4, 3.3],
            }
        ],
        "xlabel": "size (K = 1,024)",
        "ylabel": "ms",
        "title": "t",
        "xscale": "log",
        "xticks": [1024, 16384, 1048576],
        "xticks_binary": True,
    }
    assert figures.render_figure(fig)["png"].startswith(b"\x89PNG")
    assert drawn == [["1K", "16K", "1M"]]


def test_figures_carry_their_provenance_and_draw_bounds_and_ranges_apart():
    from PIL import Image
    import io

    fig = {
        "name": "f",
        "title": "T",
        "xlabel": "x",
        "ylabel": "y",
        "yscale": "log",
        "series": [
            {"label": "ours", "x": [1, 2, 4], "y": [5.0, 7.0, 9.0], "kind": "ours"},
            {
                "label": "claim",
                "x": [2, 4],
                "y": [1.1, 9.0],
                "lo": 1.1,
                "hi": 9.0,
                "kind": "paper-range",
            },
            {"label": "HBM", "x": [], "y": 64.0, "kind": "limit"},
        ],
    }
    provenance = {
        "title": "r: T",
        "commit": "abc123",
        "date": "2026-11-23T10:00:00+00:00",
        "command": "repro run r",
    }
    drawn = figures.render_figure(fig, provenance=provenance)
    text = Image.open(io.BytesIO(drawn["png"])).text
    assert text["Title"] == "r: T" and "commit: abc123" in text["Description"]
    assert "command: repro run r" in text["Description"]
    svg = drawn["svg"].decode()
    assert "abc123" in svg and "repro run r" in svg
    # the bound is drawn as a bound, the range as a range: three legend entries, no empty one
    assert svg.count("HBM") >= 1 and "claim (paper)" in svg
