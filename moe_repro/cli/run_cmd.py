"""``repro run``: compute a reproduction, compare with the paper, store, report."""

from __future__ import annotations

import difflib
import math
import sys
import time
from pathlib import Path

import click

from moe_repro.cli.errors import BadInput, OutputDir, OutputFile


def resolve_ids(
    ids: tuple[str, ...], paper: str | None, run_all: bool, how: str | None = None
) -> list[str]:
    """Turn the command's arguments into reproduction ids, or fail with one line (exit 2).
    Read from the catalog alone (no reproduction module, so no torch, is imported): a typo is
    answered at once."""
    from moe_repro import catalog

    known = dict(sorted((rid, r) for rid, r in catalog.REPRODUCTIONS.items() if r.implemented))
    if how is not None:  # --how '' selects nothing: an error, not "no filter"
        allowed = {h.strip().upper() for h in how.split(",")}
        if not allowed <= {"A", "M", "R", "S"}:
            raise BadInput(
                f"--how takes letters A (analytic), M (Monte Carlo), R (real), "
                f"S (simulated); got {how!r}"
            )
        letters = lambda r: {part.strip()[:1] for part in r.how.split("+")}
        known = {rid: r for rid, r in known.items() if letters(r) <= allowed}
    planned = {rid: r.issue for rid, r in catalog.REPRODUCTIONS.items() if not r.implemented}
    if run_all:
        return list(known)
    if paper:
        chosen = [rid for rid in known if rid.startswith(paper + "-")]
        if not chosen:
            papers = sorted({rid.split("-")[0] for rid in known})
            raise BadInput(
                f"no implemented reproductions for paper {paper!r}; papers: {', '.join(papers)}"
            )
        return chosen
    if not ids:
        raise BadInput("name a reproduction id (see 'repro list'), or use --paper P or --all")
    for rid in ids:
        if rid in planned:
            raise BadInput(
                f"{rid} is in the catalog but not implemented yet (issue {planned[rid]})"
            )
        if rid not in known:
            close = difflib.get_close_matches(rid, list(known) + list(planned), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see 'repro list'"
            raise BadInput(f"unknown reproduction {rid!r}{hint}")
    return list(ids)


def run_one(rid: str, params: dict, full: bool = False):
    """Compute one reproduction; its result record (records/record.py).
    ``params``: the overrides of its defaults (with ``full``: its paper-sized ones included)."""
    from moe_repro.reproductions import all_reproductions
    from moe_repro.reproductions.spec import record_of
    from moe_repro.runtime.launch import RankFailure

    repro = all_reproductions()[rid]
    try:
        result = repro.run(params)
    except ValueError as e:
        raise BadInput(str(e)) from None
    except RankFailure as e:
        # A slow machine is not a hang: say which parameter allows a longer run.
        if "did not finish within" in str(e) and "timeout_s" in repro.defaults:
            allowed = {**repro.defaults, **params}["timeout_s"]
            raise RankFailure(
                f"{e}; {rid} allows {allowed:g} s (--param timeout_s): if the machine "
                f"is only slow, rerun with e.g. --param timeout_s={4 * float(allowed):g}",
                e.ranks,
            ) from None
        raise
    from moe_repro import cli

    # command: how to rerun this one result; the environment keeps the command line that ran
    full_params = repro.full if full else {}
    argv = (
        ["repro", "run", rid]
        + (["--full"] if full else [])
        + [
            f"--param {k}={v}"
            for k, v in params.items()
            if not (k in full_params and full_params[k] == v)
        ]
    )
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


def params_listing(rids: list[str]) -> str:
    """The parameters of reproductions with their defaults (and --full values), one per line."""
    from moe_repro.reproductions import all_reproductions

    known = all_reproductions()
    lines = []
    for rid in rids:
        repro = known[rid]
        lines.append(
            f"{rid}: parameters (--param K=V) and defaults"
            + (" [and --full values]" if repro.full else "")
            + ":"
        )
        width = max((len(k) for k in repro.defaults), default=0)
        for key, value in repro.defaults.items():
            full = f"  [--full: {repro.full[key]}]" if key in repro.full else ""
            lines.append(f"  {key:<{width}}  {value}{full}")
        if not repro.defaults:
            lines.append("  (none)")
    return "\n".join(lines)


def batch_line(i: int, chosen: list[str], started: float, minutes: dict) -> str:
    """``[i/n] id, elapsed, about T left`` for a run of several reproductions: the time left
    is the catalog's idle-machine minutes of the ones not finished, scaled by how much slower
    than those minutes the finished ones ran (never below the catalog's minutes: they are rounded
    up to a tenth, so short runs finishing early say little about the long ones; none finished:
    the catalog's minutes as they are)."""
    from moe_repro.reproductions.suite_runs import clock

    elapsed = time.monotonic() - started
    head = f"[{i + 1}/{len(chosen)}] {chosen[i]}, {clock(elapsed)} elapsed"
    done_expected = sum(minutes.get(r) or 0.0 for r in chosen[:i]) * 60
    left_expected = sum(minutes.get(r) or 0.0 for r in chosen[i:]) * 60
    if not left_expected:
        return head
    pace = max(1.0, elapsed / done_expected) if done_expected else 1.0
    unknown = sum(1 for r in chosen[i:] if not minutes.get(r))
    return (
        head
        + f", about {clock(left_expected * pace)} left"
        + (f" (+{unknown} not timed)" if unknown else "")
    )


def run_minutes(chosen: list[str], full: bool = False) -> dict:
    """Each reproduction's minutes on a 2-core CPU machine, from the catalog: with --full, its
    full run's where the catalog holds one (None: not timed)."""
    from moe_repro import catalog

    entries = {rid: catalog.REPRODUCTIONS[rid] for rid in chosen}
    return {
        rid: (e.full_minutes if full and e.full_minutes else e.minutes)
        for rid, e in entries.items()
    }


def estimate_line(chosen: list[str], minutes: dict, full: bool = False) -> str | None:
    """The line printed before a run expected to take more than a few minutes: what runs and
    its expected time from the catalog's timings (catalog.long_run_line); None otherwise."""
    from moe_repro import catalog

    what = (
        f"{chosen[0]}{' --full' if full else ''}"
        if len(chosen) == 1
        else f"{len(chosen)} reproductions{' at --full' if full else ''}"
    )
    untimed = sum(1 for rid in chosen if not minutes.get(rid))
    basis = "the catalog's times on a 2-core CPU machine" + (
        f"; {untimed} not timed" if untimed else ""
    )
    return catalog.long_run_line(what, 60 * sum(minutes.get(rid) or 0.0 for rid in chosen), basis)


def over_budget(rid: str, minutes: float | None, budget_s: float, elapsed_s: float) -> str | None:
    """The one line saying ``rid`` is left out of a run under ``--budget``, or None when its
    catalog estimate fits the seconds left (the estimate is measured: a reproduction with none
    is left out, its time unknown). The line names the command that fills its page."""
    left = budget_s - elapsed_s
    if minutes is not None and 60 * minutes <= left:
        return None
    needs = (
        f"needs about {60 * minutes:.0f} s on a 2-core CPU machine"
        if minutes is not None
        else "its time is not measured"
    )
    return f"{rid}: skipped ({needs}, {max(left, 0.0):.0f} s of the budget left): repro run {rid}"


def _first_rank() -> bool:
    """Not a non-zero rank of a world a launcher started (those print nothing of their own)."""
    from moe_repro.runtime.launch import launched_rank

    return launched_rank() in (None, 0)


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
        if value.strip().lower().lstrip("+-") in ("nan", "inf", "infinity") or (
            isinstance(out[key], float) and not math.isfinite(out[key])
        ):
            raise BadInput(f"--param {key}: {value!r} is not a finite number")
    return out


def count_lines(records) -> list[str]:
    """The closing lines: per paper when several reproductions ran, then all of them (one
    reproduction: its own line, already printed). Counts from records/grading.py."""
    from moe_repro.records import grading

    if len(records) < 2:
        return []
    papers: dict[str, list] = {}
    for r in records:
        papers.setdefault(r.paper, []).append(r)
    lines = []
    for paper, rs in papers.items():
        counts = grading.add_agreement(*(grading.agreement(r.cells) for r in rs))
        lines.append(
            f"{paper} ({len(rs)} reproduction{'s' if len(rs) > 1 else ''}): "
            f"{grading.agreement_line(counts)}"
        )
    total = grading.add_agreement(*(grading.agreement(r.cells) for r in records))
    lines.append(f"all {len(records)} reproductions: {grading.agreement_line(total)}")
    return lines


@click.command("run")
@click.argument("ids", nargs=-1)
@click.option("--paper", default=None, help="Run every implemented reproduction of one paper.")
@click.option("--all", "run_all", is_flag=True, help="Run every implemented reproduction.")
@click.option(
    "--how",
    default=None,
    metavar="A,R,S",
    help="With --all/--paper: only reproductions made entirely this way, e.g. --how A,S "
    "for the deterministic ones (what CI gates).",
)
@click.option(
    "--full",
    is_flag=True,
    help="The paper-sized run where the default is cut down to finish in minutes here "
    "(measured reproductions); elsewhere the defaults already are.",
)
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="K=V",
    help="Override a reproduction parameter (repeatable), e.g. --param gpus=16; "
    "applied after --full.",
)
@click.option(
    "--json",
    "json_path",
    type=OutputFile(),
    default=None,
    help="Write the result record (records/record.py) to this file; with several ids, a list.",
)
@click.option(
    "--out",
    "out_dir",
    type=OutputDir(),
    default=None,
    help="Also write the HTML report (and its JSON) into this directory.",
)
@click.option(
    "--quiet",
    is_flag=True,
    help="Print only one line per reproduction: its counts of compared cells.",
)
@click.option(
    "--force",
    is_flag=True,
    help="With --all/--paper: rerun even reproductions whose stored result is current.",
)
@click.option(
    "--show-params",
    is_flag=True,
    help="List the reproductions' parameters (what --param takes) with their defaults, and exit.",
)
@click.option(
    "--budget",
    "budget_s",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="With --all/--paper: run, shortest catalog time first, only the reproductions whose "
    "time fits what is left of SECONDS; one line per one left out, with its time and command.",
)
@click.pass_obj
def command(
    store,
    ids,
    paper,
    run_all,
    how,
    full,
    params,
    json_path,
    out_dir,
    quiet,
    force,
    show_params,
    budget_s,
) -> None:
    """Reproduce paper tables/figures: compute ours, compare with the paper's printed values.

    Each cell's grade follows one policy for every paper (records/grading.py): match (within
    the paper's printed precision), close (a prediction on the paper's side of 1 or 0, within
    15% of the paper's value), seed-dependent (a sampled number, or a measured direction, whose
    grade changes with the seed or the repeat), explained (deviates, and the cell recomputed
    with the recorded cause removed agrees), deviates, claim-holds / claim-fails (a claim the
    paper states in words), not-comparable (a different quantity, or measured here against
    another machine's number), echo (restates an input, or a claim that cannot fail; not
    evidence), not-evidence (equal to the computation without the method, a reused number or a
    coincidence), no-paper-value, or not-reproduced (the note says why). Deviations are
    results, not errors: the exit code is 0.

    After each reproduction a line counts its compared cells: "x of y compared cells agree,
    e explained, z deviate, w seed-dependent", then apart "n not evidence" and the predictions
    `repro validate` does not score ("u prediction (unscored) (a agree, counted apart)"); with
    several, the last lines count them per paper and for all. --quiet prints only those lines.

    Measured (R) reproductions finish in a few minutes at their defaults and show progress on
    stderr (points done / total, elapsed, time left; a computation with no points to count
    says how long it has run); every finished point is stored at once (results/suites/), so
    an interrupted or timed-out run keeps what it measured. --full runs them at the paper's
    size (much longer).
    """
    # where results go is checked first: a long run must never end unable to keep them
    problem = store.write_problem()
    if problem:
        raise BadInput(f"cannot store results in {store.root}: {problem}")
    # the ids first, from the catalog alone: a typo is answered before matplotlib, pandas or
    # torch load (they cost seconds)
    chosen = resolve_ids(ids, paper, run_all, how)
    if budget_s is not None and not (run_all or paper):
        raise BadInput("--budget goes with --all or --paper (one named reproduction just runs)")
    from moe_repro import cli
    from moe_repro.records import grading
    from moe_repro.reports.site import write_reproduction_page
    from moe_repro.reports.terminal import format_result
    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.records.record import dump
    from moe_repro.reproductions import all_reproductions
    from moe_repro.reproductions.suite_runs import Watch, clock, watching

    if show_params:
        click.echo(params_listing(chosen))
        return
    overrides = parse_params(params)

    from moe_repro.runtime.launch import launched_rank

    # under torchrun/mpiexec/srun every rank runs the command: rank 0 alone prints, stores and
    # writes --json/--out (once), the others compute alongside it (a measured reproduction's
    # world needs them)
    speaks = launched_rank() in (None, 0)
    echo = click.echo if speaks else (lambda *args, **kwargs: None)
    minutes = run_minutes(chosen, full)
    if budget_s is not None:  # shortest first: the most pages a budget can fill (ties keep order)
        chosen = sorted(chosen, key=lambda r: (minutes.get(r) is None, minutes.get(r) or 0.0))
    long_run = estimate_line(chosen, minutes, full)  # a long run says so before it starts
    if long_run and not quiet and _first_rank():
        click.echo(long_run, err=True)
    resume = (run_all or paper) and not force
    known = all_reproductions()
    batch_started = time.monotonic()
    records = []
    for i, rid in enumerate(chosen):
        if len(chosen) > 1 and not quiet:
            echo(batch_line(i, chosen, batch_started, minutes), err=True)
        given = {**(known[rid].full if full else {}), **overrides}
        if full and not known[rid].full and not quiet:
            echo(f"{rid}: its defaults are already its full run", err=True)
        # an unreadable stored file is named on stderr by the store and rerun here
        stored = store.latest("reproduction", rid) if resume else None
        if stored is not None and is_current(stored, given):
            records.append(stored)
            if not quiet:
                echo(f"\n{rid}: up to date (stored result of this commit; --force reruns)")
            echo(f"{rid}: {grading.agreement_line(grading.agreement(stored.cells))} (stored)")
            continue
        skipped = (
            None
            if budget_s is None
            else over_budget(rid, minutes.get(rid), budget_s, time.monotonic() - batch_started)
        )
        if skipped:
            echo(skipped)
            continue
        started = time.monotonic()
        watch = Watch(
            label=rid,
            stream=None if quiet or not speaks else sys.stderr,
            store=store if speaks else None,
            command=cli.INVOCATION,
        )
        with watching(watch):
            record = run_one(rid, given, full)
        took = clock(time.monotonic() - started)
        records.append(record)
        if not speaks:  # the same run on another rank of a launched world: rank 0 keeps it
            continue
        path = store.save(record)
        if not quiet:
            echo("\n" + format_result(record))
            echo(f"stored: {path}")
            for points in watch.saved:
                echo(f"measured points: {points}")
        if out_dir:
            page = write_reproduction_page(
                Path(out_dir), record, name=rid
            )  # the catalog id names the files
            if not quiet:
                echo(f"report: {page}")
        echo(f"{rid}: {grading.agreement_line(grading.agreement(record.cells))} (ran {took})")
    for line in count_lines(records):
        echo(line)
    if json_path and speaks:
        payloads = [dump(r) for r in records]
        atomic_write_json(
            json_path, payloads[0] if len(payloads) == 1 else payloads, make_parents=False
        )
