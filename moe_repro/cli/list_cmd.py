"""``repro list``: reproductions (implemented and planned) and suites."""

from __future__ import annotations

import json

import click


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.option("--paper", default=None, help="Only this paper's reproductions (piper, xmoe, feplb, mop).")
def command(as_json: bool, paper: str | None) -> None:
    """List reproductions (with the paper element and how they are made) and suites."""
    from moe_repro.reproductions import all_reproductions
    from moe_repro.reproductions.inventory import INVENTORY
    from moe_repro.suites import all_suites

    repros = all_reproductions()
    rows = []
    for rid, element, how, what, issue in INVENTORY:
        r = repros.get(rid)
        rows.append({"id": rid, "element": element, "how": r.how if r else how, "what": what,
                     "implemented": r is not None, "issue": issue})
    inventory_ids = {row["id"] for row in rows}
    for rid, r in repros.items():
        if rid not in inventory_ids:
            rows.append({"id": rid, "element": r.element, "how": r.how, "what": r.title,
                         "implemented": True, "issue": None})
    if paper:
        rows = [row for row in rows if row["id"].startswith(paper + "-")]
    suites = [{"name": s.name, "description": s.description, "distributed": s.distributed,
               "params": s.params} for s in all_suites().values()]
    if as_json:
        click.echo(json.dumps({"reproductions": rows, "suites": suites}, indent=2))
        return
    width = max(len(row["id"]) for row in rows) if rows else 10
    click.echo("Reproductions (how: A analytic, R real, S simulated)")
    for row in rows:
        state = "" if row["implemented"] else f"  [planned, issue {row['issue']}]"
        click.echo(f"  {row['id']:<{width}}  {row['how']:<12} {row['element']:<18} {row['what']}{state}")
    click.echo("\nSuites (repro bench NAME)")
    for s in suites:
        kind = "multi-process" if s["distributed"] else "local"
        click.echo(f"  {s['name']:<{width}}  {kind:<12} {s['description']}")
