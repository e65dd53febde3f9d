"""The compare page (``compare.html``): the newest commit of the results store against the one
before it, as ``repro compare A B`` prints it (records/compare.py), plus a page per earlier pair
of consecutive commits.

Per benchmark the ratio B / A, the Mann-Whitney p where both sides kept samples, and the gate's
verdict (slower, faster, noisy, same, changed); the reproductions' cells whose grade changed. The
rows that moved come first; the unchanged ones are folded. With fewer than two commits stored,
the page says in one line what it needs.
"""

from __future__ import annotations

from pathlib import Path

from moe_repro.records.atomic import atomic_write_text, inside
from moe_repro.reports import html
from moe_repro.reports.numbers import fmt, readable_unit

MAX_PAIRS = (
    4  # earlier pairs of consecutive commits with a page of their own (each reads the store)
)
ORDER = ("slower", "faster", "noisy", "changed", "same")


def commit_order(runs) -> list[str]:
    """The distinct commits of ``runs`` (history_page.Run), oldest first by their first run."""
    seen: dict[str, str] = {}
    for r in runs:
        commit = r.record.environment.git_commit
        if commit:
            date = r.date or ""
            if commit not in seen or date < seen[commit]:
                seen[commit] = date
    return sorted(seen, key=lambda c: seen[c])


def _view(comparison) -> dict:
    rows = sorted(
        comparison.rows,
        key=lambda r: (ORDER.index(r.verdict) if r.verdict in ORDER else 9, r.suite, r.metric),
    )
    shown = [
        {
            "result": f"{r.kind} {r.suite}",
            "metric": r.metric,
            "at": r.params,
            "a": _value(r.value_a, r),
            "b": _value(r.value_b, r),
            "ratio": f"{r.ratio:.3g}x" if r.ratio is not None else "-",
            "p": fmt(r.p_value) if r.p_value is not None else "-",
            "verdict": r.verdict,
            "why": r.why,
        }
        for r in rows
    ]
    return {
        "a": comparison.a,
        "b": comparison.b,
        "verdicts": {v: n for v, n in sorted(comparison.verdicts().items(), key=_rank)},
        "moved": [r for r in shown if r["verdict"] != "same"],
        "same": [r for r in shown if r["verdict"] == "same"],
        "grades": comparison.grade_changes,
        "only_a": comparison.only_a,
        "only_b": comparison.only_b,
    }


def _value(v, row) -> str:
    """A value in a unit both sides read in (29 MFLOP/s, not 2.9e-05 TFLOP/s)."""
    if v is None or row.unit in ("s", "B", "%", ""):
        return fmt(v, row.unit or None)
    factor, unit = readable_unit([x for x in (row.value_a, row.value_b) if x is not None], row.unit)
    return f"{fmt(v / factor)} {unit}"


def _rank(item):
    return ORDER.index(item[0]) if item[0] in ORDER else 9


def write_compare_page(store, out: Path, commits: list[str], home: str = "index.html") -> Path:
    """``out/compare.html`` (the newest pair) and ``out/compare/<a>-<b>.html`` for up to
    MAX_PAIRS earlier consecutive pairs; ``commits`` oldest first."""
    from moe_repro.records.compare import CompareInputError, compare_runs

    pairs = list(zip(commits, commits[1:]))[::-1][: MAX_PAIRS + 1]
    links = [
        {"a": a[:10], "b": b[:10], "href": f"compare/{a[:10]}-{b[:10]}.html"} for a, b in pairs[1:]
    ]
    problem = None
    view = None
    if pairs:
        a, b = pairs[0]
        try:
            view = _view(compare_runs(store, a[:12], b[:12]))
        except CompareInputError as e:
            problem = str(e)
    template = html.environment().get_template("compare.html")
    for a, b in pairs[1:]:
        try:
            v, why = _view(compare_runs(store, a[:12], b[:12])), None
        except CompareInputError as e:
            v, why = None, str(e)
        atomic_write_text(
            inside(out / "compare", f"{a[:10]}-{b[:10]}.html"),
            template.render(
                view=v,
                problem=why,
                pairs=[],
                home="../index.html",
                root="../",
                css=html.css(),
                commits=commits,
            ),
        )
    return atomic_write_text(
        inside(out, "compare.html"),
        template.render(
            view=view,
            problem=problem,
            pairs=links,
            home=home,
            root="",
            css=html.css(),
            commits=commits,
        ),
    )
