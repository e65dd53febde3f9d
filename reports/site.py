"""The static results site: index by paper, a page per reproduction and suite, raw JSON beside.

Everything is relative links and inline CSS, so the site works from the file system and from
any static host. Pages are written atomically; the build can be rerun over an existing folder.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from moe_repro import catalog
from moe_repro.records.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
from moe_repro.records.record import ReproductionRecord, SuiteRecord, dump
from moe_repro.reports import html
from moe_repro.reports.export import frame, write
from moe_repro.reports.figures import render_figure
from moe_repro.reports.peers_page import write_peers_page


def _verdicts(summary: dict) -> str:
    return ", ".join(f"{v} {k}" for k, v in summary.items() if v)


def _paper_facts(paper: catalog.Paper) -> dict:
    """What the templates may show about a paper: key, short name, full title, authors, venue,
    year, link and its BibTeX entry."""
    return {**asdict(paper), "authors": list(paper.authors), "bibtex": paper.bibtex}


def write_reproduction_page(directory: Path, record: ReproductionRecord, home: str | None = None) -> Path:
    """One reproduction's page with its figures (PNG + SVG), raw JSON and CSV, in ``directory``."""
    rid, payload = record.id, dump(record)
    figures = []
    for fig in record.figures:
        drawn = render_figure(fig)
        names = {fmt: f"{rid}-{fig['name']}.{fmt}" for fmt in drawn}
        for fmt, data in drawn.items():
            atomic_write_bytes(directory / names[fmt], data)
        figures.append({"title": fig["title"], **names})
    atomic_write_json(directory / f"{rid}.json", payload)
    atomic_write_text(directory / f"{rid}.csv", write(frame(record), "csv"))
    return atomic_write_text(directory / f"{rid}.html", html.render_reproduction(
        payload, raw_json=f"{rid}.json", figures=figures, home=home, raw_csv=f"{rid}.csv"))


def build_site(store, out_dir: str | Path) -> Path:
    # What exists comes from the catalog (reports never import the live spec or suite registries).
    out = Path(out_dir)
    by_paper: dict[str, list[dict]] = {key: [] for key in catalog.PAPERS}
    for entry in catalog.REPRODUCTIONS.values():
        rid, element, how, what, issue = (entry.id, entry.paper_element, entry.how, entry.what,
                                          entry.issue)
        implemented = entry.implemented
        record = store.latest("reproduction", rid) if implemented else None
        href = f"repro/{rid}.html"
        row = {"id": rid, "element": element, "how": how, "href": href, "when": None, "verdicts": ""}
        if record is None:
            row["status"] = "not-yet-run" if implemented else "planned"
            atomic_write_text(out / href, html.environment().get_template("pending.html").render(
                id=rid, element=element, how=how, what=what, issue=issue,
                implemented=implemented, home="../index.html", css=html.css()))
        else:
            row.update(status=record.status, verdicts=_verdicts(record.summary), when=record.timestamp)
            write_reproduction_page(out / "repro", record, home="../index.html")
        by_paper.setdefault(entry.paper, []).append(row)

    suites = []
    for name, suite in catalog.SUITES.items():
        runs = store.runs("suite", name)  # readable runs, oldest first
        latest = runs[-1] if runs else None
        payload = dump(latest) if latest else None
        href = f"suites/{name}.html"
        raw = None
        if latest is not None:
            raw = f"{name}.json"
            atomic_write_json(out / "suites" / raw, payload)
            atomic_write_text(out / "suites" / f"{name}.csv", write(frame(latest), "csv"))
        graphs = []
        # time, and the suite's headline throughput if it has one (asv graphs one metric each);
        # the metrics as the newest stored run declared them
        declared = latest.metrics if latest else []
        headline = [m for m in declared[1:] if m.better == "higher"][:1]
        for metric in declared[:1] + headline:
            fig = history_figure(name, metric, runs)
            if fig is None:
                continue
            drawn = render_figure(fig)
            names = {fmt: f"{name}-history-{metric.name}.{fmt}" for fmt in drawn}
            for fmt, data in drawn.items():
                atomic_write_bytes(out / "suites" / names[fmt], data)
            graphs.append({"title": fig["title"], **names})
        summary = [{"when": r.timestamp, "commit": (r.environment.git_commit or "-")[:10],
                    "records": len(r.records)} for r in runs]
        atomic_write_text(out / href, html.render_suite(name, payload, raw, summary, "../index.html",
                                                        graphs=graphs))
        suites.append({"name": name, "description": suite.description, "href": href,
                       "records": len(latest.records) if latest else 0,
                       "when": latest.timestamp if latest else None})

    write_peers_page(store, out)
    papers = [{**_paper_facts(catalog.paper(k)), "reproductions": rows}
              for k, rows in by_paper.items() if rows]
    return atomic_write_text(out / "index.html", html.render_index(papers, suites))


def history_figure(name: str, metric, runs: list[SuiteRecord], max_lines: int = 8) -> dict | None:
    """A metric per stored run (asv-style): one line per grid point, x = run order (commit)."""
    series: dict[str, tuple[list, list]] = {}
    params_of = lambda r, run: " ".join(f"{k}={r[k]}" for k in run.params if k in r)
    for i, run in enumerate(runs):
        for rec in run.records:
            if metric.name in rec:
                xs, ys = series.setdefault(params_of(rec, run) or "all", ([], []))
                xs.append(i)
                ys.append(rec[metric.name])
    if not series:
        return None
    lines = [{"label": label, "x": xs, "y": ys, "kind": "ours"}
             for label, (xs, ys) in list(series.items())[:max_lines]]
    return {"name": f"history-{metric.name}", "title": f"{name}: {metric.name} per stored run (median)",
            "xlabel": "stored run (oldest = 0)", "ylabel": f"{metric.name} [{metric.unit}]",
            "series": lines, "xscale": "linear", "yscale": "log"}
