"""History by commit and change points, for the site (asv's per-machine graphs, Bencher's alerts).

Every stored run is copied beside the site (``runs/<kind>/<name>/<file>.json``) so that each point
of a history chart links to the record it came from. The x of every history is the commit order
(runs in time order, one position per commit; runs of one commit share it), labelled with the
commit and date; runs of different machines are never joined into one line.

Change points come from records/changepoints.detect_steps over each series (one grid point's
metric on one machine, or a reproduction's count of agreeing cells); they are flagged on the page
and collected for the index's summary grid, which draws one sparkline per suite and reproduction.

Charts are inline SVG written here (no matplotlib): small, and their points can be links.
"""

from __future__ import annotations

import html as _html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from moe_repro.records.atomic import atomic_write_bytes, inside
from moe_repro.records.record import STORE_DIRS, SuiteRecord
from moe_repro.reports.numbers import fmt, is_number, readable_unit, tick

MAX_CHART_LINES = 8  # grid points drawn on one history chart (all of them in the table)
# One colour per line, never repeated on one chart (Okabe-Ito, then Tableau's darker ones).
PALETTE = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#000000",
    "#8C564B",
)


@dataclass
class Run:
    """One stored run as a history point: its record, the link to its copy, where it sits."""

    record: object
    href: str | None  # its copy, relative to the site's root (None: not published)
    commit: str
    date: str
    machine: str
    order: int = 0  # position in the commit order


@dataclass
class Change:
    """A change point of one series: a regression or an improvement at ``run``."""

    kind: str  # "regression" or "improvement"
    what: str  # the series: metric and grid point, or the reproduction's agreeing cells
    machine: str
    run: Run
    before: float
    after: float
    ratio: float
    unit: str = ""

    def words(self) -> str:
        """The step in words, its values in a unit they read in (no 2.9e-05 TFLOP/s)."""
        factor, unit = readable_unit([self.before, self.after], self.unit)

        def show(v):
            return fmt(v, unit) if unit in ("s", "B", "%") else f"{fmt(v / factor)} {unit}".strip()

        context = noise(self.run.record) if self.run.record is not None else None
        return (
            f"{self.what} {show(self.before)} -> {show(self.after)} ({_ratio(self.ratio)}) at "
            f"commit {self.run.commit} ({self.run.date[:16].replace('T', ' ')}, {self.machine})"
            + (
                "; a loaded run (load above the core count): the gate names it, does not fail"
                if context and context["loaded"] and self.unit == "s"
                else ""
            )
        )


@dataclass
class Series:
    label: str
    machine: str
    runs: list[Run] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)


def _ratio(r: float) -> str:
    return f"{r:.2f}x" if is_number(r) and math.isfinite(r) else "-"


def machine_of(record) -> str:
    """The machine a run ran on, as its environment names it: host, then device or CPU."""
    env = record.environment
    extra = env.model_extra or {}
    host = extra.get("hostname") or "unknown host"
    what = extra.get("device") or extra.get("cpu_model")
    return f"{host} ({what})" if what else str(host)


def unpublished(records) -> list[Run]:
    """Runs given as records alone (no store to copy them from): points without links."""
    runs = [
        Run(
            record=r,
            href=None,
            commit=(r.environment.git_commit or "no commit")[:10],
            date=r.environment.timestamp or "",
            machine=machine_of(r),
        )
        for r in records
    ]
    _order(runs)
    return runs


def _order(runs: list[Run]) -> None:
    order: dict[str, int] = {}
    for run in runs:
        run.order = order.setdefault(run.commit, len(order))


def publish_runs(store, kind: str, name: str, out: Path) -> list[Run]:
    """Every readable stored run of ``name``, oldest first, copied to ``out/runs/...`` (a copy
    already there is kept: stored runs never change), with its place in the commit order."""
    runs = []
    sub = Path("runs") / STORE_DIRS[kind] / name
    for path in store.history(kind, name):
        record = store.read(path)
        if record is None:
            continue
        target = inside(out / sub, path.name)
        if not target.exists():
            atomic_write_bytes(target, path.read_bytes())
        env = record.environment
        runs.append(
            Run(
                record=record,
                href=(sub / path.name).as_posix(),
                commit=(env.git_commit or "no commit")[:10],
                date=env.timestamp or "",
                machine=machine_of(record),
            )
        )
    _order(runs)
    return runs


def _detect(values: list[float], higher_is_better: bool):
    from moe_repro.records.changepoints import detect_steps

    return detect_steps(values, higher_is_better=higher_is_better)


def _steps(series: Series, higher_is_better: bool, unit: str = "") -> None:
    """Fill ``series.changes`` from records/changepoints over its values."""
    if len(series.values) < 2:
        return
    for step in _detect(series.values, higher_is_better):
        series.changes.append(
            Change(
                kind=step.kind,
                what=series.label,
                machine=series.machine,
                run=series.runs[step.index],
                before=step.before,
                after=step.after,
                ratio=step.ratio,
                unit=unit,
            )
        )


def _key(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def suite_history(runs: list[Run]) -> dict:
    """For a suite's runs: per headline metric of the latest run, one series per grid point and
    machine with its change points. Returns {"metrics": [{name, unit, better, series}],
    "changes": [Change], "summary": sparkline values of the latest machine}."""
    if not runs:
        return {"metrics": [], "changes": [], "summary": []}
    latest: SuiteRecord = runs[-1].record
    params = list(latest.params)
    varying = [p for p in params if len({_key(r.get(p)) for r in latest.records}) > 1]
    point = lambda r: tuple(_key(r.get(p)) for p in params)  # noqa: E731
    metrics = [m for m in latest.metrics if m.better in ("higher", "lower")]
    if not metrics:
        metrics = list(latest.metrics[:1])
    out, changes = [], []
    for metric in metrics[:2]:
        labels: dict[tuple, str] = {}
        for r in latest.records:
            if _finite(r.get(metric.name)):
                labels.setdefault(
                    point(r), ", ".join(f"{p}={fmt(r.get(p))}" for p in varying) or metric.name
                )
        series: dict[tuple, Series] = {}
        for run in runs:
            seen = set()
            for r in getattr(run.record, "records", []):
                k = point(r)
                if k in labels and k not in seen and _finite(r.get(metric.name)):
                    seen.add(k)
                    s = series.setdefault((k, run.machine), Series(labels[k], run.machine))
                    s.runs.append(run)
                    s.values.append(float(r[metric.name]))
        for s in series.values():
            s.label = f"{metric.name} at {s.label}" if s.label != metric.name else s.label
            _steps(s, metric.better == "higher", metric.unit)
            changes += s.changes
        out.append(
            {
                "name": metric.name,
                "unit": metric.unit,
                "better": metric.better,
                "series": list(series.values()),
            }
        )
    return {"metrics": out, "changes": changes, "summary": _summary_line(out, runs[-1].machine)}


def _summary_line(metrics: list[dict], machine: str) -> list[tuple[Run, float]]:
    """One line for the index: per run of ``machine``, the geometric mean over the first
    metric's grid points of value / that point's first value (1.0 = as at the first run)."""
    if not metrics:
        return []
    by_run: dict[int, tuple[Run, list[float]]] = {}
    for s in metrics[0]["series"]:
        if s.machine != machine or not s.values or s.values[0] <= 0:
            continue
        for run, v in zip(s.runs, s.values):
            if v > 0:
                by_run.setdefault(id(run), (run, []))[1].append(v / s.values[0])
    line = [(run, math.exp(sum(map(math.log, vs)) / len(vs))) for run, vs in by_run.values() if vs]
    return sorted(line, key=lambda rv: (rv[0].date, rv[0].order))


def reproduction_history(runs: list[Run]) -> dict:
    """For a reproduction's runs: per machine, the agreeing / explained / deviating counts per run
    with change points on the agreeing count, and the cells whose number or grade changed."""
    from moe_repro.records import grading

    by_machine: dict[str, Series] = {}
    counts: dict[int, dict] = {}
    for run in runs:
        c = grading.agreement([c.model_dump() for c in run.record.cells])
        counts[id(run)] = c
        s = by_machine.setdefault(run.machine, Series("agreeing cells", run.machine))
        s.runs.append(run)
        s.values.append(float(c.get("agree", 0)))
    changes = []
    for s in by_machine.values():
        _steps(s, True)
        changes += s.changes
    cells: dict[tuple, list] = {}
    for run in runs:
        for c in run.record.cells:
            cells.setdefault((c.row, c.column), []).append((run, c.ours, c.verdict))
    moved = []
    for (row, column), seen in cells.items():
        numbers = {_key(o) for _, o, _ in seen}
        grades = [g for _, _, g in seen]
        if len(numbers) > 1 or len(set(grades)) > 1:
            moved.append(
                {
                    "row": row,
                    "column": column,
                    "points": seen,
                    "first": grades[0],
                    "last": grades[-1],
                }
            )
    return {
        "series": list(by_machine.values()),
        "counts": counts,
        "changes": changes,
        "cells": moved,
        "cells_total": len(cells),
        "summary": [
            (r, v)
            for r, v in zip(by_machine[runs[-1].machine].runs, by_machine[runs[-1].machine].values)
        ]
        if runs
        else [],
    }


def _finite(x) -> bool:
    return is_number(x) and math.isfinite(x)


# ---------------------------------------------------------------------------------------------
# SVG: a history chart (x = commit order, points link to their records) and a sparkline.


def _esc(text) -> str:
    return _html.escape(str(text), quote=True)


def _y_ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        ticks = [10.0**e * m for e in range(a, b + 1) for m in (1, 2, 5)]
        return [t for t in ticks if lo <= t <= hi] or [lo, hi]
    if hi == lo:
        return [lo]
    raw = (hi - lo) / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def history_svg(
    series: list[Series],
    orders: list[Run],
    unit: str = "",
    title: str = "",
    root: str = "../",
    width: int = 480,
    height: int = 240,
) -> str:
    """An inline SVG: one line per series over the commit order (``orders``: one run per commit
    position, for the labels), every point a link to its record with a tooltip (commit, date,
    machine, value), change points ringed (red: regression, green: improvement)."""
    values = [v for s in series for v in s.values if _finite(v)]
    if not values:
        return ""
    factor, shown_unit = readable_unit(values, unit)
    lo, hi = min(values) / factor, max(values) / factor
    log = lo > 0 and hi / lo > 100
    if not log:
        lo = min(0.0, lo)
        hi = hi * 1.05 if hi > 0 else 1.0
    left, right, top, bottom = 58, 10, 16, 54
    w, h = width - left - right, height - top - bottom
    positions = sorted({r.order for r in orders})
    place = {o: i for i, o in enumerate(positions)}  # this machine's commits, side by side
    n = len(positions) - 1
    pad = 14  # the first and last points off the frame

    def X(order):
        i = place.get(order, 0)
        return left + (pad + (w - 2 * pad) * i / n if n else w / 2)

    def Y(v):
        if log:
            return top + h * (1 - (math.log10(v) - math.log10(lo)) / (math.log10(hi / lo) or 1))
        return top + h * (1 - (v - lo) / ((hi - lo) or 1))

    parts = [
        f'<svg class="history" viewBox="0 0 {width} {height}" width="100%" '
        f'role="img" aria-label="{_esc(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{_esc(title)}</title>",
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#d0d7de"/>',
    ]
    for t in _y_ticks(lo, hi, log):
        y = Y(t)
        parts.append(
            f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eef1f4"/>'
        )
        parts.append(
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="12">'
            f"{_esc(tick(t))}</text>"
        )
    seen = set()
    step = max(1, math.ceil(len(positions) / 8))
    for r in orders:
        if r.order in seen or place.get(r.order, 0) % step:
            continue
        seen.add(r.order)
        x = X(r.order)
        parts.append(
            f'<text x="{x:.1f}" y="{top + h + 16}" text-anchor="middle" font-size="12">'
            f"{_esc(r.commit[:7])}</text>"
            f'<text x="{x:.1f}" y="{top + h + 30}" text-anchor="middle" font-size="11" '
            f'fill="#57606a">{_esc(r.date[5:10])}</text>'
        )
    parts.append(
        f'<text x="{left + w / 2:.1f}" y="{height - 6}" text-anchor="middle" font-size="12">'
        f"commit (in run order; date below)</text>"
        f'<text x="14" y="{top + h / 2:.1f}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + h / 2:.1f})">{_esc(shown_unit or "value")}</text>'
    )
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        pts = [(X(r.order), Y(v / factor), r, v) for r, v in zip(s.runs, s.values) if _finite(v)]
        if log:
            pts = [p for p in pts if p[3] > 0]
        if len(pts) > 1:
            d = " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in pts)
            parts.append(
                f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
            )
        flagged = {id(c.run): c.kind for c in s.changes}
        for x, y, r, v in pts:
            tip = f"{s.label}: {fmt(v, unit)} - commit {r.commit}, {r.date}, {r.machine}"
            dot = (
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}">'
                f"<title>{_esc(tip)}</title></circle>"
            )
            parts.append(f'<a href="{_esc(root + r.href)}">{dot}</a>' if r.href else dot)
            if id(r) in flagged:
                ring = "#cf222e" if flagged[id(r)] == "regression" else "#1a7f37"
                parts.append(
                    f'<circle class="change {flagged[id(r)]}" cx="{x:.1f}" cy="{y:.1f}" r="9" '
                    f'fill="none" stroke="{ring}" stroke-width="2.5"/>'
                )
    parts.append("</svg>")
    return "".join(parts)


def sparkline(
    values: list[float], flagged: list[int] = (), width: int = 120, height: int = 28
) -> str:
    """A small inline SVG of ``values`` in order, the ``flagged`` indices marked."""
    vals = [v for v in values if _finite(v)]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    n = len(values)

    def X(i):
        return 3 + (width - 6) * (i / (n - 1) if n > 1 else 0.5)

    def Y(v):
        return height - 3 - (height - 6) * ((v - lo) / (hi - lo) if hi > lo else 0.5)

    pts = [(X(i), Y(v)) for i, v in enumerate(values) if _finite(v)]
    d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
    marks = "".join(
        f'<circle cx="{X(i):.1f}" cy="{Y(values[i]):.1f}" r="3" fill="#cf222e"/>'
        for i in flagged
        if 0 <= i < n and _finite(values[i])
    )
    end = f'<circle cx="{pts[-1][0]:.1f}" cy="{pts[-1][1]:.1f}" r="2" fill="#1d2125"/>'
    return (
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'aria-hidden="true" xmlns="http://www.w3.org/2000/svg">'
        f'<polyline points="{d}" fill="none" stroke="#57606a" stroke-width="1.5"/>'
        f"{marks}{end}</svg>"
    )


# ---------------------------------------------------------------------------------------------
# What the pages show: charts per metric and machine, a table of every series with its
# sparkline, the change points in words, and the stored runs with their links and noise.


def noise(record) -> dict | None:
    """The noise context a run stored with its environment (records/environment.noise_context:
    the 1-minute load average at start and end, the CPU time, the core count), where it did:
    {"text", "loaded"}; loaded when the load exceeded the core count."""
    return environment_noise(record.environment)


def environment_noise(env) -> dict | None:
    """:func:`noise` of a stored Environment."""
    extra = env.model_extra or {}
    ctx = extra.get("noise") if isinstance(extra.get("noise"), dict) else extra

    def one(x):  # a stored load average is [1 min, 5 min, 15 min]
        x = x[0] if isinstance(x, (list, tuple)) and x else x
        return x if _finite(x) else None

    start, end = one(ctx.get("load_start")), one(ctx.get("load_end"))
    cpu, cores = one(ctx.get("cpu_time_s")), one(ctx.get("cpu_count") or extra.get("cpu_count"))
    children = one(ctx.get("children_cpu_time_s"))
    if start is None and end is None and cpu is None:
        return None
    bits = []
    if start is not None or end is not None:
        bits.append(
            f"load {fmt(start)} at the start, {fmt(end)} at the end"
            + (f" on {fmt(cores)} cores" if cores else "")
        )
    if cpu is not None:
        total = cpu + (children or 0.0)
        bits.append(f"CPU time {fmt(total, 's')}")
    loaded = ctx.get("loaded")
    if not isinstance(loaded, bool):
        peak = max((v for v in (start, end) if v is not None), default=None)
        loaded = bool(cores and peak is not None and peak > cores)
    return {"text": ", ".join(bits), "loaded": loaded}


def _runs_view(runs: list[Run], root: str, what) -> list[dict]:
    return [
        {
            "when": r.date,
            "commit": r.commit,
            "machine": r.machine,
            "href": root + r.href if r.href else None,
            "what": what(r),
            "command": r.record.environment.command,
            "noise": noise(r.record),
        }
        for r in reversed(runs)
    ]


def _change_view(c: Change, root: str) -> dict:
    return {"kind": c.kind, "text": c.words(), "href": root + c.run.href if c.run.href else None}


def suite_view(runs: list[Run], root: str = "../") -> dict:
    """The history section of a suite's page."""
    hist = suite_history(runs)
    charts, rows = [], []
    for m in hist["metrics"]:
        machines = list(dict.fromkeys(s.machine for s in m["series"]))
        for machine in machines:
            mine = [s for s in m["series"] if s.machine == machine]
            # the flagged series first, then the rest in grid order, up to MAX_CHART_LINES
            shown = sorted(mine, key=lambda s: not s.changes)[:MAX_CHART_LINES]
            orders = [r for s in mine for r in s.runs]
            better = {"higher": "higher is better", "lower": "lower is better"}.get(m["better"])
            charts.append(
                {
                    "title": f"{m['name']} by commit on {machine}",
                    "svg": history_svg(shown, orders, m["unit"], f"{m['name']} on {machine}", root),
                    "legend": [
                        {"label": s.label, "colour": PALETTE[i % len(PALETTE)]}
                        for i, s in enumerate(shown)
                    ],
                    "caption": f"{len(shown)} of {len(mine)} grid points"
                    + (" (every one is in the table below)" if len(shown) < len(mine) else "")
                    + f"; {better or 'median of the repeats'}; a point links to its stored run.",
                }
            )
            factor, shown = readable_unit([v for s in mine for v in s.values], m["unit"])
            for s in mine:
                flagged = [s.runs.index(c.run) for c in s.changes]
                rows.append(
                    {
                        "label": s.label,
                        "machine": machine,
                        "spark": sparkline(s.values, flagged),
                        "runs": len(s.values),
                        "latest": fmt(s.values[-1], m["unit"])
                        if m["unit"] in ("s", "B", "%", "")
                        else f"{fmt(s.values[-1] / factor)} {shown}",
                        "changes": [_change_view(c, root) for c in s.changes],
                    }
                )
    return {
        "changes": [_change_view(c, root) for c in hist["changes"]],
        "charts": charts,
        "rows": rows,
        "runs": _runs_view(runs, root, lambda r: f"{len(r.record.records)} records"),
        "commits": len({r.commit for r in runs}),
        "machines": len({r.machine for r in runs}),
        "hist": hist,
    }


def reproduction_view(runs: list[Run], root: str = "../") -> dict:
    """The history section of a reproduction's page: its counts by commit, the change points of
    the agreeing count, and the cells whose number or grade moved."""
    hist = reproduction_history(runs)
    charts = []
    for s in hist["series"]:
        counts = [hist["counts"][id(r)] for r in s.runs]
        lines = []
        for key, label in (("agree", "agree"), ("explained", "explained"), ("deviate", "deviate")):
            line = Series(label, s.machine, list(s.runs), [float(c.get(key, 0)) for c in counts])
            if key == "agree":
                line.changes = s.changes
            lines.append(line)
        charts.append(
            {
                "title": f"compared cells by commit on {s.machine}",
                "svg": history_svg(lines, s.runs, "cells", f"cell counts on {s.machine}", root),
                "legend": [{"label": x.label, "colour": PALETTE[i]} for i, x in enumerate(lines)],
                "caption": "Counts of the compared cells per stored run; a point links to its run.",
            }
        )
    cells = []
    for c in hist["cells"]:
        values = [o if _finite(o) else math.nan for _, o, _ in c["points"]]
        cells.append(
            {
                "row": c["row"],
                "column": c["column"],
                "spark": sparkline(values),
                "first": c["first"],
                "last": c["last"],
                "values": " -> ".join(fmt(o) for _, o, _ in c["points"][-4:]),
            }
        )
    return {
        "changes": [_change_view(c, root) for c in hist["changes"]],
        "charts": charts,
        "cells": cells,
        "cells_total": hist["cells_total"],
        "runs": _runs_view(runs, root, lambda r: _agree_words(hist["counts"][id(r)])),
        "commits": len({r.commit for r in runs}),
        "machines": len({r.machine for r in runs}),
        "hist": hist,
    }


def _agree_words(c: dict) -> str:
    return f"{c.get('agree', 0)} of {c.get('compared', 0)} agree"
