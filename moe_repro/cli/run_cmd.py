"""``repro run``: compute a reproduction, compare with the paper, store, report."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import click

from moe_repro.cli.errors import BadInput, OutputFile


def resolve_ids(ids: tuple[str, ...], paper: str | None, run_all: bool,
                how: str | None = None) -> list[str]:
    """Turn the command's arguments into reproduction ids, or fail with one line (exit 2)."""
    from moe_repro import catalog
    from moe_repro.reproductions import all_reproductions

    known = all_reproductions()
    if how:
        allowed = {h.strip().upper() for h in how.split(",")}
        if not allowed <= {"A", "M", "R", "S"}:
            raise BadInput(f"--how takes letters A (analytic), M (Monte Carlo), R (real), "
                           f"S (simulated); got {how!r}")
        letters = lambda r: {part.strip()[:1] for part in r.how.split("+")}
        known = {rid: r for rid, r in known.items() if letters(r) <= allowed}
    planned = {rid: r.issue for rid, r in catalog.REPRODUCTIONS.items() if not r.implemented}
    if run_all:
        return list(known)
    if paper:
        chosen = [rid for rid in known if rid.startswith(paper + "-")]
        if not chosen:
            papers = sorted({rid.split("-")[0] for rid in known})
            raise BadInput(f"no implemented reproductions for paper {paper!r}; papers: {', '.join(papers)}")
        return chosen
    if not ids:
        raise BadInput("name a reproduction id (see 'repro list'), or use --paper P or --all")
    for rid in ids:
        if rid in planned:
            raise BadInput(f"{rid} is in the catalog but not implemented yet (issue {planned[rid]})")
        if rid not in known:
            close = difflib.get_close_matches(rid, list(known) + list(planned), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see 'repro list'"
            raise BadInput(f"unknown reproduction {rid!r}{hint}")
    return list(ids)


def run_one(rid: str, params: dict):
    """Compute one reproduction; its record (the DESIGN.md contract, records/record.py)."""
    from moe_repro.reproductions import all_reproductions
    from moe_repro.reproductions.spec import record_of

    repro = all_reproductions()[rid]
    try:
        result = repro.run(params)
    except ValueError as e:
        raise BadInput(str(e)) from None
    from moe_repro import cli

    # command: how to rerun this one result; the environment keeps the command line that ran
    argv = ["repro", "run", rid] + [f"--param {k}={v}" for k, v in params.items()]
    return record_of(repro, result, params, argv, invocation=cli.INVOCATION)


def is_current(stored, params: dict) -> bool:
    """A stored record is current if made by this very commit, from a clean tree, same params."""
    from moe_repro.records.environment import git_state
    from moe_repro.reproductions import all_reproductions

    state, env = git_state(), stored.environment
    if not state["git_commit"] or state["git_dirty"] or env.git_dirty is not False:
        return False
    expected = {**all_reproductions()[stored.id].defaults, **params}
    return env.git_commit == state["git_commit"] and stored.params == expected


def parse_params(pairs: tuple[str, ...]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BadInput(f"--param expects key=value, got {pair!r}")
        try:
            out[key] = float(value) if "." in value or "e" in value.lower() else int(value)
        except ValueError:
            out[key] = value
    return out


@click.command("run")
@click.argument("ids", nargs=-1)
@click.option("--paper", default=None, help="Run every implemented reproduction of one paper.")
@click.option("--all", "run_all", is_flag=True, help="Run every implemented reproduction.")
@click.option("--how", default=None, metavar="A,R,S",
              help="With --all/--paper: only reproductions made entirely this way, e.g. --how A,S "
                   "for the deterministic ones (what CI gates).")
@click.option("--param", "params", multiple=True, metavar="K=V",
              help="Override a reproduction parameter (repeatable), e.g. --param gpus=16.")
@click.option("--json", "json_path", type=OutputFile(), default=None,
              help="Write the result (DESIGN.md contract) to this file; with several ids, a list.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the HTML report (and its JSON) into this directory.")
@click.option("--quiet", is_flag=True, help="Do not print the table.")
@click.option("--force", is_flag=True,
              help="With --all/--paper: rerun even reproductions whose stored result is current.")
@click.pass_obj
def command(store, ids, paper, run_all, how, params, json_path, out_dir, quiet, force) -> None:
    """Reproduce paper tables/figures: compute ours, compare with the paper's printed values.

    Each cell gets one grade: match (within the paper's printed precision), close (within the
    tolerance the reproduction states), explained (deviates for a cause recorded with the cell),
    deviates (cause not found), claim-holds / claim-fails (a claim the paper states in words),
    not-comparable (a different quantity), echo (restates an input; not evidence),
    no-paper-value, or not-reproduced (the note says why). Deviations are results, not errors:
    the exit code is 0.
    """
    from moe_repro.reports.site import write_reproduction_page
    from moe_repro.reports.terminal import format_result
    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.records.record import dump

    chosen = resolve_ids(ids, paper, run_all, how)
    overrides = parse_params(params)
    resume = (run_all or paper) and not force
    records = []
    with click.progressbar(chosen, label="reproductions", file=sys.stderr,
                           hidden=quiet or len(chosen) < 2, item_show_func=lambda r: r or "") as bar:
        for rid in bar:
            # an unreadable stored file is named on stderr by the store and rerun here
            stored = store.latest("reproduction", rid) if resume else None
            if stored is not None and is_current(stored, overrides):
                records.append(stored)
                if not quiet:
                    click.echo(f"\n{rid}: up to date (stored result of this commit; --force reruns)")
                continue
            record = run_one(rid, overrides)
            path = store.save(record)
            records.append(record)
            if not quiet:
                click.echo("\n" + format_result(record))
                click.echo(f"stored: {path}")
            if out_dir:
                page = write_reproduction_page(Path(out_dir), record)
                if not quiet:
                    click.echo(f"report: {page}")
    if json_path:
        payloads = [dump(r) for r in records]
        atomic_write_json(json_path, payloads[0] if len(payloads) == 1 else payloads)
