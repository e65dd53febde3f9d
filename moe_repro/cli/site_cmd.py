"""``repro site build``: the static results site from the results store."""

from __future__ import annotations

import click

from moe_repro.cli.errors import OutputDir


@click.group("site")
def command() -> None:
    """Build the static results site (works from the file system or any static host)."""


@command.command("build")
@click.option(
    "--out",
    "out_dir",
    type=OutputDir(),
    default="site/_build",
    show_default=True,
    help="Directory to write the site into.",
)
@click.pass_obj
def build(store, out_dir: str) -> None:
    """Render an index of every reproduction and suite, a page for each, and the raw JSON."""
    from moe_repro.cli.progress import StepLines
    from moe_repro.reports.site import build_site

    # pages take from milliseconds to seconds each: a line at most every 2 s, on stderr
    lines = StepLines("site build", every_s=2.0)
    index = build_site(
        store,
        out_dir,
        progress=lambda done, total, what: lines(done, total, what and f"now {what}"),
    )
    click.echo(f"site: {index}")
