"""jinja2 HTML pages (autoescaped; no external assets: the stylesheet is inlined)."""

from __future__ import annotations

import datetime as _dt
import re
from functools import lru_cache

from jinja2 import Environment, PackageLoader, Template, select_autoescape
from markupsafe import Markup

from moe_repro.reports.numbers import fmt

_TABLE_OPEN = re.compile(r"<table\b")


class _ScrollingTables(Template):
    """Every table of every page scrolls sideways inside its own box (``div.scroll``) instead of
    running off a narrow screen: the wrapper is added here, once, so no template can forget it.
    Only real tags match: text that mentions a table is autoescaped to ``&lt;table``."""

    def render(self, *args, **kwargs) -> str:
        page = super().render(*args, **kwargs)
        return _TABLE_OPEN.sub('<div class="scroll"><table', page).replace(
            "</table>", "</table></div>"
        )


@lru_cache(maxsize=1)
def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("moe_repro.reports", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.template_class = _ScrollingTables
    env.filters["num"] = _num
    env.filters["pct"] = lambda x: "" if x is None else f"{x:+.2%}"
    env.filters["when"] = when
    env.filters["deviation"] = deviation
    env.filters["agreement"] = agreement_line
    env.filters["minutes"] = minutes
    # What every letter, grade and cause means, and the grading policy: shown on the index and
    # on every page.
    from moe_repro import catalog
    from moe_repro.records.record import CAUSE_MEANING, GRADE_MEANING

    env.globals.update(
        how_meaning=catalog.HOW_MEANING,
        how_words=catalog.HOW,
        grade_meaning=GRADE_MEANING,
        cause_meaning=CAUSE_MEANING,
        policy=policy(),
    )
    return env


def policy() -> dict:
    """The grading policy as the site states it, read from records/grading.py (the rules are
    written there once; the site only quotes them)."""
    import inspect

    from moe_repro.records import grading

    claims = inspect.getdoc(grading.read_claim) or ""
    return {
        "classes": dict(grading.GRADE_CLASSES),
        "tolerance": f"{grading.PREDICTION_TOLERANCE:.0%}",
        "tolerance_reason": grading.PREDICTION_TOLERANCE_REASON,
        "claims": claims,
        "min_seeds": grading.MIN_SEEDS,
        "seeds": (
            f"A sampled cell is computed at {grading.MIN_SEEDS} or more seeds (by "
            f"default seeds {', '.join(map(str, grading.SEEDS))}) and each seed is "
            f"graded by the prediction rule. The grade every seed gives stands (seeds "
            f"that all agree, some by match and some by close, give close); a grade "
            f"that differs between seeds is seed-dependent, never close. The cell "
            f"shows the range over seeds and the fraction of seeds that agree."
        ),
        "explained": (
            "A deviation is explained only by a computation: the cell is recomputed "
            "with the cause removed, and that value agrees with the paper under the "
            "same class. Without such a recomputation, or when it still disagrees, "
            "the cell deviates. A deviation our own model, simulator, planner or "
            "balancer causes is never explained: the cell deviates and names the "
            "component at fault."
        ),
        "derived": (
            "A cell derived from another cell (MFU from TFLOPS) is shown but counted "
            "once, at its source."
        ),
    }


def agreement_line(cells_or_counts) -> str:
    """'x of y compared cells agree, e explained, z deviate, w seed-dependent' for a list of
    cells or a dict of counts (records/grading.py)."""
    from moe_repro.records import grading

    if isinstance(cells_or_counts, dict):
        return grading.agreement_line(cells_or_counts)
    return grading.agreement_line(grading.agreement(cells_or_counts))


def deviation(cell: dict) -> str:
    """A cell's deviation as a reader wants it: "+3.0 pp" for percent cells, "+5.2%" otherwise."""
    d = cell.get("deviation")
    if d is None:
        return ""
    if cell.get("deviation_unit") == "pp":
        return f"{d:+.1f} pp"
    return f"{d:+.1%}"


def _num(x, unit: str | None = None) -> str:
    """``{{ x|num }}``, ``{{ x|num("s") }}``: the site's one number format (reports/numbers.py)."""
    return fmt(x, unit)


def when(timestamp: str | None) -> str:
    """An ISO timestamp as a reader scans it: "2026-11-23 10:32 UTC" (as stored if unparsable)."""
    if not timestamp:
        return ""
    try:
        t = _dt.datetime.fromisoformat(timestamp)
    except (TypeError, ValueError):
        return str(timestamp)
    if t.tzinfo is not None:
        t = t.astimezone(_dt.timezone.utc)
        return t.strftime("%Y-%m-%d %H:%M UTC")
    return t.strftime("%Y-%m-%d %H:%M")


def minutes(m: float | None) -> str:
    """Expected run time as a reader plans with it: "20 s", "3 min", "1.5 h"."""
    if m is None:
        return ""
    if m < 1:
        return f"{max(5, round(m * 60 / 5) * 5)} s"
    if m < 90:
        return f"{m:.0f} min"
    return f"{m / 60:.1f} h"


def _noise(payload: dict) -> dict | None:
    """The run's noise context (load, CPU time) from its stored environment, where it has one."""
    from moe_repro.records.record import Environment
    from moe_repro.reports.history_page import environment_noise

    try:
        return environment_noise(Environment.model_validate(payload.get("environment") or {}))
    except ValueError:
        return None


def css() -> Markup:
    """The stylesheet, marked safe: it is our own file, and autoescaping it turns its quotes into
    &#34; inside <style>, which breaks every rule after the first quoted font name."""
    return Markup(environment().loader.get_source(environment(), "style.css")[0])


def render_reproduction(
    payload: dict,
    raw_json: str | None = None,
    figures: list[dict] | None = None,
    home: str | None = None,
    raw_csv: str | None = None,
    paper: dict | None = None,
    history: dict | None = None,
) -> str:
    """A reproduction's page, answer first: the paper's claims and our evidence as a short list,
    then the figures in the paper's form, then the graded cells; ungraded cells collapse behind a
    toggle and long investigations (``detail``) sit in a linked section at the bottom.
    ``paper``: its paper's facts (title, authors, venue, BibTeX); ``history``: its stored runs
    by commit (reports/history_page.reproduction_view)."""
    from moe_repro.records import grading
    from moe_repro.records.record import grade_counts

    cells = [dict(c) for c in payload.get("cells", [])]
    details = []
    for c in cells:
        words = (c.get("note") or "").split()
        if len(words) > NOTE_SHOWN_WORDS:  # a record written before notes were kept short
            c["detail"] = "\n\n".join(t for t in (c["note"], c.get("detail")) if t)
            c["note"] = " ".join(words[:NOTE_SHOWN_WORDS]) + " …"
        if c.get("detail"):
            details.append(c)
            c["detail_id"] = f"detail-{len(details)}"
        c["extras"] = cell_extras(c)
    graded = [c for c in cells if c["verdict"] in grading.COMPARED]
    ungraded = [c for c in cells if c["verdict"] not in grading.COMPARED]
    counts = grading.agreement(cells)
    return (
        environment()
        .get_template("reproduction.html")
        .render(
            p=payload,
            raw_json=raw_json,
            raw_csv=raw_csv,
            figures=figures or [],
            home=home,
            css=css(),
            paper=paper,
            hv=history,
            noise=_noise(payload),
            grades=grade_counts(c["verdict"] for c in cells),
            counts=counts,
            agreement=grading.agreement_line(counts),
            answers=answers(cells),
            graded=graded,
            ungraded=ungraded,
            ungraded_counts=grade_counts(c["verdict"] for c in ungraded),
            details=details,
            # a paper table is laid out as the paper's grid; a figure's points are in its figures
            grid=paper_grid(payload) if "Table" in str(payload.get("element", "")) else None,
        )
    )


# A note is the one-line why (reproductions/spec.py keeps it to 60 words); a longer one, from a
# record written before that rule, is cut here and shown whole in the investigations section.
NOTE_SHOWN_WORDS = 60
ANSWERS_SHOWN = 12  # items of the answer list; the rest are in the graded cells below


def answers(cells: list[dict]) -> dict:
    """The short list a page opens with: each claim the paper states in words, then each
    compared number that does not simply agree (deviates, explained, seed-dependent), with ours,
    the grade and the one-line why (the note); the paper values that agree are counted in one
    line, and the claims that are no evidence (echo, not reproduced) in another. Derived cells
    are left out (their source stands for them)."""
    from moe_repro.records.record import grade_counts

    from moe_repro.records.grading import COMPARED

    stated = [
        c
        for c in cells
        if c.get("grade_class") == "claim" or c["verdict"] in ("claim-holds", "claim-fails")
    ]
    # a claim that follows from our own formulas (echo) or that ours cannot test is no evidence:
    # counted in one line, shown with the ungraded cells
    claims = [c for c in stated if c["verdict"] in COMPARED and not c.get("derived_from")]
    untested = [c for c in stated if c["verdict"] not in COMPARED]
    order = {"deviates": 0, "seed-dependent": 1, "explained": 2}
    numbers = sorted(
        (
            c
            for c in cells
            if c not in stated and c["verdict"] in order and not c.get("derived_from")
        ),
        key=lambda c: order[c["verdict"]],
    )
    agreeing = [
        c
        for c in cells
        if c not in stated and c["verdict"] in ("match", "close") and not c.get("derived_from")
    ]
    items = [{"claim": True, **c} for c in claims] + [{"claim": False, **c} for c in numbers]
    by_grade = {g: sum(c["verdict"] == g for c in agreeing) for g in ("match", "close")}
    return {
        "items": items[:ANSWERS_SHOWN],
        "more": max(0, len(items) - ANSWERS_SHOWN),
        "agreeing": len(agreeing),
        "agreeing_by": {g: n for g, n in by_grade.items() if n},
        "untested": grade_counts(c["verdict"] for c in untested),
    }


def _value(x, unit: str = "") -> str:
    if isinstance(x, (list, tuple)):
        return " to ".join(_value(v, unit) for v in (min(x), max(x))) if x else ""
    return f"{fmt(x)}{' ' + unit if unit and x is not None else ''}"


def cell_extras(c: dict) -> list[str]:
    """What the policy recorded with a cell, as short lines for its row: the class of number,
    the recomputation with a cause removed, the seeds, how the paper's words were read, our
    component at fault, the cell it is derived from."""
    out = []
    unit = c.get("unit") or ""
    cls = c.get("grade_class")
    if cls:
        out.append("claim in words" if cls == "claim" else f"class: {cls}")
    cf = c.get("counterfactual")
    if cf:
        out.append(
            f"recomputed with {cf.get('removed') or cf.get('cause')}: "
            f"{_value(cf.get('ours'), unit)} ({cf.get('grade') or 'not graded'})"
        )
    seeds = c.get("seeds")
    if seeds:
        if seeds.get("holds") is not None:
            holds = seeds["holds"]
            out.append(f"holds at {sum(map(bool, holds))} of {len(holds)} seeds")
        elif seeds.get("values"):
            vals = seeds["values"]
            lo, hi = seeds.get("range") or (min(vals), max(vals))
            agree = seeds.get("agree")
            out.append(
                f"{len(vals)} seeds: {_value(lo)} to {_value(hi, unit)}"
                + (f", {agree:.0%} of seeds agree" if agree is not None else "")
            )
    if c.get("reading"):
        out.append(c["reading"])
    if c.get("fault"):
        out.append(f"at fault: {c['fault']} (ours)")
    if c.get("derived_from"):
        out.append(f"derived from {c['derived_from']} (counted there)")
    return out


PAPER_GRID_MAX_COLUMNS = 8


def paper_grid(payload: dict) -> dict | None:
    """The cells laid out as the paper's table is: its rows down, its columns across, each cell
    the paper's printed value beside ours with the grade's colour.

    By default the cells' own rows and columns make the grid, in the cells' order; None when they
    do not form a grid a reader can scan (one column, or more than PAPER_GRID_MAX_COLUMNS). A
    reproduction whose table has grouped columns (a header over sub-columns, e.g. forward and
    backward under each method) gives its layout in ``extra["paper_layout"]``:
    ``{"corner": str, "rows": [cell row, ...], "groups": [{"label": str, "columns":
    [{"label": str, "column": cell column}, ...]}, ...]}``; it is shown as given, however many
    columns, and the cells it does not place are counted in ``outside``. Where the paper's rows
    are our columns (a transposed table), a row is ``{"label": str, "keys": [[cell row, cell
    column] or None, ...]}``, one key per column."""
    cells = payload.get("cells", [])
    at = {(c["row"], c["column"]): c for c in cells}
    layout = (payload.get("extra") or {}).get("paper_layout")
    if layout:
        return _laid_out_grid(layout, at)
    rows = list(dict.fromkeys(c["row"] for c in cells))
    columns = list(dict.fromkeys(c["column"] for c in cells))
    if len(columns) < 2 or len(columns) > PAPER_GRID_MAX_COLUMNS or len(rows) < 2:
        return None
    return {
        "columns": columns,
        "rows": [{"label": r, "cells": [at.get((r, col)) for col in columns]} for r in rows],
    }


def _laid_out_grid(layout: dict, at: dict) -> dict:
    """``paper_grid`` for a reproduction's own ``paper_layout`` (see there)."""
    groups = [{"label": g["label"], "span": len(g["columns"])} for g in layout["groups"]]
    columns = [sub.get("column") for g in layout["groups"] for sub in g["columns"]]
    rows = [
        {"label": r["label"], "keys": [tuple(k) if k else None for k in r["keys"]]}
        if isinstance(r, dict)
        else {"label": r, "keys": [(r, col) for col in columns]}
        for r in layout["rows"]
    ]
    placed = {key for r in rows for key in r["keys"] if key in at}
    return {
        "corner": layout.get("corner", ""),
        "groups": groups,
        "columns": [sub["label"] for g in layout["groups"] for sub in g["columns"]],
        "rows": [
            {"label": r["label"], "cells": [at.get(key) if key else None for key in r["keys"]]}
            for r in rows
        ],
        "outside": len(at) - len(placed),
    }


def render_index(
    papers: list[dict],
    suites: list[dict],
    built: dict | None = None,
    watch: list[dict] | None = None,
) -> str:
    """The index: ``watch`` is the summary grid of change points (one tile per suite and
    reproduction with stored runs, each with its sparkline), shown first."""
    return (
        environment()
        .get_template("index.html")
        .render(papers=papers, suites=suites, built=built or {}, watch=watch or [], css=css())
    )


def render_suite(
    name: str,
    payload: dict | None,
    raw_json: str | None,
    history: list[dict],
    home: str,
    graphs: list[dict] | None = None,
    view: dict | None = None,
    sweeps: list[dict] | None = None,
    needs: dict | None = None,
    hv: dict | None = None,
) -> str:
    """A suite's page: ``view`` is the latest run laid out by reports/site.py (machine, constant
    and varying parameters, the compact table), ``sweeps`` its metric-vs-parameter figures,
    ``graphs`` the history figures, ``history`` the stored runs, ``needs`` what a run needs
    (for a suite never run), ``hv`` the history by commit (reports/history_page.suite_view)."""
    return (
        environment()
        .get_template("suite.html")
        .render(
            name=name,
            p=payload,
            raw_json=raw_json,
            history=history,
            home=home,
            graphs=graphs or [],
            view=view,
            sweeps=sweeps or [],
            needs=needs,
            hv=hv,
            css=css(),
        )
    )
