import json
import os

import pytest

from moe_repro.records.atomic import atomic_write_json, atomic_write_text
from moe_repro.records.record import ReproductionRecord
from moe_repro.records.store import ResultsStore


def test_atomic_write_replaces_whole_file(tmp_path):
    p = tmp_path / "a" / "x.json"
    atomic_write_json(p, {"v": 1})
    atomic_write_json(p, {"v": 2})
    assert json.loads(p.read_text()) == {"v": 2}
    assert [f.name for f in p.parent.iterdir()] == ["x.json"]


def test_interrupted_write_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    p = tmp_path / "x.txt"
    atomic_write_text(p, "old")

    def boom(src, dst):
        raise KeyboardInterrupt  # as if the user pressed ^C between write and rename

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(p, "new" * 1000)
    monkeypatch.undo()
    assert p.read_text() == "old"
    assert [f.name for f in tmp_path.iterdir()] == ["x.txt"]


def _record(n: int, ts: str) -> ReproductionRecord:
    return ReproductionRecord(
        id="piper-table4",
        title=f"run {n}",
        cells=[],
        environment={"timestamp": ts, "git_commit": "abc"},
    )


def test_store_keeps_every_run_and_finds_the_latest(tmp_path):
    store = ResultsStore(tmp_path)
    store.save(_record(1, "2026-01-01T00:00:00+00:00"))
    store.save(_record(2, "2026-01-02T00:00:00+00:00"))
    store.save(_record(3, "2026-01-02T00:00:00+00:00"))
    assert len(store.history("reproduction", "piper-table4")) == 3
    assert store.latest("reproduction", "piper-table4").title in ("run 2", "run 3")
    assert store.latest("suite", "nothing") is None
    assert store.names("reproduction") == ["piper-table4"]
    with pytest.raises(ValueError):
        store.history("elsewhere", "x")


def test_written_files_follow_the_umask_not_mkstemps_0600(tmp_path):
    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "page.html", "<p>hi</p>")
    finally:
        os.umask(old)
    assert p.stat().st_mode & 0o777 == 0o644


def test_runs_saved_in_the_same_second_keep_their_order():
    # "-" sorts before ".": by plain name the second run of a second ("T-c-1.json") would come
    # before the first ("T-c.json") and `latest` would return the older one
    from pathlib import Path

    from moe_repro.records.store import _run_order

    saved = [
        "20261125T143620Z-abc.json",
        "20261125T143620Z-abc-1.json",
        "20261125T143620Z-abc-2.json",
        "20261125T143620Z-abc-10.json",
    ]
    older = ["20261125T143619Z-abd.json"]
    shuffled = [saved[2], older[0], saved[3], saved[0], saved[1]]
    assert sorted(shuffled, key=lambda n: _run_order(Path(n))) == older + saved
