"""Issue 27: one grading policy (records/grading.py) decides every grade.

Three checks, from the policy's stated rules rather than from any reproduction's numbers:
- no reproduction carries a tolerance of its own (read from the source with ``ast``);
- every cell of every analytic or simulated reproduction obeys the policy: an ``explained`` cell
  has a recorded counterfactual that agrees, ``close`` only for classes with a tolerance,
  sampled cells over at least MIN_SEEDS seeds, notes at most NOTE_WORDS words;
- a sampled reproduction run at two seed windows (seeds 0-8 and 5-13) gives the same grade in
  every cell, seed-dependent ones included.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from moe_repro.catalog import reproduction as entry_of
from moe_repro.records import grading
from moe_repro.records.record import CAUSES
from moe_repro.reproductions import all_reproductions
from moe_repro.reproductions.spec import NOTE_WORDS

REPO = Path(__file__).resolve().parent.parent


def _tolerance_sites(path: Path) -> list[str]:
    """Places in one source file that decide closeness themselves: a Tolerance, a tolerance=
    argument, a number assigned to a name with 'tol' in it, or |a - b| compared with a fraction
    written in the code. (Quoting grading.PREDICTION_TOLERANCE in a note is the policy's own.)"""
    found = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "Tolerance":
            found.append(f"{path.name}:{node.lineno} name {node.id}")
        elif (
            isinstance(node, ast.Assign)
            and any("tol" in ast.unparse(t).lower() for t in node.targets)
            and any(
                isinstance(c, ast.Constant)
                and isinstance(c.value, (int, float))
                and not isinstance(c.value, bool)
                for c in ast.walk(node.value)
            )
        ):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)[:60]}")
        elif isinstance(node, ast.keyword) and node.arg and "tol" in node.arg.lower():
            found.append(f"{path.name}:{node.value.lineno} keyword {node.arg}=")
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Call)
            and getattr(node.left.func, "id", None) == "abs"
        ):
            fractions = [
                c.value
                for side in node.comparators
                for c in ast.walk(side)
                if isinstance(c, ast.Constant) and isinstance(c.value, float) and 1e-6 < c.value < 1
            ]
            if fractions:
                found.append(f"{path.name}:{node.lineno} abs(...) against {fractions}")
    return found


def test_no_tolerance_outside_the_policy_module():
    # spec.py applies the policy: its ``tolerance`` is the words grading.tolerance_words gives
    sites = [
        s
        for p in sorted((REPO / "reproductions").glob("*.py"))
        if p.name != "spec.py"
        for s in _tolerance_sites(p)
    ]
    assert not sites, "tolerances outside records/grading.py:\n" + "\n".join(sites)


def test_the_check_finds_a_planted_tolerance(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "def f(ours, paper):\n    return abs(ours - paper) <= 0.05 * paper\n"
        "REL_TOL = 0.1\ng(x, tolerance=2)\nTolerance(rel=0.05)\n"
        "words = f'{PREDICTION_TOLERANCE:.0%}'\n"
    )
    assert len(_tolerance_sites(planted)) == 4


def _computed_ids() -> list[str]:
    """Reproductions a test can run: analytic, simulated or sampled (no real measurement)."""
    return [rid for rid in all_reproductions() if not (entry_of(rid).how_letters & {"R"})]


@pytest.fixture(scope="module")
def results():
    """Every computed reproduction at its defaults, as `repro run` records it. Where
    MOE_REPRO_CI_RESULTS names a results store (.ci/run), each record is also saved there: the
    gate's `repro run --all --how A,M,S` on that store then finds them current (this commit,
    clean tree, same params) and gates them instead of computing them all a second time."""
    from moe_repro.cli.run_cmd import run_one
    from moe_repro.records.store import ResultsStore

    shared = os.environ.get("MOE_REPRO_CI_RESULTS")
    store = ResultsStore(shared) if shared else None
    out = {}
    for rid in _computed_ids():
        out[rid] = run_one(rid, {})
        if store is not None:
            store.save(out[rid])
    return out


def test_every_cell_obeys_the_policy(results):
    broken = []
    for rid, result in results.items():
        for c in result.cells:
            where = f"{rid} [{c.row} / {c.column}] {c.verdict}"
            if c.verdict == "explained":
                cf = c.counterfactual or {}
                if c.cause not in CAUSES or cf.get("grade") not in ("match", "close"):
                    broken.append(f"{where}: explained without an agreeing counterfactual")
            if c.verdict == "close" and c.grade_class not in (
                "prediction",
                grading.UNSCORED,
                "sampled",
            ):
                broken.append(f"{where}: close in class {c.grade_class}")
            if c.verdict == "seed-dependent" and c.grade_class != "sampled" and not c.seeds:
                broken.append(f"{where}: seed-dependent without seeds")
            if c.grade_class == "sampled" and c.verdict in grading.COMPARED:
                n = len((c.seeds or {}).get("values") or (c.seeds or {}).get("holds") or [])
                if n < grading.MIN_SEEDS:
                    broken.append(f"{where}: sampled over {n} seeds")
            if c.verdict in grading.COMPARED and c.grade_class is None:
                broken.append(f"{where}: no grade class")
            if c.note and len(c.note.split()) > NOTE_WORDS:
                broken.append(f"{where}: note of {len(c.note.split())} words")
    assert not broken, f"{len(broken)} cells break the policy:\n" + "\n".join(broken[:40])


def _sampled_ids(results) -> list[str]:
    return [
        rid
        for rid, r in results.items()
        if "seed" in all_reproductions()[rid].defaults
        and any(c.grade_class == "sampled" for c in r.cells)
    ]


SEED_WINDOW = 5  # the second window starts here: seeds 5 to 5 + MIN_SEEDS - 1
UNDECIDED = ("seed-dependent", grading.NOT_EVIDENCE)


def _get(cell, key):
    return cell.get(key) if isinstance(cell, dict) else getattr(cell, key, None)


def per_seed_grades(cell) -> list[str] | None:
    """The grade each seed of a sampled cell or claim gives, by the policy's rule."""
    seeds = _get(cell, "seeds") or {}
    if seeds.get("holds") is not None:
        return ["claim-holds" if h else "claim-fails" for h in seeds["holds"]]
    printed = _get(cell, "paper_printed")
    if seeds.get("values") and _get(cell, "paper") is not None and printed:
        half = grading.half_unit(printed)
        qty = _get(cell, "quantity") or "value"
        return [
            grading.grade_value(_get(cell, "paper"), half, v, "prediction", qty)
            for v in seeds["values"]
        ]
    return None


def moved_between_windows(first, second, shift: int = SEED_WINDOW) -> str | None:
    """Why one cell's grade moved between the window at seed 0 and the window at ``shift``, or
    None. Every cell is compared, seed-dependent ones included: two fixed grades must be equal;
    the seeds both windows share must give the same grade at each seed; a cell undecided in one
    window (seed-dependent, or not evidence) and fixed in the other is consistent only if the
    undecided window saw that grade at some seed, the evidence that both windows sample one
    distribution that straddles a boundary."""
    a, b = _get(first, "verdict"), _get(second, "verdict")
    ga, gb = per_seed_grades(first), per_seed_grades(second)
    sa, sb = _get(first, "seeds") or {}, _get(second, "seeds") or {}
    for key in ("values", "holds"):  # the same seed gives the same number and the same outcome
        xa, xb = sa.get(key), sb.get(key)
        if xa and xb and xa[shift:] != xb[: len(xa) - shift]:
            return f"the shared seeds differ: {xa[shift:]} vs {xb[: len(xa) - shift]}"
    if a == b:
        return None
    if a in UNDECIDED and b in UNDECIDED:
        return None
    if a in UNDECIDED or b in UNDECIDED:
        fixed, seen = (b, ga) if a in UNDECIDED else (a, gb)
        agree = fixed in grading.AGREE
        if seen and any((g in grading.AGREE) == agree for g in seen):
            return None
        return f"{a} -> {b}: the undecided window never gave {fixed}"
    return f"{a} -> {b}"


def test_grades_do_not_move_with_the_seed(results):
    """Every cell, seed-dependent ones included, between the default window (seeds 0 to
    MIN_SEEDS - 1) and the window from SEED_WINDOW (moved_between_windows)."""
    ids = _sampled_ids(results)
    assert ids, "no sampled reproduction found: the seed check would test nothing"
    moved = []
    for rid in ids:
        repro = all_reproductions()[rid]
        other = repro.run({"seed": int(repro.defaults["seed"]) + SEED_WINDOW})
        first = {(c.row, c.column): c for c in results[rid].cells}
        for c in other.cells:
            was = first.get((c.row, c.column))
            why = None if was is None else moved_between_windows(was, c)
            if why:
                moved.append(f"{rid} [{c.row} / {c.column}]: {why}")
    assert not moved, "grades that moved with the seed:\n" + "\n".join(moved)


def test_the_window_check_finds_a_planted_move():
    n = grading.MIN_SEEDS
    base = {"paper": 100.0, "paper_printed": "100", "quantity": "value"}
    close = {**base, "verdict": "close", "seeds": {"values": [95.0] * n}}
    deviates = {**base, "verdict": "deviates", "seeds": {"values": [60.0] * n}}
    assert moved_between_windows(close, deviates, 5)  # two fixed grades
    shared_differ = {**base, "verdict": "close", "seeds": {"values": [96.0] * n}}
    assert moved_between_windows(close, shared_differ, 5)  # the same seeds, other numbers
    # seed-dependent in one window, fixed in the other: consistent only if it saw that grade
    mixed = {**base, "verdict": "seed-dependent", "seeds": {"values": [60.0] + [95.0] * (n - 1)}}
    later = {**base, "verdict": "close", "seeds": {"values": [95.0] * (n - 5) + [94.0] * 5}}
    assert moved_between_windows(mixed, later, 5) is None
    all_agree = {**base, "verdict": "seed-dependent", "seeds": {"values": [95.0] * n}}
    assert moved_between_windows(all_agree, deviates, 5)  # the shared seeds differ
    never = {**base, "verdict": "seed-dependent", "seeds": {"values": [60.0, 95.0] + [60.0] * 7}}
    assert moved_between_windows(never, deviates, 5) is None
    holds = {"verdict": "claim-holds", "seeds": {"holds": [True] * n}}
    fails = {"verdict": "claim-fails", "seeds": {"holds": [True] * 5 + [False] * (n - 5)}}
    assert moved_between_windows(holds, fails, 5)  # shared seeds 5-8 differ
