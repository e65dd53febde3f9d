"""The store and the site trust nothing they read: a record whose id or figure name holds '../',
a file nested 200,000 deep, a FIFO named *.json, a malformed `figures` field or a NaN graded
`match` is named on stderr (one line) and skipped; nothing is written outside the site folder;
every command that reads the store still ends with a sane exit code and no traceback. Saves at
the same moment, from 8 processes, never overwrite each other."""

from __future__ import annotations

import copy
import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from moe_repro.records.atomic import inside
from moe_repro.records.record import UnreadableRecord, load_record, validate
from moe_repro.records.store import ResultsStore

DATA = Path(__file__).parent / "data"
V1_REPRO = json.loads((DATA / "v1-reproduction-piper-table4.json").read_text())
MAIN = "from moe_repro.cli import main; main()"


def repro(*args, timeout=180):
    # the timeout turns a hang (a FIFO opened for reading) into a failure, not a stuck test
    return subprocess.run(
        [sys.executable, "-c", MAIN, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def a_record(**changes) -> dict:
    record = copy.deepcopy(V1_REPRO)
    record.update(changes)
    return record


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture
def planted(tmp_path):
    """A store with one good piper-table4 run and a planted bad file beside it (newest)."""
    root = tmp_path / "store"
    folder = root / "reproductions" / "piper-table4"
    folder.mkdir(parents=True)
    (folder / "20260101T000000Z-good.json").write_text(json.dumps(a_record()))

    def plant(content, name="20990101T000000Z-planted.json"):
        path = folder / name
        if content == "FIFO":
            os.mkfifo(path)
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content))
        return path

    return root, plant


CASES = {
    "id with ../": a_record(id="../../escaped/pwned-by-id"),
    "id of another reproduction": a_record(id="piper-table1"),
    "figure name with ../": a_record(
        figures=[{"name": "../../escaped/pwned-fig", "title": "t", "series": []}]
    ),
    "figures not a list": a_record(figures="a string"),
    "figures holding a number": a_record(figures=[42]),
    "figure without a title": a_record(figures=[{"name": "f", "series": []}]),
    "NaN graded match": a_record(
        cells=[{**V1_REPRO["cells"][0], "ours": math.nan, "verdict": "match"}]
    ),
    "200,000-deep nesting": deep_json(200_000),
    "70-deep nesting": a_record(extra={"x": json.loads(deep_json(70))}),
    "FIFO named *.json": "FIFO",
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_store_names_a_planted_file_once_and_keeps_the_good_run(planted, case):
    root, plant = planted
    bad = plant(CASES[case])
    seen = []
    store = ResultsStore(root, on_unreadable=lambda e: seen.append(str(e)))
    latest = store.latest("reproduction", "piper-table4")
    assert latest is not None and latest.id == "piper-table4" and not latest.figures
    assert len(store.runs("reproduction", "piper-table4")) == 1
    assert len(seen) == 1 and str(bad) in seen[0], seen


@pytest.mark.parametrize("case", list(CASES))
def test_every_command_that_reads_the_store_survives_a_planted_file(planted, tmp_path, case):
    root, plant = planted
    bad = plant(CASES[case])
    before = files_under(tmp_path)
    site = tmp_path / "site"

    res = repro("--results", root, "site", "build", "--out", site)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    warned = [line for line in res.stderr.splitlines() if str(bad) in line]
    assert len(warned) == 1 and "warning" in warned[0], res.stderr
    written = files_under(tmp_path) - before
    assert written and all(w.startswith("site") for w in written), sorted(written)[:5]
    assert not any("pwned" in w or "escaped" in w for w in files_under(tmp_path))
    page = (site / "repro" / "piper-table4.html").read_text()
    assert "piper-table4" in page and (site / "repro" / "piper-table4.json").is_file()
    # the index links only pages that exist
    for href in ("repro/piper-table4.html", "suites/gemm.html"):
        assert (site / href).is_file()

    res = repro("--results", root, "export", "--kind", "reproductions", "--out", tmp_path / "x.csv")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert str(bad) in res.stderr and "piper-table4" in (tmp_path / "x.csv").read_text()

    # the gate refuses a directory holding a file that is not a result (exit 2, naming it),
    # except a FIFO, which is passed over unread with a warning; it reads result files by
    # their content, not by the folder they sit in, so a valid record filed elsewhere counts;
    # a NaN graded match is read for its number, and a non-finite current number is a regression
    res = repro("gate", "--baseline", root, "--current", root)
    assert "Traceback" not in res.stderr, res.stderr
    if case == "id of another reproduction":
        assert res.returncode == 0 and res.stderr == "", res.stderr
    elif case == "NaN graded match":
        assert res.returncode == 1 and "not finite" in res.stdout and res.stderr == "", res.stderr
    else:
        assert len(res.stderr.strip().splitlines()) == 1 and bad.name in res.stderr, res.stderr
        assert res.returncode == (0 if case == "FIFO named *.json" else 2), res.stderr

    assert (
        bad.exists()
        and (root / "reproductions" / "piper-table4" / "20260101T000000Z-good.json").is_file()
    )


def test_a_figure_that_cannot_be_drawn_is_named_and_the_page_still_written(planted, tmp_path):
    root, plant = planted
    plant(a_record(figures=[{"name": "broken", "title": "t", "series": [{"x": 5, "y": None}]}]))
    res = repro("--results", root, "site", "build", "--out", tmp_path / "site")
    assert res.returncode == 0, res.stderr
    assert "figure 'broken' not drawn" in res.stderr and "Traceback" not in res.stderr
    assert (tmp_path / "site" / "repro" / "piper-table4.html").is_file()
    assert not list((tmp_path / "site" / "repro").glob("piper-table4-broken.*"))


@pytest.mark.parametrize("name", ["../x.html", "a/b.html", "..", ".hidden", "", "x..y"])
def test_inside_refuses_names_that_are_not_plain(tmp_path, name):
    with pytest.raises(ValueError):
        inside(tmp_path, name)


def test_inside_refuses_a_symlink_that_leads_out(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "page.html").symlink_to(tmp_path / "outside.html")
    with pytest.raises(ValueError, match="outside"):
        inside(tmp_path / "site", "page.html")
    assert inside(tmp_path / "site", "other.html") == tmp_path / "site" / "other.html"


def test_nan_graded_match_is_refused_by_the_schema_and_deviates_is_kept():
    cell = {**V1_REPRO["cells"][0], "ours": math.nan}
    with pytest.raises(UnreadableRecord, match="graded match but ours is nan"):
        validate(a_record(cells=[{**cell, "verdict": "match"}]))
    kept = validate(a_record(cells=[{**cell, "verdict": "deviates"}]))
    assert math.isnan(kept.cells[0].ours)


_WRITER = """
import sys
from moe_repro.records.record import load_record
from moe_repro.records.store import ResultsStore
record = load_record(sys.argv[2])
record.extra = {"writer": int(sys.argv[3])}
store = ResultsStore(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()  # every writer is ready: go
print(store.save(record), flush=True)
"""


def test_eight_writers_saving_at_the_same_moment_keep_eight_files(tmp_path):
    source = tmp_path / "r.json"
    source.write_text(
        json.dumps(a_record())
    )  # one timestamp and commit: every writer wants one name
    root = tmp_path / "store"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(root), str(source), str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 8  # imports done
    for p in procs:
        p.stdin.write("\n")
        p.stdin.flush()
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 8, outs
    folder = root / "reproductions" / "piper-table4"
    files = sorted(p for p in folder.iterdir())
    assert len(files) == 8 and not [p for p in files if p.name.startswith(".")]
    writers = sorted(load_record(p).extra["writer"] for p in files)
    assert writers == list(range(8))


def test_a_saved_file_name_is_made_only_of_plain_characters(tmp_path):
    record = validate(
        a_record(environment={"timestamp": "../../../escaped", "git_commit": "../x/y"})
    )
    path = ResultsStore(tmp_path / "store").save(record)
    assert path.parent == tmp_path / "store" / "reproductions" / "piper-table4"
    assert "/" not in path.name and not path.name.startswith(".")
    assert not (tmp_path / "escaped").exists()


@pytest.mark.parametrize("name", ["..", ".", "", ".hidden"])
def test_the_store_refuses_a_name_that_is_no_folder_of_its_own(tmp_path, name):
    with pytest.raises(ValueError):
        ResultsStore(tmp_path).history("reproduction", name)


def test_a_stored_peer_run_that_cannot_be_laid_out_is_named_and_left_out(tmp_path):
    root = tmp_path / "store"
    folder = root / "suites" / "moe-layer"
    folder.mkdir(parents=True)
    run = {
        "kind": "suite",
        "schema_version": 2,
        "suite": "moe-layer",
        "environment": {},
        "params": ["impl", "stage"],
        "records": [{"peer": "megatron-core 0.0", "time_s": "fast"}],
    }
    (folder / "20990101T000000Z-x.json").write_text(json.dumps(run))
    res = repro("--results", root, "site", "build", "--out", tmp_path / "site")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "peers page: moe-layer" in res.stderr and "left out" in res.stderr
    assert (tmp_path / "site" / "peers.html").is_file() and (
        tmp_path / "site" / "index.html"
    ).is_file()


def test_a_fifo_planted_in_the_site_folder_is_refused_not_waited_on(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    os.mkfifo(site / "index.html")
    with pytest.raises(ValueError, match="not a regular file"):
        inside(site, "index.html")
    res = repro("--results", tmp_path / "store", "site", "build", "--out", site)
    # one error line (the progress lines of `site build` come before it), no traceback
    errors = [line for line in res.stderr.splitlines() if not line.startswith("site build: ")]
    assert res.returncode == 1 and len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "not a regular file" in res.stderr
    assert stat.S_ISFIFO(os.lstat(site / "index.html").st_mode)


def test_without_hard_links_saves_still_never_overwrite(tmp_path, monkeypatch):
    import errno

    def no_link(src, dst):
        raise OSError(errno.EPERM, "hard links not supported here")

    monkeypatch.setattr(os, "link", no_link)
    record = validate(a_record())
    store = ResultsStore(tmp_path / "store")
    paths = [store.save(record) for _ in range(3)]
    assert len(set(paths)) == 3 and all(load_record(p) == record for p in paths)
    assert sorted(p.name for p in paths[0].parent.iterdir()) == sorted(p.name for p in paths)
