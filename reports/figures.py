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
  ``group``): one row per category, value on x (a dot plot; for runs with nothing numeric swept);
- ``form`` (the paper's figure form, reproductions.spec.Figure): "lines" (default), "bars"
  (grouped bars, one group per x category, one bar per series; a paper series hatched and
  outlined in the colour of ours of the same label), "stacked-bars" (the series stacked per x
  category, ours and the paper's side by side), "dots"; a series' ``oom``: x values where the
  paper prints OOM (y None): an empty slot labelled "OOM".

Rules every figure keeps: no bars on a log axis (dots at the bars' places instead); the legend
never covers data (inside only in a corner checked to be empty, else beside the axes); series
with identical points are offset sideways so none hides another; colour encodes one factor and line style the other (labels "a / b": colour by a, style
by b; a paper series takes the colour of ours of the same label); categories on x are points
(or bars), never joined by lines (a series may ask for ``line: True`` where its categories are
ordered).

Tick labels are plain numbers (10, 100, 1K, 1M, 0.001), never mathtext such as 10^3 or 2x10^1.
"""

from __future__ import annotations

import datetime as _dt
import io
import re
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import cycler, ticker  # noqa: E402  (matplotlib re-exports cycler)
from matplotlib.transforms import Bbox, offset_copy  # noqa: E402

from moe_repro.reports.numbers import is_number, short_ticks_from, tick  # noqa: E402

# Ten colours, then the same colours dashed, then dotted: past ten series no two look alike
# (matplotlib's default cycle repeats its colours).
STYLE_CYCLE = cycler(linestyle=["-", "--", ":"]) * cycler(color=plt.get_cmap("tab10").colors)
LEGEND_INSIDE_MAX = 6  # more entries than this go beside the axes, not over the data
COLOURS = plt.get_cmap("tab10").colors
LINESTYLES = ("-", "--", ":", "-.")
LABEL_SEP = " / "  # a label "a / b" names two factors: colour encodes a, line style b
DODGE_POINTS = 4.0  # sideways offset, in points, between series whose points coincide
PAPER_HATCH = "///"


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
        self.decimals = next(
            (d for d in range(10) if abs(step * 10**d - round(step * 10**d)) < 1e-6 * step * 10**d),
            10,
        )
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
    ``form`` "bars" / "stacked-bars" draw bars instead (see the module's docstring).
    ``provenance``: text stored in the files' metadata (PNG text chunks, SVG metadata): the
    commit, date, machine and command a figure came from travel with it."""
    if fig.get("kind") == "dots" or fig.get("form") == "dots" and "categories" in fig:
        return _save(_draw_dots(fig), provenance)
    if fig.get("form") in ("bars", "stacked-bars"):
        return _save(_draw_bars(fig), provenance)
    f, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    dates = bool(fig.get("xdates"))
    style = _styles(fig["series"])
    drawn = []  # (series, its artists) of the data series, for the sideways offsets
    for s in fig["series"]:
        if s.get("kind") == "limit":
            ax.axhline(s["y"], color="0.35", linestyle="--", linewidth=1, label=s["label"])
            continue
        x = _dates(s["x"]) if dates else s["x"]
        colour, linestyle = style.get(id(s), ("0.4", "-"))
        if s.get("kind") == "paper":
            (line,) = ax.plot(
                x,
                s["y"],
                linestyle="none",
                marker="o",
                mfc="none",
                color=colour,
                label=f"{s['label']} (paper)",
            )
            drawn.append((s, [line]))
            continue
        if s.get("kind") == "paper-range":
            if len(set(map(str, x))) == 1:  # one x (a category): a band there has no width
                mid, half = (s["hi"] + s["lo"]) / 2, (s["hi"] - s["lo"]) / 2
                ax.errorbar(
                    x[:1],
                    [mid],
                    yerr=[[half], [half]],
                    fmt="none",
                    ecolor="0.4",
                    elinewidth=2,
                    capsize=6,
                    capthick=1.5,
                    label=f"{s['label']} (paper)",
                )
            else:
                ax.fill_between(
                    x,
                    [s["lo"]] * len(x),
                    [s["hi"]] * len(x),
                    facecolor="none",
                    edgecolor="0.4",
                    hatch="//",
                    linewidth=0.8,
                    label=f"{s['label']} (paper)",
                )
            continue
        # categories on x are unrelated unless a series says they are ordered (``line: True``):
        # points, never a line joining them
        categorical = any(isinstance(v, str) for v in s["x"]) and not dates
        joined = s.get("line", not categorical) is not False
        points_only = {} if joined else {"linestyle": "none", "marker": "o"}
        (line,) = ax.plot(
            x,
            s["y"],
            **{
                "marker": fig.get("marker", "."),
                "color": colour,
                "linestyle": linestyle,
                **points_only,
            },
            label=s["label"],
        )
        artists = [line]
        if s.get("lo") is not None and s.get("hi") is not None:
            if len(x) > 1 and joined:
                artists.append(
                    ax.fill_between(x, s["lo"], s["hi"], color=colour, alpha=0.15, linewidth=0)
                )
            else:
                below = [y - lo for y, lo in zip(s["y"], s["lo"])]
                above = [hi - y for y, hi in zip(s["y"], s["hi"])]
                bars = ax.errorbar(
                    x, s["y"], yerr=[below, above], fmt="none", ecolor=colour, capsize=3
                )
                artists += list(bars.lines[2]) + list(bars.lines[1])
        drawn.append((s, artists))
    _dodge(f, ax, drawn)
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
        plain_ticks(
            ax.xaxis, fig.get("xscale", "linear"), fig.get("xticks"), bool(fig.get("xticks_binary"))
        )
    if _numeric(
        [v for s in fig["series"] if s.get("kind") not in ("limit", "paper-range") for v in s["y"]]
    ):
        plain_ticks(ax.yaxis, fig.get("yscale", "linear"))
    ax.set_xlabel(fig["xlabel"])
    ax.set_ylabel(fig["ylabel"])
    ax.set_title(fig["title"], fontsize=10)
    ax.grid(True, alpha=0.3)
    if not dates and any(
        isinstance(v, str) for s in fig["series"] if s.get("kind") != "limit" for v in s["x"]
    ):
        _tilt_crowded_categories(f, ax)
    if fig.get("legend", True):
        _legend(f, ax, len(fig["series"]), fig.get("legend_title"))
    return _save(f, provenance)


def _factors(label: str) -> tuple[str, str | None]:
    parts = str(label).split(LABEL_SEP)
    return (parts[0], LABEL_SEP.join(parts[1:])) if len(parts) > 1 else (parts[0], None)


def _styles(series: list[dict]) -> dict[int, tuple]:
    """(colour, line style) per series. Where the labels of ours name two factors ("a / b"),
    colour encodes the first and line style the second; otherwise each label gets a colour
    (ten, then the same colours dashed, then dotted). A paper series takes the colour of ours
    of the same label, so ours and the paper's value of one thing read as one colour."""
    data = [s for s in series if s.get("kind") not in ("limit", "paper-range")]
    ours = [s for s in data if s.get("kind", "ours") != "paper"]
    firsts = list(dict.fromkeys(_factors(s["label"])[0] for s in ours))
    seconds = list(dict.fromkeys(_factors(s["label"])[1] for s in ours))
    two = len(firsts) > 1 and len(seconds) > 1 and None not in seconds
    keys: dict[str, tuple] = {}
    out = {}
    for s in ours + [s for s in data if s not in ours]:
        label = str(s["label"])
        if label not in keys and s not in ours:
            # the paper's "Piper" beside ours "Piper, ours (estimate)": one thing, one colour
            # (or "FSDP-best, MoP Table 2" beside "FSDP-best (ours)": the same stem)
            same = [
                k for k in keys if re.match(re.escape(label) + r"\b", k) or _stem(k) == _stem(label)
            ]
            if same:
                keys[label] = keys[same[0]]
        if label not in keys:
            if two and s in ours:
                a, b = _factors(label)
                keys[label] = (
                    COLOURS[firsts.index(a) % len(COLOURS)],
                    LINESTYLES[seconds.index(b) % len(LINESTYLES)],
                )
            else:
                n = len(keys)
                keys[label] = (
                    COLOURS[n % len(COLOURS)],
                    LINESTYLES[(n // len(COLOURS)) % len(LINESTYLES)],
                )
        out[id(s)] = keys[label]
    return out


def _stem(label: str) -> str:
    """What a series label names before its qualifiers: "FSDP-best (ours)" -> "FSDP-best"."""
    return re.split(r",| \(", label, maxsplit=1)[0].strip()


def _point_key(x, y, span: float):
    if y is None or not is_number(y) or y != y:
        return None
    return (str(x), round(y / span) if span else y)


def _dodge(f, ax, drawn: list) -> None:
    """Series whose points coincide (same x, y within 1% of the axis' span) are moved sideways
    by DODGE_POINTS each, in drawing order, so that no point hides another."""
    ys = [y for s, _ in drawn for y in s["y"] if y is not None and is_number(y) and y == y]
    if not ys:
        return
    span = 0.01 * ((max(ys) - min(ys)) or abs(max(ys)) or 1.0)
    seen: dict = {}
    for s, artists in drawn:
        keys = {k for k in (_point_key(x, y, span) for x, y in zip(s["x"], s["y"])) if k}
        shift = max((seen.get(k, 0) for k in keys), default=0)
        for k in keys:
            seen[k] = max(seen.get(k, 0), shift + 1) if shift or k in seen else 1
        if shift:
            move = offset_copy(ax.transData, fig=f, x=DODGE_POINTS * shift, y=0, units="points")
            for artist in artists:
                artist.set_transform(move)


def _draw_bars(fig: dict):
    """Bars in the paper's form: per x category a group of bars, one per series ("bars"), or
    the series stacked, ours and the paper's side by side ("stacked-bars"). A paper series is
    hatched and outlined in the colour of ours of the same label; an x its series lists in
    ``oom`` with no value is an empty slot labelled OOM, as the paper prints it."""
    series = fig["series"]
    stacked = fig.get("form") == "stacked-bars"
    # A bar's length is its value from zero, and a log axis has no zero: there a 4.4x ratio
    # looks like 30x. Bars asked for on a log axis are drawn as dots at the bars' places
    # (hollow for the paper's); stacked bars, whose sums need lengths, stay on a linear axis.
    log = fig.get("yscale") == "log" and not stacked
    if stacked and fig.get("yscale") == "log":
        fig = {**fig, "yscale": "linear"}
    data = [s for s in series if s.get("kind", "ours") in ("ours", "paper")]
    cats = list(dict.fromkeys(_cat(x) for s in series if s.get("kind") != "limit" for x in s["x"]))
    style = _styles(series)
    f, ax = plt.subplots(
        figsize=(
            max(6.4, 1.2 + 0.5 * len(cats) * (1 if stacked else max(1, len(data)) ** 0.5)),
            4.0,
        ),
        dpi=110,
    )
    where = {c: i for i, c in enumerate(cats)}
    if stacked:  # one column per source (ours, the paper's), series stacked in it
        columns = list(dict.fromkeys(s.get("kind", "ours") for s in data))
    else:
        columns = [id(s) for s in data]
    width = 0.8 / max(1, len(columns))
    bottoms: dict = {}
    oom_slots = []
    for s in data:
        colour, _ = style[id(s)]
        paper = s.get("kind") == "paper"
        column = columns.index(s.get("kind", "ours") if stacked else id(s))
        shift = (column - (len(columns) - 1) / 2) * width
        look = (
            {"facecolor": "white", "edgecolor": colour, "hatch": PAPER_HATCH, "linewidth": 1.2}
            if paper
            else {"color": colour}
        )
        label = f"{s['label']} (paper)" if paper else s["label"]
        oom = {_cat(x) for x in s.get("oom") or []}
        xs, heights, base, errs = [], [], [], []
        for i, (x, y) in enumerate(zip(s["x"], s["y"])):
            at = where[_cat(x)] + shift
            if y is None or (is_number(y) and y != y):
                if _cat(x) in oom:
                    oom_slots.append((at, colour))
                continue
            b = bottoms.get((column, _cat(x)), 0.0) if stacked else 0.0
            xs.append(at)
            heights.append(y)
            base.append(b)
            if stacked:
                bottoms[(column, _cat(x))] = b + y
            if s.get("lo") is not None and s.get("hi") is not None:
                errs.append((y - s["lo"][i], s["hi"][i] - y))
            else:
                errs.append(None)
        if log:  # dots, not bars (see above)
            ax.plot(
                xs or [],
                heights or [],
                linestyle="none",
                marker="o",
                markersize=7,
                markerfacecolor="white" if paper else colour,
                markeredgecolor=colour,
                markeredgewidth=1.5,
                label=label,
            )
            if xs and all(e is not None for e in errs):
                ax.errorbar(
                    xs,
                    heights,
                    yerr=[[e[0] for e in errs], [e[1] for e in errs]],
                    fmt="none",
                    ecolor=colour,
                    capsize=3,
                    linewidth=1,
                )
            continue
        if not xs and oom:  # a series that is OOM everywhere still gets its legend entry
            ax.bar([], [], width, label=label, **look)
        if xs:
            ax.bar(
                xs,
                heights,
                width * (0.95 if not stacked else 0.9),
                bottom=base,
                label=label,
                **look,
            )
            if all(e is not None for e in errs):
                ax.errorbar(
                    xs,
                    [b + h for b, h in zip(base, heights)],
                    yerr=[[e[0] for e in errs], [e[1] for e in errs]],
                    fmt="none",
                    ecolor="0.2",
                    capsize=3,
                    linewidth=1,
                )
    for s in series:
        if s.get("kind") == "limit":
            ax.axhline(s["y"], color="0.35", linestyle="--", linewidth=1, label=s["label"])
        elif s.get("kind") == "paper-range":
            for x in dict.fromkeys(_cat(v) for v in s["x"]):
                mid, half = (s["hi"] + s["lo"]) / 2, (s["hi"] - s["lo"]) / 2
                ax.errorbar(
                    [where[x]],
                    [mid],
                    yerr=[[half], [half]],
                    fmt="none",
                    ecolor="0.4",
                    elinewidth=2,
                    capsize=8,
                    capthick=1.5,
                )
            ax.errorbar(
                [],
                [],
                yerr=[],
                fmt="none",
                ecolor="0.4",
                elinewidth=2,
                label=f"{s['label']} (paper)",
            )
    if fig.get("yscale", "linear") != "linear":
        ax.set_yscale(fig["yscale"])
    ax.set_xticks(range(len(cats)), cats)
    ax.set_xlim(-0.6, len(cats) - 0.4)
    if oom_slots:  # after the scale is set: the label sits just above the axis' floor
        low, high = ax.get_ylim()
        y = low * (high / low) ** 0.03 if log else low + 0.03 * (high - low)
        for at, colour in oom_slots:
            ax.text(
                at,
                y,
                "OOM",
                rotation=90,
                ha="center",
                va="bottom",
                fontsize=7,
                color=colour,
                fontweight="bold",
            )
    plain_ticks(ax.yaxis, fig.get("yscale", "linear"))
    ax.set_xlabel(fig["xlabel"])
    ax.set_ylabel(fig["ylabel"])
    ax.set_title(fig["title"], fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    if log:  # dots over categories: a light vertical guide per category
        for i in range(len(cats)):
            ax.axvline(i, color="0.92", linewidth=0.8, zorder=0)
    _tilt_crowded_categories(f, ax)
    if fig.get("legend", True):
        _legend(f, ax, len(series), fig.get("legend_title"))
    return f


def _cat(x) -> str:
    """A category's name on a bar chart's x axis (numbers as the site writes them)."""
    return x if isinstance(x, str) else tick(x)


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
    """The legend never covers data: inside the axes only in a corner checked to be empty of
    every line, point, bar, band and label, else beside the axes (upper left of the space to
    their right)."""
    if entries and entries <= LEGEND_INSIDE_MAX:
        for loc in (
            "upper left",
            "upper right",
            "lower right",
            "lower left",
            "center right",
            "center left",
            "upper center",
            "lower center",
        ):
            legend = ax.legend(fontsize=8, title=title, title_fontsize=8, loc=loc)
            if not _covers_data(f, ax, legend):
                return
            legend.remove()
    if entries:
        _legend_below(f, ax, entries, title)


def _legend_below(f, ax, entries: int, title: str | None) -> None:
    """The legend under the axes, below their tick labels and x label, in as many columns as
    fit: the plot keeps its width (a legend beside it would shrink it on a narrow screen), and
    the saved image grows downwards to take the legend in (placed in :func:`_save`, once the
    layout is final)."""
    handles, labels = ax.get_legend_handles_labels()
    longest = max((len(str(t)) for t in labels), default=10)
    columns = max(1, min(3, entries, 80 // max(longest, 1)))
    legend = ax.legend(
        fontsize=7 if entries > LEGEND_INSIDE_MAX else 8,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        borderaxespad=0,
        ncol=columns,
        title=title,
        title_fontsize=7 if entries > LEGEND_INSIDE_MAX else 8,
        frameon=False,
    )
    legend._moe_below = ax  # noqa: SLF001  (read by _save)


def _place_legends_below(f) -> None:
    """Lay the figure out without the legends that go under their axes, then anchor each just
    below its axes' tick labels and x label."""
    below = [a.get_legend() for a in f.axes if getattr(a.get_legend(), "_moe_below", None)]
    for legend in below:
        legend.set_in_layout(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        f.tight_layout()
    if not below:
        return
    f.canvas.draw()
    renderer = f.canvas.get_renderer()
    for legend in below:
        ax = legend._moe_below  # noqa: SLF001
        legend.set_visible(False)
        bottom = ax.get_tightbbox(renderer).y0
        legend.set_visible(True)
        y = ax.transAxes.inverted().transform((0, bottom))[1]
        legend.set_bbox_to_anchor((0.5, y - 0.03), transform=ax.transAxes)
        legend.set_in_layout(True)


def _covers_data(f, ax, legend) -> bool:
    """Whether ``legend`` (placed inside the axes) overlaps anything drawn there: a line or its
    markers, a bar, a band or an error bar, a text label. Measured in display coordinates as
    the figure is laid out when saved."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        f.tight_layout()
    f.canvas.draw()
    renderer = f.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    pad = 4  # pixels: a marker's radius around its point
    near = Bbox.from_extents(box.x0 - pad, box.y0 - pad, box.x1 + pad, box.y1 + pad)
    for line in ax.lines:
        path = line.get_transform().transform_path(line.get_path())
        if len(path.vertices) == 0:
            continue
        if line.get_linestyle() not in ("None", "none", "", " "):
            if path.intersects_bbox(near, filled=False):
                return True
        elif any(near.contains(x, y) for x, y in path.vertices):
            return True
    for patch in ax.patches:
        if patch.get_window_extent(renderer).overlaps(box):
            return True
    for coll in ax.collections:
        transform = coll.get_transform()
        for path in coll.get_paths():
            path = transform.transform_path(path)
            if len(path.vertices) and path.intersects_bbox(near, filled=True):
                return True
        offsets = coll.get_offsets()
        if len(offsets) and coll.get_offset_transform() is not None:
            for x, y in coll.get_offset_transform().transform(offsets):
                if near.contains(x, y):
                    return True
    for text in ax.texts:
        if text.get_window_extent(renderer).overlaps(box):
            return True
    return False


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
        ax.errorbar(
            xs,
            [y for y, _ in rows],
            xerr=err,
            fmt="o",
            color=COLOURS[i % len(COLOURS)],
            capsize=3,
            label=str(group) if group is not None else None,
        )
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
    _place_legends_below(f)  # a legend under the axes: the saved box takes it in
    out = {}
    for fmt in ("png", "svg"):
        buf = io.BytesIO()
        # PNG keeps any text key; SVG only its Dublin Core ones, so provenance goes to Description
        meta = {"Creator": "moe-repro"} if fmt == "svg" else {"Software": "moe-repro"}
        if provenance:
            meta.update(
                {
                    "Title": provenance.get("title", ""),
                    "Description": "; ".join(
                        f"{k}: {v}" for k, v in provenance.items() if k != "title"
                    ),
                }
            )
        # SVG text stays text (searchable, selectable); the long legend is kept inside the image
        with plt.rc_context({"svg.fonttype": "none"}):
            f.savefig(buf, format=fmt, bbox_inches="tight", metadata=meta)
        out[fmt] = buf.getvalue()
    plt.close(f)
    return out
