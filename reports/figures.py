"""Draw figure data (reproductions.spec.Figure as a dict, or the site's suite figures) to PNG and SVG.

A figure dict has ``title``, ``xlabel``, ``ylabel`` and ``series`` (each ``label``, ``x``, ``y``,
optionally ``kind: "paper"``), and may set:

- ``xscale`` / ``yscale``: "linear" (default) or "log";
- per series ``lo`` / ``hi``: the spread around ``y`` (a shaded band; error bars for one point);
- ``xdates``: the x values are ISO timestamps, drawn on a date axis;
- ``xticks``: put the x ticks at exactly these values (a swept parameter's grid);
  ``xticks_binary``: label them with K = 1,024;
- ``legend_title``, ``marker``, ``legend`` (False: none, for a single unnamed line);
- string x values: categories, in the order first drawn; names too long to sit side by side
  are tilted;
- ``kind: "dots"`` with ``categories`` (each ``label``, ``value``, optional ``lo``/``hi``,
  ``group``): one row per category, value on x (a dot plot; for runs with nothing numeric swept).

Tick labels are plain numbers (10, 100, 1K, 1M, 0.001), never mathtext such as 10^3 or 2x10^1.
"""

from __future__ import annotations

import datetime as _dt
import io
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import cycler, ticker  # noqa: E402  (matplotlib re-exports cycler)

from moe_repro.reports.numbers import is_number, short_ticks_from, tick  # noqa: E402

# Ten colours, then the same colours dashed, then dotted: past ten series no two look alike
# (matplotlib's default cycle repeats its colours).
STYLE_CYCLE = cycler(linestyle=["-", "--", ":"]) * cycler(color=plt.get_cmap("tab10").colors)
LEGEND_INSIDE_MAX = 6  # more entries than this go beside the axes, not over the data
COLOURS = plt.get_cmap("tab10").colors


class PlainLogFormatter(ticker.LogFormatter):
    """matplotlib's log formatter (it decides which ticks get a label: decades, and the 2s and
    5s of a short axis) writing each label as a plain number: 1K, not 10^3; 0.2, not 2x10^-1."""

    def _num_to_string(self, x, vmin, vmax):
        return tick(x)


class PlainFormatter(ticker.Formatter):
    """Linear axis labels with separators and as many decimals as the tick step needs (no offset
    text, no "1e6" above the axis): 0.0025 steps -> 0.0025, 0.005, ...; 2,000,000 -> 2M."""

    decimals = 0

    def set_locs(self, locs):
        super().set_locs(locs)
        steps = [abs(b - a) for a, b in zip(locs, locs[1:]) if b != a]
        step = min(steps) if steps else 1.0
        self.decimals = next((d for d in range(10)
                              if abs(step * 10**d - round(step * 10**d)) < 1e-6 * step * 10**d), 10)
        self.big = max((abs(v) for v in locs), default=0) >= 1e6

    def __call__(self, x, pos=None):
        if self.big or (x and abs(x) < 1e-4):
            return tick(x)
        return f"{x:,.{self.decimals}f}".replace("-", "\N{MINUS SIGN}")


def plain_ticks(axis, scale: str, values: list | None = None, binary: bool = False) -> None:
    """Readable tick labels on a numeric axis: on a log axis plain numbers for the decades (and
    the sub-decade ticks matplotlib labels on short axes); with ``values``, ticks exactly there
    (labels with K = 1,024 where ``binary``)."""
    if values:
        short = short_ticks_from(values)
        axis.set_major_locator(ticker.FixedLocator(values))
        axis.set_major_formatter(ticker.FuncFormatter(lambda x, pos: tick(x, binary, short)))
        axis.set_minor_locator(ticker.NullLocator())
    elif scale == "log":
        axis.set_major_formatter(PlainLogFormatter(labelOnlyBase=False))
        axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))
    else:
        axis.set_major_formatter(PlainFormatter())


def _numeric(values) -> bool:
    return bool(values) and all(is_number(v) or v is None for v in values)


def _dates(values) -> list:
    return [v if isinstance(v, _dt.datetime) else _dt.datetime.fromisoformat(v) for v in values]


def render_figure(fig: dict, provenance: dict[str, str] | None = None) -> dict[str, bytes]:
    """Return {"png": bytes, "svg": bytes}. Series kinds: "ours" (lines), "paper" (hollow
    markers), "paper-range" (a range the paper states in words: a hatched band from ``lo`` to
    ``hi`` over ``x``; over a single x, such as one category, a vertical span with caps),
    "limit" (a horizontal line at ``y``, e.g. HBM: a bound, not data).
    ``provenance``: text stored in the files' metadata (PNG text chunks, SVG metadata): the
    commit, date, machine and command a figure came from travel with it."""
    if fig.get("kind") == "dots":
        return _save(_draw_dots(fig), provenance)
    f, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    ax.set_prop_cycle(STYLE_CYCLE)
    dates = bool(fig.get("xdates"))
    for s in fig["series"]:
        if s.get("kind") == "limit":
            ax.axhline(s["y"], color="0.35", linestyle="--", linewidth=1, label=s["label"])
            continue
        x = _dates(s["x"]) if dates else s["x"]
        if s.get("kind") == "paper":
            ax.plot(x, s["y"], linestyle="none", marker="o", mfc="none", label=f"{s['label']} (paper)")
            continue
        if s.get("kind") == "paper-range":
            if len(set(x)) == 1:  # one x (a category): a band there has no width, draw a span
                mid, half = (s["hi"] + s["lo"]) / 2, (s["hi"] - s["lo"]) / 2
                ax.errorbar(x[:1], [mid], yerr=[[half], [half]], fmt="none", ecolor="0.4",
                            elinewidth=2, capsize=6, capthick=1.5, label=f"{s['label']} (paper)")
            else:
                ax.fill_between(x, [s["lo"]] * len(x), [s["hi"]] * len(x), facecolor="none",
                                edgecolor="0.4", hatch="//", linewidth=0.8, label=f"{s['label']} (paper)")
            continue
        # "line": False for points over categories (methods), where a joining line means nothing
        points_only = {"linestyle": "none", "marker": "o"} if s.get("line") is False else {}
        (line,) = ax.plot(x, s["y"], **{"marker": fig.get("marker", "."), **points_only},
                          label=s["label"])
        if s.get("lo") is not None and s.get("hi") is not None:
            if len(x) > 1:
                ax.fill_between(x, s["lo"], s["hi"], color=line.get_color(), alpha=0.15, linewidth=0)
            else:
                below = [y - lo for y, lo in zip(s["y"], s["lo"])]
                above = [hi - y for y, hi in zip(s["y"], s["hi"])]
                ax.errorbar(x, s["y"], yerr=[below, above], fmt="none", ecolor=line.get_color(),
                            capsize=3)
    # Setting a scale replaces the axis' locator and formatter, which would drop the labels of a
    # categorical (string) axis: only set scales that differ from the default.
    if fig.get("xscale", "linear") != "linear":
        ax.set_xscale(fig["xscale"])
    if fig.get("yscale", "linear") != "linear":
        ax.set_yscale(fig["yscale"])
    if dates:
        locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        when = {t for s in fig["series"] for t in _dates(s["x"])}
        if len(when) == 1:  # one run: a day either side, not the locator's default years
            (t,) = when
            ax.set_xlim(t - _dt.timedelta(days=1), t + _dt.timedelta(days=1))
    elif _numeric([v for s in fig["series"] if s.get("kind") != "limit" for v in s["x"]]):
        plain_ticks(ax.xaxis, fig.get("xscale", "linear"), fig.get("xticks"),
                    bool(fig.get("xticks_binary")))
    if _numeric([v for s in fig["series"] if s.get("kind") not in ("limit", "paper-range")
                  for v in s["y"]]):
        plain_ticks(ax.yaxis, fig.get("yscale", "linear"))
    ax.set_xlabel(fig["xlabel"])
    ax.set_ylabel(fig["ylabel"])
    ax.set_title(fig["title"], fontsize=10)
    ax.grid(True, alpha=0.3)
    if fig.get("legend", True):
        _legend(f, ax, len(fig["series"]), fig.get("legend_title"))
    if not dates and any(isinstance(v, str) for s in fig["series"] if s.get("kind") != "limit"
                         for v in s["x"]):
        _tilt_crowded_categories(f, ax)
    return _save(f, provenance)


def _tilt_crowded_categories(f, ax) -> None:
    """Category names (strings on x) that would run into each other are tilted, right-aligned
    under their tick; names that fit stay level. Measured as laid out when saved; the layout is
    then put back, so that a figure whose names fit is saved exactly as before."""
    pars = f.subplotpars
    before = {k: getattr(pars, k) for k in ("left", "right", "bottom", "top", "wspace", "hspace")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        f.tight_layout()
    f.canvas.draw()
    renderer = f.canvas.get_renderer()
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
    f.subplots_adjust(**before)
    gap = 4  # pixels: closer than this reads as one name
    if any(a.x1 + gap > b.x0 for a, b in zip(boxes, boxes[1:])):
        for t in labels:
            t.set_rotation(30)
            t.set_horizontalalignment("right")
            t.set_rotation_mode("anchor")


def _legend(f, ax, entries: int, title: str | None = None) -> None:
    if entries > LEGEND_INSIDE_MAX:
        f.set_figwidth(9.0)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
                  title=title, title_fontsize=7)
    elif entries:
        ax.legend(fontsize=8, title=title, title_fontsize=8)


def _draw_dots(fig: dict):
    """One row per category (first on top), its value as a dot and its spread as a bar."""
    cats = fig["categories"]
    f, ax = plt.subplots(figsize=(6.4, max(2.4, 1.3 + 0.3 * len(cats))), dpi=110)
    groups = list(dict.fromkeys(c.get("group") for c in cats))
    ys = list(range(len(cats)))[::-1]
    for i, group in enumerate(groups):
        rows = [(y, c) for y, c in zip(ys, cats) if c.get("group") == group]
        xs = [c["value"] for _, c in rows]
        err = None
        if all(c.get("lo") is not None and c.get("hi") is not None for _, c in rows):
            err = [[c["value"] - c["lo"] for _, c in rows], [c["hi"] - c["value"] for _, c in rows]]
        ax.errorbar(xs, [y for y, _ in rows], xerr=err, fmt="o", color=COLOURS[i % len(COLOURS)],
                    capsize=3, label=str(group) if group is not None else None)
    ax.set_yticks(ys, [c["label"] for c in cats])
    ax.set_ylim(-0.7, len(cats) - 0.3)
    scale = fig.get("xscale", "linear")
    if scale != "linear":
        ax.set_xscale(scale)
    plain_ticks(ax.xaxis, scale)
    ax.set_xlabel(fig["xlabel"])
    ax.set_ylabel(fig.get("ylabel", ""))
    ax.set_title(fig["title"], fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    if len(groups) > 1:
        _legend(f, ax, len(groups), fig.get("legend_title"))
    return f


def _save(f, provenance: dict[str, str] | None = None) -> dict[str, bytes]:
    with warnings.catch_warnings():  # a legend beside the axes: the saved box takes it in
        warnings.simplefilter("ignore", UserWarning)
        f.tight_layout()
    out = {}
    for fmt in ("png", "svg"):
        buf = io.BytesIO()
        # PNG keeps any text key; SVG only its Dublin Core ones, so provenance goes to Description
        meta = {"Creator": "moe-repro"} if fmt == "svg" else {"Software": "moe-repro"}
        if provenance:
            meta.update({"Title": provenance.get("title", ""),
                         "Description": "; ".join(f"{k}: {v}" for k, v in provenance.items()
                                                  if k != "title")})
        # SVG text stays text (searchable, selectable); the long legend is kept inside the image
        with plt.rc_context({"svg.fonttype": "none"}):
            f.savefig(buf, format=fmt, bbox_inches="tight", metadata=meta)
        out[fmt] = buf.getvalue()
    plt.close(f)
    return out
