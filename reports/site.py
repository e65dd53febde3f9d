"""The static results site: index by paper, a page per reproduction and suite, raw JSON beside.

Everything is relative links and inline CSS, so the site works from the file system and from
any static host. Pages are written atomically; the build can be rerun over an existing folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from moe_repro.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
from moe_repro.reports import html
from moe_repro.reports.figures import render_figure

PAPERS = {
    "piper": "Piper: resource modeling and pipelined hybrid parallelism for MoE training",
    "xmoe": "X-MoE: padding-free MoE training on HPC platforms",
    "feplb": "FEPLB: copy-engine expert load balancing",
    "mop": "Mixture-of-Parallelisms (MoP)",
}


def _verdicts(summary: dict) -> str:
    return ", ".join(f"{v} {k}" for k, v in summary.items() if v)


def build_site(store, out_dir: str | Path) -> Path:
    from moe_repro.reproductions import all_reproductions
    from moe_repro.reproductions.inventory import INVENTORY
    from moe_repro.reproductions.spec import status_of
    from moe_repro.suites import all_suites

    out = Path(out_dir)
    repros = all_reproductions()
    entries = [(rid, element, how, what, issue) for rid, element, how, what, issue in INVENTORY]
    entries += [(rid, r.element, r.how, r.title, None) for rid, r in repros.items()
                if rid not in {e[0] for e in entries}]

    by_paper: dict[str, list[dict]] = {key: [] for key in PAPERS}
    for rid, element, how, what, issue in entries:
        payload = store.latest("reproductions", rid) if rid in repros else None
        href = f"repro/{rid}.html"
        row = {"id": rid, "element": element, "how": how, "href": href, "when": None, "verdicts": ""}
        if payload is None:
            row["status"] = "not-yet-run" if rid in repros else "planned"
            atomic_write_text(out / href, html.environment().get_template("pending.html").render(
                id=rid, element=element, how=how, what=what, issue=issue,
                implemented=rid in repros, home="../index.html", css=html._css()))
        else:
            row.update(status=status_of(payload["cells"]), verdicts=_verdicts(payload["summary"]),
                       when=payload["environment"].get("timestamp"))
            figures = []
            for fig in payload.get("figures", []):
                drawn = render_figure(fig)
                names = {fmt: f"{rid}-{fig['name']}.{fmt}" for fmt in drawn}
                for fmt, data in drawn.items():
                    atomic_write_bytes(out / "repro" / names[fmt], data)
                figures.append({"title": fig["title"], **names})
            atomic_write_json(out / "repro" / f"{rid}.json", payload)
            atomic_write_text(out / href, html.render_reproduction(
                payload, raw_json=f"{rid}.json", figures=figures, home="../index.html"))
        by_paper.setdefault(rid.split("-")[0], []).append(row)

    suites = []
    for name, suite in all_suites().items():
        history = store.history("suites", name)
        payload = json.loads(history[-1].read_text()) if history else None
        href = f"suites/{name}.html"
        raw = None
        if payload is not None:
            raw = f"{name}.json"
            atomic_write_json(out / "suites" / raw, payload)
        runs = []
        for path in history:
            p = json.loads(path.read_text())
            env = p.get("environment", {})
            runs.append({"when": env.get("timestamp"), "commit": (env.get("git_commit") or "-")[:10],
                         "records": len(p.get("records", []))})
        atomic_write_text(out / href, html.render_suite(name, payload, raw, runs, "../index.html"))
        suites.append({"name": name, "description": suite.description, "href": href,
                       "records": len(payload["records"]) if payload else 0,
                       "when": payload["environment"].get("timestamp") if payload else None})

    papers = [{"key": k, "title": PAPERS.get(k, k), "reproductions": rows}
              for k, rows in by_paper.items() if rows]
    return atomic_write_text(out / "index.html", html.render_index(papers, suites))
