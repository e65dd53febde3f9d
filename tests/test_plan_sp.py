"""`repro plan --sp/--no-sp` fixes sequence parallelism instead of letting the search pick it."""

import json

from click.testing import CliRunner

from moe_repro.cli import cli

ARGS = ["plan", "--model", "gpt3-175b", "--nodes", "64", "--platform", "dgx-a100"]


def _candidates(tmp_path, *flags):
    out = tmp_path / "p.json"
    r = CliRunner().invoke(cli, [*ARGS, *flags, "--json", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())["candidates"]


def test_sp_fixed_off_and_on(tmp_path):
    off = _candidates(tmp_path, "--tp", "8", "--no-sp")
    on = _candidates(tmp_path, "--tp", "8", "--sp")
    free = _candidates(tmp_path, "--tp", "8")
    assert off and on
    assert not any(c["sp"] for c in off)
    assert all(c["sp"] for c in on)
    assert any(c["sp"] for c in free)  # left free, the search picks SP at TP 8 here


def test_sp_off_on_an_moe_model_with_tp_is_rejected_with_the_reason():
    args = ["plan", "--model", "qwen3-235b-a22b", "--nodes", "32", "--platform", "dgx-h100"]
    r = CliRunner().invoke(cli, [*args, "--tp", "4", "--no-sp"])
    assert "SP off with TP > 1 on an MoE model" in r.output


def test_sp_refused_with_the_piper_method():
    r = CliRunner().invoke(cli, [*ARGS, "--sp", "--method", "piper", "--pp", "4", "--ep", "8"])
    assert r.exit_code == 2 and "--sp/--no-sp applies to --method parallel" in r.output
