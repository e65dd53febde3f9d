"""``repro list``: reproductions (implemented and planned) and suites, read from the catalog.

It reads :mod:`moe_repro.catalog` only, never a spec or suite module, so it starts without
torch (see benchmarks/test_bench_startup.py).
"""

from __future__ import annotations

import json

import click

from moe_repro import catalog
from moe_repro.cli.errors import BadInput


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.option(
    "--paper", default=None, help="Only this paper's reproductions (piper, xmoe, feplb, mop)."
)
def command(as_json: bool, paper: str | None) -> None:
    """List reproductions (with the paper element and how they are made) and suites."""
    try:
        entries = catalog.reproductions_of(paper) if paper else list(catalog.REPRODUCTIONS.values())
    except ValueError as e:
        raise BadInput(str(e)) from None
    rows = [
        {
            "id": r.id,
            "paper": r.paper,
            "element": r.paper_element,
            "how": r.how,
            "what": r.what,
            "title": r.title,
            "implemented": r.implemented,
            "issue": r.issue,
        }
        for r in entries
    ]
    suites = [
        {"name": s.name, "description": s.description, "distributed": s.distributed}
        for s in catalog.SUITES.values()
    ]
    if as_json:
        click.echo(json.dumps({"reproductions": rows, "suites": suites}, indent=2))
        return
    width = max(len(name) for name in [row["id"] for row in rows] + [s["name"] for s in suites])
    click.echo("Reproductions (how: A analytic, R real, S simulated)")
    for row in rows:
        issue = f", issue {row['issue']}" if row["issue"] else ""
        state = "" if row["implemented"] else f"  [planned{issue}]"
        click.echo(
            f"  {row['id']:<{width}}  {row['how']:<12} {row['element']:<18} {row['what']}{state}"
        )
    click.echo("\nSuites (repro bench NAME)")
    for s in suites:
        kind = "multi-process" if s["distributed"] else "local"
        click.echo(f"  {s['name']:<{width}}  {kind:<13} {s['description']}")
