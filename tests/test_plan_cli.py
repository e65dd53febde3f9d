"""`repro plan`: the parallel planner (default) and Piper's PP x EP planner (--method piper); one-line
errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _repro(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-c", "from moe_repro.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_plan_deepseek_v3_frontier_json(tmp_path):
    out = tmp_path / "p.json"
    r = _repro(
        "plan",
        "--method",
        "piper",
        "--model",
        "deepseek-v3",
        "--platform",
        "frontier",
        "--nodes",
        "64",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert "pp" in r.stdout and "best:" in r.stdout
    assert (
        "Piper's performance model is not among repro validate's"
        in r.stdout.strip().splitlines()[-2]
    )
    doc = json.loads(out.read_text())
    assert doc["gpus"] == 512 and doc["candidates"]
    for c in doc["candidates"]:
        assert c["pp"] * c["ep"] == 512 and 256 % c["ep"] == 0
        assert set(c) >= {"pp", "ep", "peak_bytes", "feasible", "why_not", "estimate"}


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model", "nope", "--platform", "frontier", "--nodes", "4"], "unknown model 'nope'"),
        (["--model", "tiny-moe", "--platform", "mars", "--nodes", "4"], "unknown platform 'mars'"),
        (
            ["--model", "tiny-moe", "--platform", "frontier", "--nodes", "0"],
            "--nodes must be positive",
        ),
        (
            ["--model", "tiny-moe", "--platform", "frontier", "--nodes", "1", "--seq", "-5"],
            "--seq must be positive",
        ),
        (["--model", "tiny-moe", "--platform", "missing.json", "--nodes", "1"], "not found"),
        # Piper's planner raises on a layout that breaks Eq. 7-9 (the default method reports it among
        # the rejected instead): these pass --method piper
        (
            [
                "--method",
                "piper",
                "--model",
                "deepseek-v3",
                "--platform",
                "frontier",
                "--nodes",
                "4",
                "--pp",
                "2",
                "--ep",
                "32",
            ],
            "is not the 32 GPUs",
        ),
        (
            [
                "--method",
                "piper",
                "--model",
                "deepseek-v3",
                "--platform",
                "frontier",
                "--nodes",
                "3",
                "--pp",
                "1",
                "--ep",
                "24",
            ],
            "EP=24 does not divide the expert count E=256",
        ),
        (
            [
                "--method",
                "piper",
                "--model",
                "tiny-moe",
                "--platform",
                "frontier",
                "--nodes",
                "1",
                "--pp",
                "8",
                "--ep",
                "1",
            ],
            "PP=8 exceeds the layer count L=4",
        ),
        (
            [
                "--method",
                "piper",
                "--model",
                "tiny-moe",
                "--platform",
                "frontier",
                "--nodes",
                "1",
                "--pp",
                "8",
            ],
            "--pp and --ep go together",
        ),
        # the default method's own input checks
        (
            ["--model", "gpt3-175b", "--platform", "dgx-h100", "--nodes", "64", "--zero", "4"],
            "--zero must be ZeRO stages 0-3",
        ),
        (
            [
                "--model",
                "gpt3-175b",
                "--platform",
                "dgx-h100",
                "--nodes",
                "64",
                "--recompute",
                "some",
            ],
            "--recompute must be none, selective or full",
        ),
        (
            [
                "--model",
                "gpt3-175b",
                "--platform",
                "dgx-h100",
                "--nodes",
                "64",
                "--precision",
                "bf16-adamw",
            ],
            "unknown precision preset 'bf16-adamw'; did you mean bf16-adam",
        ),
        (
            ["--model", "gpt3-175b", "--platform", "dgx-h100", "--nodes", "64", "--tp", "0"],
            "--tp must be positive",
        ),
        (
            ["--model", "gpt3-175b", "--platform", "dgx-h100", "--nodes", "64", "--top", "0"],
            "--top must be positive",
        ),
        (
            [
                "--model",
                "gpt3-175b",
                "--platform",
                "dgx-h100",
                "--nodes",
                "64",
                "--schedule",
                "gpipe",
            ],
            "--schedule applies to --method piper",
        ),
        (
            [
                "--method",
                "piper",
                "--model",
                "gpt3-175b",
                "--platform",
                "dgx-h100",
                "--nodes",
                "64",
                "--tp",
                "8",
            ],
            "--tp applies to --method parallel",
        ),
    ],
)
def test_bad_input_one_line_exit_2(args, needle):
    r = _repro("plan", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_plan_one_layout():
    r = _repro(
        "plan",
        "--method",
        "piper",
        "--model",
        "deepseek-v3",
        "--platform",
        "frontier",
        "--nodes",
        "64",
        "--pp",
        "16",
        "--ep",
        "32",
    )
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line[:2].strip().isdigit()]
    assert [row[:2] for row in rows] == [["16", "32"]]


def test_plan_with_a_copied_profile(tmp_path):
    from importlib import resources

    doc = json.loads(
        resources.files("moe_repro.components.network")
        .joinpath("platforms", "frontier.json")
        .read_text()
    )
    doc["gpu"]["hbm_GB"] = 1  # an edited copy: nothing fits in 1 GB
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(doc))
    r = _repro(
        "plan",
        "--method",
        "piper",
        "--model",
        "mixtral-8x7b",
        "--platform",
        str(path),
        "--nodes",
        "1",
    )
    assert r.returncode == 0, r.stderr
    assert "best: none fits" in r.stdout and "Eq. 11" in r.stdout
    r = _repro("plan", "--model", "mixtral-8x7b", "--platform", str(path), "--nodes", "1")
    assert r.returncode == 0, r.stderr
    assert "best: none fits" in r.stdout and "no candidate fits; the closest misses" in r.stdout
    assert "GiB HBM usable (largest term:" in r.stdout


def test_plan_gpt3_default_method(tmp_path):
    out = tmp_path / "p.json"
    r = _repro(
        "plan",
        "--model",
        "gpt3-175b",
        "--nodes",
        "64",
        "--platform",
        "dgx-h100",
        "--top",
        "5",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(
        "model: gpt3-175b (GPT-3 175B): 174.6B parameters, 174.6B active per token;"
    )
    assert "FLOP forward" in lines[0] and "FLOP training per token at seq 4096" in lines[0]
    assert "64 nodes x 8 = 512 GPUs" in lines[1]
    header = next(i for i, line in enumerate(lines) if line.startswith("#"))
    for col in (
        "TP",
        "SP",
        "PP",
        "VPP",
        "DP",
        "EP",
        "CP",
        "ZeRO",
        "recompute",
        "mb",
        "M",
        "weights",
        "grads",
        "optim",
        "activ",
        "buffers",
        "total GiB",
        "step s",
        "MFU",
    ):
        assert col in lines[header]
    rows = [line.split() for line in lines[header + 2 : header + 7]]
    assert len(rows) == 5 and [row[0] for row in rows] == ["1", "2", "3", "4", "5"]
    for row in rows:
        tp, pp, dp, cp = int(row[1]), int(row[3]), int(row[5]), int(row[7])
        assert tp <= 8 and tp * pp * dp * cp == 512 and row[-1].endswith("%")
    assert lines.index("assumptions:") > lines.index("rejected (count: reason):") > header
    assert lines[-1].startswith("best: TP ")
    doc = json.loads(out.read_text())
    assert (
        doc["method"] == "parallel"
        and doc["gpus"] == 512
        and doc["params"]["total"] == 174_566_105_088
    )
    assert set(doc["flops_per_token"]) >= {"forward", "training"}
    c = doc["candidates"][0]
    assert set(c) >= {
        "dp",
        "tp",
        "sp",
        "pp",
        "vpp",
        "ep",
        "cp",
        "zero",
        "recompute",
        "micro_batch",
        "micro_batches",
        "memory",
        "step_s",
        "parts",
        "mfu",
        "feasible",
        "why_not",
    }
    assert set(c["memory"]) >= {"weights", "grads", "optimizer", "activations", "buffers", "total"}
    assert doc["rejected"] and all(set(r) == {"reason", "count"} for r in doc["rejected"])
    assert doc["assumptions"]


def test_plan_deepseek_v3_default_method():
    r = _repro("plan", "--model", "deepseek-v3", "--nodes", "64", "--platform", "dgx-h100")
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert (
        "671.0B parameters, 37.6B active per token" in first and "GFLOP training per token" in first
    )
    header = next(line for line in r.stdout.splitlines() if line.startswith("#"))
    assert header.split()[:8] == ["#", "TP", "SP", "PP", "VPP", "DP", "EP", "CP"]
    assert "best: TP" in r.stdout


def test_plan_tp16_is_refused_with_its_reason():
    # A pinned degree no layout can take is bad input, said in one line before any search (it
    # used to end in "best: none fits", leaving the reader to find the rejected family).
    r = _repro(
        "plan", "--model", "gpt3-175b", "--nodes", "64", "--platform", "dgx-h100", "--tp", "16"
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "repro: error: --tp 16: TP 16 > 8 GPUs per node"


def test_plan_etp_and_block_recompute(tmp_path):
    out = tmp_path / "p.json"
    r = _repro(
        "plan",
        "--model",
        "deepseek-v3",
        "--nodes",
        "64",
        "--platform",
        "dgx-h100",
        "--tp",
        "2",
        "--pp",
        "16",
        "--ep",
        "16",
        "--etp",
        "2",
        "--zero",
        "1",
        "--recompute",
        "full:2",
        "--top",
        "3",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(line for line in lines if line.startswith("#"))
    assert header.split()[:10] == ["#", "TP", "SP", "PP", "VPP", "DP", "EP", "CP", "ETP", "ZeRO"]
    assert (
        "full 2/4 layers" in r.stdout and " x ETP 2, ZeRO-1, recompute full 2/4 layers" in lines[-1]
    )
    doc = json.loads(out.read_text())
    c = doc["candidates"][0]
    assert (c["etp"], c["recompute"], c["recompute_layers"], c["chunk_layers"]) == (
        2,
        "full:2",
        2,
        4,
    )
    assert "etp" in c["parts"] and c["comm_bytes"]["etp"] > 0
    bad = _repro(
        "plan",
        "--model",
        "deepseek-v3",
        "--nodes",
        "64",
        "--platform",
        "dgx-h100",
        "--recompute",
        "full:0",
    )
    assert bad.returncode == 2 and "--recompute must be" in bad.stderr


def test_plan_takes_the_megatron_2021_step_options(tmp_path):
    """--no-overlap-dp and --unfused-grad-accumulation reach the planner: the same fixed layout
    gets an exposed DP part and a gradient-accumulation part, so its step is slower; piper refuses
    them in one line."""
    base = [
        "plan",
        "--model",
        "gpt3-175b",
        "--platform",
        "dgx-a100",
        "--nodes",
        "64",
        "--tp",
        "8",
        "--pp",
        "8",
        "--vpp",
        "1",
        "--zero",
        "0",
        "--micro-batches",
        "64",
        "--top",
        "1",
    ]
    parts = []
    for extra in ([], ["--no-overlap-dp", "--unfused-grad-accumulation"]):
        out = tmp_path / f"p{len(extra)}.json"
        r = _repro(*base, *extra, "--json", str(out))
        assert r.returncode == 0, r.stderr
        best = json.loads(out.read_text())["candidates"][0]
        parts.append((best["parts"], best["step_s"]))
    (fused, step_fused), (unfused, step_unfused) = parts
    assert unfused.get("grad_accum", 0) > fused.get("grad_accum", 0) == 0
    assert unfused.get("dp", 0) > fused.get("dp", 0)
    assert step_unfused > step_fused
    r = _repro(
        "plan",
        "--method",
        "piper",
        "--model",
        "deepseek-v3",
        "--platform",
        "frontier",
        "--nodes",
        "4",
        "--unfused-grad-accumulation",
    )
    assert (
        r.returncode == 2
        and "applies to --method parallel" in r.stderr
        and "Traceback" not in r.stderr
    )


def test_every_plan_says_how_far_its_step_time_held_against_published_runs(tmp_path):
    """The planner's predicted step time is printed beside the step-time predictor's record in
    `repro validate` (its range of errors and MAPE over the published runs, and whether this
    platform is among those scored), and the JSON carries the same numbers."""
    from moe_repro.reproductions.validation import validate

    (summary,) = validate(("step-time",))
    errors = [x.error for x in summary.scored]
    out = tmp_path / "p.json"
    r = _repro(
        "plan",
        "--model",
        "mixtral-8x7b",
        "--platform",
        "dgx-a100",
        "--nodes",
        "4",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-2]  # just above the closing best: line
    assert r.stdout.strip().splitlines()[-1].startswith("best: ")
    assert last.startswith(
        f"how far to trust the step time: scored against {len(errors)} published runs"
    )
    assert len(errors) >= 10
    assert f"MAPE {summary.mape:.1%}" in last and "this platform" in last
    assert f"{min(errors):+.0%} to {max(errors):+.0%}" in last
    track = json.loads(out.read_text())["step_time_validation"]
    assert track["mape"] == pytest.approx(summary.mape) and track["points"] == len(errors)
    r = _repro("plan", "--model", "mixtral-8x7b", "--platform", "dgx-h100", "--nodes", "4")
    assert r.returncode == 0, r.stderr
    assert "dgx-a100 only, not this platform" in r.stdout.strip().splitlines()[-2]


def test_plan_takes_uneven_first_and_last_stages_and_fp8_gemms(tmp_path):
    """Megatron-LM's --decoder-first/last-pipeline-num-layers reach the search (the stages
    between share the rest), and --gemm-precision fp8 runs the linear GEMMs at the profile's FP8
    rate: the same layout is faster, its memory unchanged."""
    out = tmp_path / "p.json"
    base = ("plan", "--model", "llama3-8b", "--platform", "dgx-h100", "--nodes", "1", "--tp", "1",
            "--pp", "4", "--vpp", "1", "--zero", "1", "--recompute", "none", "--json", str(out))  # fmt: skip
    r = _repro(*base, "--first-stage-layers", "5", "--last-stage-layers", "11")
    assert r.returncode == 0, r.stderr
    best = json.loads(out.read_text())["candidates"][0]
    assert best["pp"] == 4 and best["layers_per_stage"] == "5 + 8 x 2 + 11"
    assert (best["first_stage_layers"], best["last_stage_layers"]) == (5, 11)
    r = _repro(*base)
    even = json.loads(out.read_text())["candidates"][0]
    assert r.returncode == 0 and even["layers_per_stage"] == "8" and even["pp"] == 4
    r = _repro(*base, "--gemm-precision", "fp8")
    fp8 = json.loads(out.read_text())["candidates"][0]
    assert r.returncode == 0 and fp8["gemm_precision"] == "fp8" and even["gemm_precision"] == "bf16"
    assert fp8["step_s"] < even["step_s"]
    assert fp8["memory"]["total"] == even["memory"]["total"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--pp", "4", "--first-stage-layers", "40"), "uneven split: first=40"),
        (("--first-stage-layers", "0"), "--first-stage-layers must be positive"),
        (("--gemm-precision", "fp8", "--platform", "frontier"), "no gpu.peak_fp8_tflops"),
        (
            ("--method", "piper", "--model", "tiny-moe", "--gemm-precision", "fp8"),
            "--gemm-precision applies to --method parallel",
        ),
    ],
)
def test_uneven_stages_and_fp8_refuse_bad_input_in_one_line(args, needle):
    given = dict(zip(args[::2], args[1::2]))
    full = {"--model": "llama3-8b", "--platform": "dgx-h100", "--nodes": "1", **given}
    r = _repro("plan", *[x for kv in full.items() for x in kv])
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
