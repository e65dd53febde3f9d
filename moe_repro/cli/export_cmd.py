"""``repro export``: stored results as one flat CSV or JSON Lines table (pandas)."""

from __future__ import annotations

import click

from moe_repro.cli.errors import OutputFile


@click.command("export")
@click.argument("names", nargs=-1)
@click.option(
    "--kind", type=click.Choice(["reproductions", "suites"]), default="suites", show_default=True
)
@click.option(
    "--format", "fmt", type=click.Choice(["csv", "jsonl"]), default="csv", show_default=True
)
@click.option(
    "--history",
    "--all-runs",
    "history",
    is_flag=True,
    help="Every stored run, not only the latest per name.",
)
@click.option("--out", "out_path", type=OutputFile(), required=True, help="Output file.")
@click.pass_obj
def command(store, names, kind, fmt, history, out_path) -> None:
    """Export stored results of NAMES (all when none) to a flat table: one row per cell or record."""
    import pandas as pd

    from moe_repro.cli.errors import BadInput
    from moe_repro.records.atomic import atomic_write_text
    from moe_repro.reports.export import frame, write

    record_kind = {"reproductions": "reproduction", "suites": "suite"}[kind]
    available = store.names(record_kind)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise BadInput(
            f"no stored {kind} named {', '.join(unknown)}; stored: {', '.join(available) or 'none'}"
        )
    frames = []
    for name in names or available:
        # unreadable files are named on stderr by the store and left out
        stored = store.runs(record_kind, name)
        runs = stored if history else [store.latest(record_kind, name)]
        runs = [record for record in runs if record is not None]
        frames += [frame(record) for record in runs]
        if not history and runs:  # say which run stands for the name, and what was left out
            env = runs[0].environment
            click.echo(
                f"{name}: the latest run ({env.timestamp}, commit {(env.git_commit or '?')[:10]})"
                + (
                    f"; {len(stored) - 1} earlier run{'s' if len(stored) > 2 else ''} left out "
                    f"(--all-runs exports them)"
                    if len(stored) > 1
                    else ""
                ),
                err=True,
            )
    if not frames:
        raise BadInput(f"the results store at {store.root} holds no {kind} yet")
    df = pd.concat(frames, ignore_index=True)
    atomic_write_text(out_path, write(df, fmt), make_parents=False)
    click.echo(f"exported {len(df)} rows to {out_path}")
