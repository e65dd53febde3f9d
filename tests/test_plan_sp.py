"""`repro plan --sp/--no-sp` fixes sequence parallelism instead of letting the search pick it."""

import json

from click.testing import CliRunner

from moe_repro.cli import cli

ARGS = ["plan", "--model", "qwen3-235b-a22b", "--nodes", "32", "--platform", "dgx-h100"]


def _candidates(tmp_path, *flags):
    out = tmp_path / "p.json"
    r = CliRunner().invoke(cli, [*ARGS, *flags, "--json", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())["candidates"]


def test_sp_fixed_off_and_on(tmp_path):
    off = _candidates(tmp_path, "--no-sp")
    on = _candidates(tmp_path, "--sp")
    assert any(c["tp"] > 1 for c in off) and any(c["tp"] > 1 for c in on)
    assert not any(c["sp"] for c in off)
    assert all(c["sp"] for c in on if c["tp"] > 1)


def test_sp_refused_with_the_piper_method():
    r = CliRunner().invoke(cli, [*ARGS, "--sp", "--method", "piper", "--pp", "4", "--ep", "8"])
    assert r.exit_code == 2 and "--sp/--no-sp applies to --method parallel" in r.output
