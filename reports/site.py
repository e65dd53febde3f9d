"""The static results site: index by paper, a page per reproduction and suite, raw JSON beside.

Everything is relative links and inline CSS, so the site works from the file system and from
any static host. Pages are written atomically; the build can be rerun over an existing folder.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

from moe_repro import catalog
from moe_repro.records.atomic import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    inside,
)
from moe_repro.records.environment import git_state
from moe_repro.records import grading
from moe_repro.records.record import VERDICTS, ReproductionRecord, SuiteRecord, dump, grade_counts
from moe_repro.reports import html
from moe_repro.reports.export import frame, write
from moe_repro.reports import history_page
from moe_repro.reports.compare_page import commit_order, write_compare_page
from moe_repro.reports.figures import render_figure
from moe_repro.reports.numbers import BYTES_NOTE, binary_ticks, fmt, is_number, readable_unit
from moe_repro.reports.peers_page import write_peers_page
from moe_repro.reports.validation_page import write_validation_page


def _paper_facts(paper: catalog.Paper) -> dict:
    """What the templates may show about a paper: key, short name, full title, authors, venue,
    year, link and its BibTeX entry."""
    return {**asdict(paper), "authors": list(paper.authors), "bibtex": paper.bibtex}


# What drawing or laying out a stored record that validates but holds unexpected values raises
_BAD_DATA = (KeyError, TypeError, ValueError, AttributeError, IndexError)


def _warn(message: str) -> None:
    sys.stderr.write(f"repro: warning: {message}\n")


def write_reproduction_page(
    directory: Path,
    record: ReproductionRecord,
    home: str | None = None,
    name: str | None = None,
    history: dict | None = None,
) -> Path:
    """One reproduction's page with its figures (PNG + SVG), raw JSON and CSV, in ``directory``.
    ``name``: the catalog's id the files are named after (default: the record's id, which the
    schema restricts to a plain name); ``history``: its runs by commit
    (history_page.reproduction_view)."""
    rid, payload = name or record.id, dump(record)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    figures = []
    for fig in record.figures:
        try:
            drawn = render_figure(fig, provenance=_provenance(record, fig["title"]))
            names = {ext: inside(directory, f"{rid}-{fig['name']}.{ext}").name for ext in drawn}
        except _BAD_DATA as e:
            # a stored figure is data someone else wrote: one that cannot be drawn is named and
            # left out; the page and its numbers still stand
            _warn(
                f"{rid}: figure {str(fig.get('name'))[:60]!r} not drawn: {type(e).__name__}: "
                f"{' '.join(str(e).split())[:200]}"
            )
            continue
        for ext, data in drawn.items():
            atomic_write_bytes(inside(directory, names[ext]), data)
        figures.append({"title": fig["title"], **names})
    atomic_write_json(inside(directory, f"{rid}.json"), payload)
    atomic_write_text(inside(directory, f"{rid}.csv"), write(frame(record), "csv"))
    try:
        paper = _paper_facts(catalog.paper(record.paper))
    except (KeyError, ValueError):
        paper = None
    return atomic_write_text(
        inside(directory, f"{rid}.html"),
        html.render_reproduction(
            payload,
            raw_json=f"{rid}.json",
            figures=figures,
            home=home,
            raw_csv=f"{rid}.csv",
            paper=paper,
            history=history,
        ),
    )


def _provenance(record: ReproductionRecord, title: str) -> dict[str, str]:
    """What a figure file carries in its metadata: where its numbers came from."""
    env = record.environment
    extra = env.model_extra or {}
    return {
        "title": f"{record.id}: {title}",
        "commit": f"{env.git_commit or 'unknown'}{' (uncommitted changes)' if env.git_dirty else ''}",
        "date": env.timestamp,
        "machine": f"{extra.get('device') or extra.get('cpu_model')}, torch {extra.get('torch')}",
        "how": record.how,
        "parameters": " ".join(f"{k}={v}" for k, v in record.params.items()),
        "command": env.command or record.command,
    }


def build_site(store, out_dir: str | Path, progress=None) -> Path:
    """Write the site; ``progress(done, total, what)``, when given, is called before each page
    and once at the end (done == total)."""
    # What exists comes from the catalog (reports never import the live spec or suite registries).
    out = Path(out_dir)
    by_paper: dict[str, list[dict]] = {key: [] for key in catalog.PAPERS}
    watch: list[dict] = []  # the index's summary grid: one tile per result with stored runs
    every_run: list = []  # every published run, for the compare page's commit order
    # + peers, validation, compare, index
    total = len(catalog.REPRODUCTIONS) + len(catalog.SUITES) + 4
    step = iter(range(total))
    report = progress or (lambda done, total, what: None)
    for entry in catalog.REPRODUCTIONS.values():
        report(next(step), total, f"reproduction {entry.id}")
        rid, element, how, what, issue = (
            entry.id,
            entry.paper_element,
            entry.how,
            entry.what,
            entry.issue,
        )
        implemented = entry.implemented
        published = (
            history_page.publish_runs(store, "reproduction", rid, out) if implemented else []
        )
        record = published[-1].record if published else None
        every_run += published
        href = f"repro/{rid}.html"
        if record is not None:
            try:
                hv = history_page.reproduction_view(published)
                write_reproduction_page(
                    out / "repro", record, home="../index.html", name=rid, history=hv
                )
                watch.append(_tile(rid, href, "reproduction", hv))
            except _BAD_DATA as e:
                # a stored result that validates but cannot be laid out: named, shown as not run
                _warn(
                    f"{rid}: its stored result cannot be shown ({type(e).__name__}: "
                    f"{' '.join(str(e).split())[:200]}); shown as not yet run"
                )
                record = None
        row = {
            "id": rid,
            "element": element,
            "how": how,
            "href": href,
            "when": None,
            "summary": {},
            "counts": None,
            "needs": run_needs(entry),
        }
        if record is None:
            row["state"] = "not yet run" if implemented else "planned"
            atomic_write_text(
                inside(out / "repro", f"{rid}.html"),
                html.environment()
                .get_template("pending.html")
                .render(
                    id=rid,
                    element=element,
                    how=how,
                    what=what,
                    issue=issue,
                    title=entry.title,
                    description=entry.description,
                    implemented=implemented,
                    needs=row["needs"],
                    home="../index.html",
                    css=html.css(),
                ),
            )
        else:
            counts = record.agreement
            row.update(
                counts=counts,
                agreement=grading.agreement_line(counts),
                summary=grade_counts(c.verdict for c in record.cells),
                when=record.timestamp,
            )
        by_paper.setdefault(entry.paper, []).append(row)

    suites = []
    for name, suite in catalog.SUITES.items():
        report(next(step), total, f"suite {name}")
        published = history_page.publish_runs(store, "suite", name, out)  # oldest first
        runs = [r.record for r in published]
        every_run += published
        href = f"suites/{name}.html"
        try:
            hv = history_page.suite_view(published) if published else None
            write_suite_page(
                out / "suites",
                name,
                runs,
                home="../index.html",
                needs=run_needs(suite),
                history=hv,
            )
            if hv is not None:
                watch.append(_tile(name, href, "suite", hv))
        except _BAD_DATA as e:
            # a stored run that validates but cannot be laid out (a record someone else wrote):
            # named, and the page says how to make a run instead
            _warn(
                f"suite {name}: its stored runs cannot be shown ({type(e).__name__}: "
                f"{' '.join(str(e).split())[:200]}); its page lists no run"
            )
            runs = []
            write_suite_page(
                out / "suites", name, runs, home="../index.html", needs=run_needs(suite)
            )
        latest = runs[-1] if runs else None
        suites.append(
            {
                "name": name,
                "description": suite.description,
                "href": href,
                "needs": run_needs(suite),
                "records": len(latest.records) if latest else 0,
                "when": latest.timestamp if latest else None,
            }
        )

    report(next(step), total, "peers page")
    write_peers_page(store, out)
    report(next(step), total, "validation page")
    write_validation_page(store, out)
    report(next(step), total, "compare page")
    write_compare_page(store, out, commit_order(every_run))
    report(next(step), total, "index")
    papers = [
        {
            **_paper_facts(catalog.paper(k)),
            "reproductions": rows,
            "grades": _sum_counts(r["summary"] for r in rows),
            "agreement": grading.agreement_line(
                grading.add_agreement(*(r["counts"] for r in rows if r["counts"]))
            ),
            "run": sum(r["counts"] is not None for r in rows),
        }
        for k, rows in by_paper.items()
        if rows
    ]
    built = {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **git_state(),
    }
    watch.sort(key=lambda t: (not t["regressions"], not t["improvements"], t["kind"], t["name"]))
    index = atomic_write_text(
        inside(out, "index.html"), html.render_index(papers, suites, built=built, watch=watch)
    )
    report(total, total, "")
    return index


def _tile(name: str, href: str, kind: str, hv: dict) -> dict:
    """One tile of the index's summary grid: the result's sparkline (a suite: the geometric mean
    of its first headline metric over the grid, relative to each point's first run; a
    reproduction: its agreeing cells) and its change points."""
    line = hv["hist"]["summary"]
    values = [v for _, v in line]
    flagged_runs = {id(c.run) for c in hv["hist"]["changes"]}
    flagged = [i for i, (run, _) in enumerate(line) if id(run) in flagged_runs]
    changes = hv["changes"]
    return {
        "name": name,
        "href": href,
        "kind": kind,
        "spark": history_page.sparkline(values, flagged),
        "runs": len(hv["runs"]),
        "commits": hv["commits"],
        "regressions": [c for c in changes if c["kind"] == "regression"],
        "improvements": [c for c in changes if c["kind"] == "improvement"],
    }


def run_needs(entry) -> dict:
    """What a run of a reproduction or suite needs, for pages not run yet: the hardware, the
    expected minutes at its defaults on a 2-core CPU machine (None: not measured yet), and the
    command (catalog fields ``needs`` and ``minutes``)."""
    if isinstance(entry, catalog.SuiteEntry):
        command = f"repro bench {entry.name}"
    else:
        command = f"repro run {entry.id}"
    return {"hardware": entry.needs, "minutes": entry.minutes, "command": command}


def _sum_counts(summaries) -> dict[str, int]:
    total: dict[str, int] = {}
    for summary in summaries:
        for grade, n in summary.items():
            total[grade] = total.get(grade, 0) + n
    return {v: total[v] for v in VERDICTS if total.get(v)}


# ---------------------------------------------------------------------------------------------
# Suite pages: what the latest run measured, against what it swept, and how it moved over runs.

CELL_UNITS = ("s", "B", "%")  # units the formatter writes into each cell (3.1 ms, 2 MiB, 5%)
MAX_SWEEP_LINES = 12  # lines on one metric-vs-parameter figure (the style cycle has 30)
MAX_TICKS_AT_DATA = 12  # a swept axis with at most this many values gets a tick at each
LOG_SPAN = 100.0  # values spanning more than two decades go on a log axis
ENVIRONMENT_SHOWN = (
    "device",
    "device_type",
    "device_count",
    "cpu_model",
    "cpu_count",
    "torch",
    "torch_threads",
    "python",
    "hostname",
)


def _key(value) -> str:
    """A hashable, type-exact stand-in for a record value (1, 1.0 and True stay apart)."""
    return json.dumps(value, sort_keys=True, default=str)


def _finite(x) -> bool:
    return is_number(x) and math.isfinite(x)


def _metric_present(run: SuiteRecord, name: str) -> bool:
    return any(_finite(r.get(name)) for r in run.records)


def headline_metrics(run: SuiteRecord) -> list:
    """time (the first declared metric), and the suite's first higher-is-better metric, or
    without one its peak memory: asv graphs one metric per figure; these are the two a reader
    asks about first."""
    declared = [m for m in run.metrics if _metric_present(run, m.name)]
    second = [m for m in declared[1:] if m.better == "higher"][:1]
    # no throughput: the memory it takes, where it measures one (moe-dispatch's peak bytes)
    second = second or [m for m in declared[1:] if m.unit == "B" and "peak" in m.name][:1]
    return declared[:1] + second


def split_params(
    run: SuiteRecord, records: list[dict] | None = None
) -> tuple[list[str], list[str]]:
    """(grid parameters whose value differs between records, those with one value), in grid order;
    parameters no record holds are left out."""
    records = run.records if records is None else records
    params = [p for p in run.params if any(p in r for r in records)]
    distinct = {p: {_key(r.get(p)) for r in records} for p in params}
    return [p for p in params if len(distinct[p]) > 1], [p for p in params if len(distinct[p]) == 1]


def swept_param(run: SuiteRecord, records: list[dict] | None = None) -> str | None:
    """The x of a metric-vs-parameter figure: the varying grid parameter with the most distinct
    numeric values (sizes, tokens, n); on a tie the one spanning the widest ratio (1 KiB-1 MiB
    before 2-4 ranks), then the first in grid order. None if no numeric parameter varies."""
    records = run.records if records is None else records
    varying, _ = split_params(run, records)
    numeric = [p for p in varying if all(_finite(r.get(p)) for r in records)]

    def reach(p):  # most distinct values first; on a tie, the one spanning the widest ratio
        values = {r[p] for r in records}
        positive = [v for v in values if v > 0]
        return len(values), max(positive) / min(positive) if positive else 0.0

    return max(numeric, key=reach) if numeric else None


def _spread(r: dict, name: str) -> tuple[float, float] | None:
    """The repeats' spread around a median: min-max where stored, else median +- IQR/2."""
    lo, hi = r.get(f"{name}_min"), r.get(f"{name}_max")
    if _finite(lo) and _finite(hi):
        return lo, hi
    iqr = r.get(f"{name}_iqr")
    if _finite(iqr):
        return r[name] - iqr / 2, r[name] + iqr / 2
    return None


def _spans_decades(values) -> bool:
    """Whether the positive values span more than two decades (zeros cannot sit on a log axis;
    a caption says where they were left out)."""
    vals = [v for v in values if _finite(v) and v > 0]
    return bool(vals) and max(vals) / min(vals) > LOG_SPAN


def _determined_by(records: list[dict], x: str, q: str) -> bool:
    """Whether parameter ``q`` takes one value per value of ``x`` (tokens and hidden derived from
    the message size): such a parameter moves along the line, it does not make another one."""
    seen: dict[str, str] = {}
    return all(seen.setdefault(_key(r.get(x)), _key(r.get(q))) == _key(r.get(q)) for r in records)


def _axis_label(metric, unit: str) -> str:
    return f"{metric.name} [{unit}]" if unit else metric.name


LABEL_SEP = " / "  # between parameter values in a legend: "flat / 1,048,576" (commas are digits)


def _label(r: dict, params: list[str]) -> str:
    return LABEL_SEP.join(fmt(r.get(p)) for p in params)


def sweep_figure(
    name: str, metric, run: SuiteRecord, max_lines: int = MAX_SWEEP_LINES
) -> dict | None:
    """The latest run's ``metric`` against its swept parameter: one line per combination of the
    other varying parameters, the median with its spread as a band, log axes where the values span
    more than two decades. Where no numeric parameter varies, a dot per category instead."""
    records = [r for r in run.records if _finite(r.get(metric.name))]
    if not records:
        return None
    varying, _ = split_params(run, records)
    x = swept_param(run, records)
    spreads = [_spread(r, metric.name) for r in records]
    factor, unit = readable_unit([r[metric.name] for r in records], metric.unit)
    ylabel = _axis_label(metric, unit)
    has_spread = any(s is not None and s[1] > s[0] for s in spreads)
    minmax = all(_finite(r.get(f"{metric.name}_min")) for r in records)
    caption = (
        "Median of the repeats"
        + (
            (
                "; shaded: min to max of the repeats"
                if minmax
                else "; shaded: median \N{PLUS-MINUS SIGN} IQR/2"
            )
            if has_spread
            else ""
        )
        + "."
    )
    if x is None:
        cats = []
        for r, sp in zip(records, spreads):
            cats.append(
                {
                    "label": _label(r, varying) or "all records",
                    "value": r[metric.name] / factor,
                    "lo": sp[0] / factor if sp else None,
                    "hi": sp[1] / factor if sp else None,
                    "group": fmt(r.get(varying[0])) if len(varying) > 1 else None,
                }
            )
        values = [c["value"] for c in cats]
        return {
            "kind": "dots",
            "name": f"sweep-{metric.name}",
            "categories": cats,
            "title": f"{name}: {metric.name} per " + (", ".join(varying) or "run"),
            "xlabel": ylabel + " (median)",
            "ylabel": LABEL_SEP.join(varying),
            "xscale": "log" if _spans_decades(values) else "linear",
            "legend_title": varying[0] if len(varying) > 1 else None,
            "caption": caption.replace("shaded", "bars"),
        }
    others = [p for p in varying if p != x and not _determined_by(records, x, p)]
    moving = [p for p in varying if p != x and p not in others]
    if moving:
        caption += f" {', '.join(moving)} change{'s' if len(moving) == 1 else ''} with {x} (see the table)."
    groups: dict[str, list[tuple[dict, tuple | None]]] = {}
    for r, sp in zip(records, spreads):
        groups.setdefault(_label(r, others) or metric.name, []).append((r, sp))
    series = []
    for label, rows in list(groups.items())[:max_lines]:
        rows.sort(key=lambda row: row[0][x])
        s = {
            "label": label,
            "x": [r[x] for r, _ in rows],
            "y": [r[metric.name] / factor for r, _ in rows],
        }
        if all(sp is not None for _, sp in rows):
            s.update(lo=[sp[0] / factor for _, sp in rows], hi=[sp[1] / factor for _, sp in rows])
        series.append(s)
    if len(groups) > max_lines:
        caption += (
            f" The first {max_lines} of {len(groups)} lines; all of them in the table and raw data."
        )
    xs = sorted({r[x] for r in records})
    ys = [v for s in series for v in s["y"]]
    xscale = "log" if _spans_decades(xs) else "linear"
    yscale = "log" if _spans_decades(ys) else "linear"
    if yscale == "log" and any(v <= 0 for v in ys):
        caption += " Zero values are not drawn on the log axis (see the table)."
        for s in series:  # a gap in the line, not a drop to the axis' floor
            for k in ("y", "lo", "hi"):
                if k in s:
                    s[k] = [v if v > 0 else math.nan for v in s[k]]
    # ticks at the swept values (every other one, or every third, on a long log axis), so that a
    # size axis reads 1K, 4K, 16K with K = 1,024 rather than decades that are no grid point
    ticks = (
        xs
        if len(xs) <= MAX_TICKS_AT_DATA
        else (xs[:: math.ceil(len(xs) / MAX_TICKS_AT_DATA)] if xscale == "log" else None)
    )
    binary = ticks is not None and binary_ticks(ticks)
    if metric.better == "higher" and ys:
        # a throughput's question is the machine's ceiling: the best this run measured, drawn
        # across (gemm: GFLOP/s vs size under the measured ceiling)
        best = max(v for v in ys if _finite(v))
        series.append(
            {"kind": "limit", "y": best, "label": f"measured ceiling {fmt(best)} {unit}".strip()}
        )
        loaded = history_page.noise(run)
        caption += " Dashed: the best median of this run, the ceiling this machine reached" + (
            "; the run was loaded (load above the core count), so the ceiling is low."
            if loaded and loaded["loaded"]
            else "."
        )
    return {
        "name": f"sweep-{metric.name}",
        "title": f"{name}: {metric.name} vs {x}",
        "xlabel": x + (" (K = 1,024)" if binary else ""),
        "ylabel": ylabel + " (median)",
        "series": series,
        "xscale": xscale,
        "yscale": yscale,
        "xticks": ticks,
        "xticks_binary": binary,
        "legend_title": LABEL_SEP.join(others) or None,
        "legend": bool(others),
        "caption": caption,
    }


def _machine(env: dict) -> list[tuple[str, str]]:
    """What ran the latest run, from its environment: the device that ran, not the parameter."""
    rows = []
    device = env.get("device")
    if device:
        kind = env.get("device_type")
        count = env.get("device_count")
        rows.append(
            (
                "device",
                f"{device}"
                + (
                    f" ({kind}" + (f", {count} visible" if count and count > 1 else "") + ")"
                    if kind
                    else ""
                ),
            )
        )
    if env.get("cpu_model"):
        rows.append(
            (
                "CPU",
                f"{env['cpu_model']}"
                + (f", {env['cpu_count']} cores" if env.get("cpu_count") else ""),
            )
        )
    if env.get("torch"):
        threads = env.get("torch_threads")
        rows.append(
            (
                "torch",
                f"{env['torch']}"
                + (f" ({threads} thread{'s' if threads != 1 else ''})" if threads else ""),
            )
        )
    for key in ("python", "hostname"):
        if env.get(key):
            rows.append((key, str(env[key])))
    return rows


def _cell(value, unit, scaled) -> str:
    """A table cell: in the column's scaled unit where it has one, else as fmt writes it."""
    if scaled is not None and _finite(value):
        return fmt(value / scaled[0])
    return fmt(value, unit)


def suite_view(run: SuiteRecord) -> dict:
    """The latest run laid out for a reader: the machine that ran it; the parameters every record
    shares, listed once; a compact table of the varying parameters, then the headline metrics
    (median and IQR), the suite's other table metrics, and #wrong where the suite checks."""
    records = run.records
    varying, constant = split_params(run)
    env = run.environment.model_dump()
    shown_device = env.get("device")
    constants = []
    for p in constant:
        text = f"{p}={fmt(records[0].get(p))}"
        if p == "device" and shown_device:
            text += (
                f" (ran on {shown_device}"
                + (f", {env['device_type']}" if env.get("device_type") else "")
                + ")"
            )
        constants.append(text)
    simulated = [bool(r.get("simulated")) for r in records]
    sim_note = None
    if any(simulated) and all(simulated):
        why = records[0].get("simulated_because")
        sim_note = "every record is simulated" + (f" ({why})" if why else "")
    sim_column = any(simulated) and not all(simulated)

    units = {m.name: m.unit for m in run.metrics}
    described = {m.name: m.description for m in run.metrics}
    headline = [m.name for m in headline_metrics(run)]
    extra = [m for m in run.table_metrics if m not in headline and _metric_present(run, m)][:3]
    columns = [{"label": p, "num": all(is_number(r.get(p)) for r in records)} for p in varying]
    if sim_column:
        columns.append({"label": "simulated", "num": False})
    # an IQR column only where some record has a spread (a simulation or one repeat has none)
    with_iqr = [
        m
        for m in headline
        if any(_finite(r.get(f"{m}_iqr")) and r[f"{m}_iqr"] != 0 for r in records)
    ]
    # a prefixed unit goes to the prefix its values reach (1.4e-4 TFLOP/s is 137 MFLOP/s): no
    # column of 0.0001371s; seconds, bytes and % are scaled per cell by the formatter
    scaled = {}
    for m in headline + extra:
        unit = units.get(m, "")
        if unit and unit not in CELL_UNITS:
            scaled[m] = readable_unit([r.get(m) for r in records], unit)

    def head_of(m: str) -> str:
        """The column head: the metric as stored, in its unit; a rescaled unit says both (a
        "tflops" column shown in MFLOP/s reads "tflops [TFLOP/s, shown in MFLOP/s]")."""
        stored, unit = units.get(m, ""), scaled.get(m, (1.0, units.get(m, "")))[1]
        if not unit or unit in CELL_UNITS:
            return m
        return f"{m} [{stored}, shown in {unit}]" if unit != stored else f"{m} [{unit}]"

    for m in headline:
        head = head_of(m)
        columns.append({"label": head, "sub": "median", "num": True, "title": described.get(m)})
        if m in with_iqr:
            columns.append({"label": "IQR", "sub": m, "num": True})
    for m in extra:
        head = head_of(m)
        columns.append({"label": head, "sub": "median", "num": True, "title": described.get(m)})
    has_wrong = any("wrong" in r for r in records)
    if has_wrong:
        columns.append(
            {"label": "#wrong", "num": True, "title": "elements the check found wrong (0: correct)"}
        )
    rows = []
    for r in records:
        row = [fmt(r.get(p)) for p in varying]
        if sim_column:
            row.append("yes" if r.get("simulated") else "no (real)")
        for m in headline:
            row.append(_cell(r.get(m), units.get(m), scaled.get(m)))
            if m in with_iqr:
                row.append(_cell(r.get(f"{m}_iqr"), units.get(m), scaled.get(m)))
        row += [_cell(r.get(m), units.get(m), scaled.get(m)) for m in extra]
        if has_wrong:
            row.append(fmt(r.get("wrong")))
        rows.append(row)
    wrong = sum(r["wrong"] for r in records if _finite(r.get("wrong")))
    shown = set(varying) | set(constant) | set(headline) | set(extra) | {"suite", "wrong"}
    suffixed = {f"{m.name}_{s}" for m in run.metrics for s in ("iqr", "min", "max")}
    hidden = [
        k
        for k in dict.fromkeys(k for r in records for k in r)
        if k not in shown and k not in suffixed and k != "samples"
    ]
    bytes_shown = any(units.get(m) == "B" for m in headline + extra)
    # the terminal's spread warning (reports/terminal.py): grid points whose samples disagree
    from moe_repro.reports.terminal import SPREAD_FLAG

    first = headline[0] if headline else None
    spread = [
        r
        for r in records
        if first
        and _finite(r.get(first))
        and r[first]
        and _finite(r.get(f"{first}_iqr"))
        and r[f"{first}_iqr"] / abs(r[first]) > SPREAD_FLAG
    ]
    return {
        "noise": history_page.noise(run),
        "spread": f"{len(spread)} of {len(records)} grid points have a spread (IQR / median of "
        f"{first}) above {SPREAD_FLAG:.0%}: their samples disagree (a busy machine, or too few "
        "repeats)"
        if spread
        else None,
        "machine": _machine(env),
        "constants": constants,
        "varying": varying,
        "columns": columns,
        "rows": rows,
        "has_wrong": has_wrong,
        "wrong": wrong,
        "simulated": sim_note,
        "no_spread": [m for m in headline if m not in with_iqr],
        "hidden": hidden,
        "bytes_note": BYTES_NOTE if bytes_shown else None,
        "interrupted": run.interrupted,
        "error": run.error,
        "matrices": matrix_views(run),
        "summary": run.summary,
    }


# Suites whose records cross methods with inputs (suites/imbalance.py: balancer x workload over
# seeds) get one matrix per setting of their other varying parameters: rows x columns, each cell
# the median over the spread parameter with its min-max, so the seed spread shows beside it.
MATRIX_AXES = ("balancer", "workload", "seed")
MATRIX_METRICS = ("max_over_mean", "token_straggler", "decide_us")
# What each matrix answers, in words (its title); the cells are tinted from best to worst
MATRIX_WORDS = {
    "max_over_mean": "max / mean load per rank (1 = balanced)",
    "token_straggler": "stragglers: tokens on the most loaded rank above the mean",
    "decide_us": "decision time",
}


def _heat(values: list[float | None], better: str) -> list[str | None]:
    """A background per cell from best (clear) to worst (red), linear over the matrix's range."""
    finite = [v for v in values if v is not None]
    if not finite or better not in ("lower", "higher"):
        return [None] * len(values)
    lo, hi = min(finite), max(finite)
    out = []
    for v in values:
        if v is None or hi == lo:
            out.append(None)
            continue
        t = (v - lo) / (hi - lo)
        t = t if better == "lower" else 1 - t
        out.append(f"rgba(207, 34, 46, {0.04 + 0.5 * t:.2f})")
    return out


def matrix_views(run: SuiteRecord) -> list[dict]:
    rows_key, cols_key, over = MATRIX_AXES
    records = [r for r in run.records if rows_key in r and cols_key in r]
    if not records:
        return []
    varying, _ = split_params(run, records)
    others = [p for p in varying if p not in MATRIX_AXES]
    units = {m.name: m.unit for m in run.metrics}
    better = {m.name: m.better for m in run.metrics}
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r.get(p) for p in others), []).append(r)
    out = []
    for key, group in groups.items():
        row_names = list(dict.fromkeys(r[rows_key] for r in group))
        col_names = list(dict.fromkeys(r[cols_key] for r in group))
        for metric in MATRIX_METRICS:
            if not any(_finite(r.get(metric)) for r in group):
                continue
            table = []
            for row in row_names:
                cells = []
                for col in col_names:
                    hits = [r for r in group if r[rows_key] == row and r[cols_key] == col]
                    values = sorted(float(r[metric]) for r in hits if _finite(r.get(metric)))
                    wrong = sum(int(r.get("wrong") or 0) for r in hits)
                    if not values:
                        cells.append({"text": "-", "bad": False, "mid": None})
                        continue
                    mid = (
                        values[len(values) // 2]
                        if len(values) % 2
                        else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
                    )
                    text = fmt(mid, units.get(metric))
                    if len(values) > 1:
                        text += f" ({fmt(values[0], units.get(metric))}-{fmt(values[-1], units.get(metric))})"
                    cells.append(
                        {
                            "text": text + (f" #wrong {wrong}" if wrong else ""),
                            "bad": bool(wrong),
                            "mid": mid,
                        }
                    )
                table.append({"name": row, "cells": cells})
            every = [c for row in table for c in row["cells"]]
            for c, tint in zip(every, _heat([c["mid"] for c in every], better.get(metric, ""))):
                c["heat"] = tint
            seeds = sorted({r.get(over) for r in group}, key=str)
            setting = ", ".join(f"{p}={fmt(v)}" for p, v in zip(others, key))
            out.append(
                {
                    "title": f"{MATRIX_WORDS.get(metric, metric)} ({metric}"
                    + (f" [{units[metric]}]" if units.get(metric) else "")
                    + ")"
                    + (f", {setting}" if setting else ""),
                    "columns": col_names,
                    "rows": table,
                    "note": f"median over {len(seeds)} {over}(s) {', '.join(map(str, seeds))}"
                    + (" (min-max in brackets)" if len(seeds) > 1 else ""),
                }
            )
    return out


def _write_figure(directory: Path, stem: str, fig: dict) -> dict:
    drawn = render_figure(fig)
    names = {ext: inside(directory, f"{stem}.{ext}").name for ext in drawn}
    for ext, data in drawn.items():
        atomic_write_bytes(inside(directory, names[ext]), data)
    return {"title": fig["title"], "caption": fig.get("caption", ""), **names}


def write_suite_page(
    directory: Path,
    name: str,
    runs: list[SuiteRecord],
    home: str | None = "../index.html",
    needs: dict | None = None,
    history: dict | None = None,
) -> Path:
    """One suite's page in ``directory`` from its stored runs (oldest first): the latest run's
    metric-vs-parameter figures and compact table, its raw JSON and CSV, and its history by
    commit with change points (``history``: history_page.suite_view of the runs as publish_runs
    copied them, so that points link to them; without, one whose points carry no link). With no
    run, a page that says how to make one."""
    directory = Path(directory)
    latest = runs[-1] if runs else None
    if latest is None:
        return atomic_write_text(
            inside(directory, f"{name}.html"),
            html.render_suite(name, None, None, [], home, needs=needs),
        )
    payload = dump(latest)
    raw = f"{name}.json"
    atomic_write_json(inside(directory, raw), payload)
    atomic_write_text(inside(directory, f"{name}.csv"), write(frame(latest), "csv"))
    sweeps = []
    view = suite_view(latest)
    # a suite crossing methods with inputs answers with its tinted matrices (balancer x
    # workload); its time-vs-parameter lines would be one per pair, dozens, led by a no-op's
    drawn = [] if view["matrices"] else headline_metrics(latest)
    for metric in drawn:  # the metrics as the newest stored run declared them
        fig = sweep_figure(name, metric, latest)
        if fig is not None:
            sweeps.append(_write_figure(directory, f"{name}-{fig['name']}", fig))
    hv = history or history_page.suite_view(history_page.unpublished(runs))
    return atomic_write_text(
        inside(directory, f"{name}.html"),
        html.render_suite(name, payload, raw, [], home, view=view, sweeps=sweeps, hv=hv),
    )
