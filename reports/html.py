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
        return _TABLE_OPEN.sub('<div class="scroll"><table', page).replace("</table>", "</table></div>")


@lru_cache(maxsize=1)
def environment() -> Environment:
    env = Environment(loader=PackageLoader("moe_repro.reports", "templates"),
                      autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
    env.template_class = _ScrollingTables
    env.filters["num"] = _num
    env.filters["pct"] = lambda x: "" if x is None else f"{x:+.2%}"
    env.filters["when"] = when
    env.filters["deviation"] = deviation
    # What every letter, grade and status means: shown on the index and on every page.
    from moe_repro import catalog
    from moe_repro.records.record import CAUSE_MEANING, GRADE_MEANING, STATUS_MEANING
    env.globals.update(how_meaning=catalog.HOW_MEANING, how_words=catalog.HOW,
                       grade_meaning=GRADE_MEANING, status_meaning=STATUS_MEANING,
                       cause_meaning=CAUSE_MEANING)
    return env


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


def css() -> Markup:
    """The stylesheet, marked safe: it is our own file, and autoescaping it turns its quotes into
    &#34; inside <style>, which breaks every rule after the first quoted font name."""
    return Markup(environment().loader.get_source(environment(), "style.css")[0])


def render_reproduction(payload: dict, raw_json: str | None = None, figures: list[dict] | None = None,
                        home: str | None = None, raw_csv: str | None = None,
                        paper: dict | None = None) -> str:
    """A reproduction's page; ``paper``: its paper's facts (title, authors, venue, BibTeX)."""
    from moe_repro.records.record import grade_counts, status_of

    grades = grade_counts(c["verdict"] for c in payload.get("cells", []))
    return environment().get_template("reproduction.html").render(
        p=payload, raw_json=raw_json, raw_csv=raw_csv, figures=figures or [], home=home, css=css(),
        paper=paper, grades=grades, status=status_of(set(grades)),
        # a paper table is laid out as the paper's grid; a figure's points are in its figures
        grid=paper_grid(payload) if "Table" in str(payload.get("element", "")) else None)


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
    return {"columns": columns,
            "rows": [{"label": r, "cells": [at.get((r, col)) for col in columns]} for r in rows]}


def _laid_out_grid(layout: dict, at: dict) -> dict:
    """``paper_grid`` for a reproduction's own ``paper_layout`` (see there)."""
    groups = [{"label": g["label"], "span": len(g["columns"])} for g in layout["groups"]]
    columns = [sub.get("column") for g in layout["groups"] for sub in g["columns"]]
    rows = [{"label": r["label"], "keys": [tuple(k) if k else None for k in r["keys"]]}
            if isinstance(r, dict) else {"label": r, "keys": [(r, col) for col in columns]}
            for r in layout["rows"]]
    placed = {key for r in rows for key in r["keys"] if key in at}
    return {"corner": layout.get("corner", ""), "groups": groups,
            "columns": [sub["label"] for g in layout["groups"] for sub in g["columns"]],
            "rows": [{"label": r["label"], "cells": [at.get(key) if key else None for key in r["keys"]]}
                     for r in rows],
            "outside": len(at) - len(placed)}


def render_index(papers: list[dict], suites: list[dict], built: dict | None = None) -> str:
    return environment().get_template("index.html").render(papers=papers, suites=suites,
                                                           built=built or {}, css=css())


def render_suite(name: str, payload: dict | None, raw_json: str | None, history: list[dict],
                 home: str, graphs: list[dict] | None = None, view: dict | None = None,
                 sweeps: list[dict] | None = None) -> str:
    """A suite's page: ``view`` is the latest run laid out by reports/site.py (machine, constant
    and varying parameters, the compact table), ``sweeps`` its metric-vs-parameter figures,
    ``graphs`` the history figures, ``history`` the stored runs."""
    return environment().get_template("suite.html").render(
        name=name, p=payload, raw_json=raw_json, history=history, home=home, graphs=graphs or [],
        view=view, sweeps=sweeps or [], css=css())
