"""The result record: old files migrate, new ones round-trip, bad ones are named and skipped.

tests/data/v1-reproduction-piper-table4.json is piper-table4 as .ci/baseline.json stored it
before the schema existed; tests/data/v1-suite-gemm.json has the keys the bench command wrote
then (suite, description, params, metrics, records, environment), without kind or version.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from moe_repro.cli import cli
from moe_repro.records.record import (
    SCHEMA_VERSION,
    ReproductionRecord,
    SuiteRecord,
    UnreadableRecord,
    dump,
    load_record,
    load_records,
    validate,
)
from moe_repro.records.store import ResultsStore

DATA = Path(__file__).parent / "data"
V1_REPRO = DATA / "v1-reproduction-piper-table4.json"
V1_SUITE = DATA / "v1-suite-gemm.json"


def test_version_1_files_migrate_and_validate():
    old = json.loads(V1_REPRO.read_text())
    assert "kind" not in old and "schema_version" not in old
    repro = load_record(V1_REPRO)
    assert isinstance(repro, ReproductionRecord) and repro.kind == "reproduction"
    assert repro.schema_version == SCHEMA_VERSION
    assert [c.ours for c in repro.cells] == [c["ours"] for c in old["cells"]]
    suite = load_record(V1_SUITE)
    assert isinstance(suite, SuiteRecord) and suite.suite == "gemm"
    assert suite.records == json.loads(V1_SUITE.read_text())["records"]


def test_a_record_round_trips_through_json(tmp_path):
    record = load_record(V1_REPRO)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(dump(record)))
    again = load_record(path)
    assert again == record
    assert json.loads(path.read_text())["kind"] == "reproduction"


def test_nan_stays_nan_and_none_stays_none(tmp_path):
    data = json.loads(V1_REPRO.read_text())
    data["cells"][0]["ours"], data["cells"][1]["ours"] = float("nan"), None
    data["cells"][0]["verdict"] = "deviates"  # a NaN graded match is refused (test_store_trust.py)
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(dump(validate(data))))
    cells = load_record(path).cells
    assert cells[0].ours != cells[0].ours and cells[1].ours is None  # NaN is not equal to itself


@pytest.mark.parametrize(
    "text, reason",
    [
        ("{not json", "not JSON"),
        ("[]", "empty list"),
        ('"a string"', "JSON object"),
        ('{"kind": "table", "schema_version": 2, "environment": {}}', "kind"),
        (
            '{"kind": "reproduction", "schema_version": 99, "id": "x", "cells": [], "environment": {}}',
            "newer",
        ),
        (
            '{"id": "x", "cells": [{"row": "a", "column": "b", "verdict": "fine"}], "environment": {}}',
            "cells.0.verdict",
        ),
        ('{"suite": "gemm", "records": "many", "environment": {}}', "records"),
        ('{"id": "x", "cells": [], "environment": {}, "stray": 1}', "stray"),
        ('{"environment": {}}', "neither 'cells'"),
    ],
)
def test_a_bad_file_raises_one_error_that_names_it(tmp_path, text, reason):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UnreadableRecord) as err:
        load_records(path)
    assert str(path) in str(err.value) and reason in str(err.value)


warnings: list[str] = []  # what the store reported, in the test that watches it


def _store_with_a_corrupt_file(root: Path) -> tuple[ResultsStore, Path]:
    for name, source in (("reproductions/piper-table4", V1_REPRO), ("suites/gemm", V1_SUITE)):
        (root / name).mkdir(parents=True)
        shutil.copy(source, root / name / "20260101T000000Z-old.json")
    bad = root / "suites" / "gemm" / "20270101T000000Z-bad.json"  # newest, and broken
    bad.write_text('{"suite": "gemm", "records": [')
    return ResultsStore(root, on_unreadable=lambda e: warnings.append(str(e))), bad


def test_the_store_reports_a_bad_file_once_and_returns_the_good_ones(tmp_path):
    warnings.clear()
    store, bad = _store_with_a_corrupt_file(tmp_path)
    assert store.latest("suite", "gemm").suite == "gemm"  # the older, readable run
    assert [r.suite for r in store.runs("suite", "gemm")] == ["gemm"]
    assert len(warnings) == 1 and str(bad) in warnings[0]


@pytest.mark.parametrize(
    "args",
    [
        ["site", "build", "--out", "{out}/site"],
        ["export", "--kind", "suites", "--history", "--out", "{out}/x.csv"],
        ["run", "--all", "--how", "A", "--quiet"],
    ],
)
def test_site_export_and_run_all_skip_a_corrupt_file_naming_it(tmp_path, args):
    root = tmp_path / "store"
    _, bad = _store_with_a_corrupt_file(root)
    if args[0] == "run":  # a corrupt stored reproduction, which run --all reads to resume
        bad = root / "reproductions" / "piper-table4" / "20270101T000000Z-bad.json"
        bad.write_text("{")
    res = CliRunner().invoke(cli, ["--results", str(root), *[a.format(out=tmp_path) for a in args]])
    assert res.exit_code == 0, res.output
    named = [line for line in res.output.splitlines() if str(bad) in line]
    assert len(named) == 1 and "warning" in named[0]
