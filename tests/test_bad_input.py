"""Bad input gets one line and exit 2 before any work starts (issue 17's list, one case each)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def repro(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-c", "from moe_repro.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def frontier_with(tmp_path, edit) -> str:
    """The shipped frontier profile with one field broken by ``edit`` (a function of the dict)."""
    from importlib import resources

    doc = json.loads(
        resources.files("moe_repro.components.network")
        .joinpath("platforms", "frontier.json")
        .read_text()
    )
    edit(doc)
    path = tmp_path / "p.json"
    # allow_nan: write NaN/Infinity as JSON's non-standard constants, as a careless tool would
    path.write_text(json.dumps(doc, allow_nan=True) if isinstance(doc, dict) else json.dumps(doc))
    return str(path)


def set_field(path: str, value):
    def edit(doc):
        node = doc
        *parents, last = path.split(".")
        for part in parents:
            node = node[part] if not part.isdigit() else node[int(part)]
        node[last if not last.isdigit() else int(last)] = value

    return edit


CASES = {
    "train lr nan": (["train", "--lr", "nan"], "lr must be a positive finite number"),
    "train seq-len 0": (["train", "--seq-len", "0"], "seq_len must be >= 1"),
    "train seq-len -5": (["train", "--seq-len", "-5"], "seq_len must be >= 1"),
    "train layers 0": (["train", "--layers", "0"], "n_layers must be >= 1"),
    "train unknown model": (["train", "--model", "tiny-mo"], "did you mean tiny-moe?"),
    "plan unknown model": (
        ["plan", "--model", "deepseek-v4", "--platform", "frontier", "--nodes", "4"],
        "did you mean",
    ),
    "plan unknown platform": (
        ["plan", "--model", "deepseek-v3", "--platform", "fronteir", "--nodes", "4"],
        "did you mean frontier?",
    ),
    # a name longer than the file system allows (the CLI fuzz test's): not a file, one line
    "plan platform name too long for a file": (
        ["plan", "--model", "deepseek-v3", "--platform", "x" * 300, "--nodes", "4"],
        "unknown platform",
    ),
    "plan platform file name too long": (
        ["plan", "--model", "deepseek-v3", "--platform", "x" * 300 + ".json", "--nodes", "4"],
        "not found",
    ),
    "list unknown paper": (["list", "--paper", "pipr"], "did you mean piper?"),
    "alltoall fault rank outside the world": (
        ["bench", "alltoall", "--nodes", "1", "--fault", "kill:99"],
        "rank 99 is not in the world of 2 ranks",
    ),
    "plan json into a missing directory": (
        [
            "plan",
            "--model",
            "deepseek-v3",
            "--platform",
            "frontier",
            "--nodes",
            "4",
            "--json",
            "/nonexistent-dir/x/p.json",
        ],
        "does not exist (it is not created)",
    ),
    "run json into a missing directory": (
        ["run", "piper-table4", "--json", "/nonexistent-dir/x/r.json"],
        "does not exist (it is not created)",
    ),
    "moe-layer top-k above experts": (
        ["bench", "moe-layer", "--top-k", "9", "--experts", "8"],
        "top_k=9 exceeds experts=8",
    ),
    "moe-layer capacity factor nan": (
        ["bench", "moe-layer", "--capacity-factor", "nan"],
        "capacity_factor must be a finite number",
    ),
    "bench json into a missing directory": (
        ["bench", "gemm", "--json", "/nonexistent-dir/x/b.json"],
        "does not exist (it is not created)",
    ),
    "moe-layer dtype float8": (["bench", "moe-layer", "--dtype", "float8"], "dtype must be one of"),
    "gemm dtype float8": (
        ["bench", "gemm", "--dtype", "float8"],
        "dtype must be one of float32, bfloat16",
    ),
    "moe-layer capacity factor -1": (
        ["bench", "moe-layer", "--capacity-factor", "-1"],
        "capacity_factor must be >= 0.01, got -1",
    ),
    "vocab-loss unknown impl": (
        ["bench", "vocab-loss", "--impl", "shardd"],
        "did you mean sharded?",
    ),
    "llep-layer unknown layer": (
        ["bench", "llep-layer", "--layer", "foo"],
        "layer must be one of plain, llep",
    ),
    "gemm unknown device": (
        ["bench", "gemm", "--device", "tpu"],
        "device must be auto, cpu or cuda[:N]",
    ),
    "plan tp that divides no heads": (
        ["plan", "--model", "deepseek-v3", "--platform", "frontier", "--nodes", "4", "--tp", "7"],
        "--tp 7: TP 7 does not divide 128 heads",
    ),
    "plan ep that divides no experts": (
        ["plan", "--model", "deepseek-v3", "--platform", "frontier", "--nodes", "4", "--ep", "7"],
        "--ep 7: EP 7 does not divide 256 experts",
    ),
    "plan pp that divides no GPU count": (
        ["plan", "--model", "deepseek-v3", "--platform", "frontier", "--nodes", "4", "--pp", "7"],
        "--pp 7: PP 7 does not divide the 32 GPUs",
    ),
    "run --how empty": (["run", "--all", "--how", ""], "--how takes letters"),
    "run param overflowing to infinity": (
        ["run", "piper-table4", "--param", "gpus=1e400"],
        "--param gpus: '1e400' is not a finite number",
    ),
    "bench timeout nan": (
        ["bench", "allreduce", "--timeout", "nan"],
        "'nan' is not a finite number",
    ),
    "eplb skew nan": (["bench", "eplb-policy", "--skew", "nan"], "skew must be a finite number"),
    "gemm n with a zero": (["bench", "gemm", "--n", "64,0"], "n must be >= 1, got 0"),
    "alltoall 100000 nodes": (["bench", "alltoall", "--nodes", "100000"], "nodes must be <= 4096"),
    "memcopy 100 TB": (
        ["bench", "memcopy", "--mbytes", "100000000"],
        "GiB of memory available here",
    ),
    "allreduce 1000 local ranks": (
        ["bench", "allreduce", "--ranks", "1000"],
        "1000 local ranks requested; this machine runs at most",
    ),
}


def test_cuda_without_a_gpu_is_refused_before_any_rank_starts(results_dir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for suite in ("gemm", "moe-layer", "attention"):
        r = repro("bench", suite, "--device", "cuda", "--quick")
        assert r.returncode == 2, r.stderr
        assert (
            "this machine has no CUDA GPU" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        )


@pytest.mark.parametrize("name", list(CASES))
def test_bad_cli_input_is_one_line_and_exit_2(name, results_dir):
    args, needle = CASES[name]
    r = repro(*args)
    assert r.returncode == 2, (r.stdout[-500:], r.stderr[-500:])
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (results_dir.exists() and any(results_dir.rglob("*.json"))), "nothing stored"


PLATFORM_CASES = {
    "NaN": (set_field("gpu.peak_tflops", float("nan")), "NaN is not a finite number"),
    "Infinity": (set_field("node.nic_GBps", float("inf")), "Infinity is not a finite number"),
    "2.5 GPUs per node": (set_field("node.gpus", 2.5), "node.gpus must be a whole number"),
    "negative link bandwidth": (set_field("links.2.GBps", -25.0), "links[2].GBps must be positive"),
    "a taper above 1": (
        set_field("network.fabric.global_taper", 2.0),
        "global_taper must be in (0, 1]",
    ),
    "an unknown fabric": (
        set_field("network.fabric.kind", "torus"),
        "fabric.kind must be fat_tree",
    ),
    "a number where an object belongs": (
        set_field("network.fabric", 3),
        "network.fabric must be an object",
    ),
    "a number for the efficiency section": (
        set_field("efficiency", 0.7),
        "efficiency must be an object",
    ),
    "NIC affinity as text": (
        set_field("node.gpu_nic_affinity", "0,1"),
        "node.gpu_nic_affinity must be a list",
    ),
    "a GPU on two NICs": (
        set_field("node.gpu_nic_affinity", [[0, 1], [1, 2]]),
        "node.gpu_nic_affinity[1] holds 1",
    ),
    "negative framework overhead": (
        set_field("framework_overhead_GB", -1.0),
        "framework_overhead_GB must be >= 0",
    ),
    "a million GPUs per node": (set_field("node.gpus", 1000000), "node.gpus must be <= 1024"),
}


@pytest.mark.parametrize("name", list(PLATFORM_CASES))
def test_bad_platform_files_are_refused_by_every_command(name, tmp_path, results_dir):
    edit, needle = PLATFORM_CASES[name]
    path = frontier_with(tmp_path, edit)
    for args in (
        ["plan", "--model", "deepseek-v3", "--nodes", "4", "--platform", path],
        ["bench", "alltoall", "--nodes", "16", "--platform", path],
    ):
        r = repro(*args)
        assert r.returncode == 2 and needle in r.stderr and path in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_platform_file_that_is_not_an_object(tmp_path, results_dir):
    path = tmp_path / "list.json"
    path.write_text("[]")
    r = repro("plan", "--model", "deepseek-v3", "--nodes", "4", "--platform", str(path))
    assert r.returncode == 2 and "must be a JSON object, got list" in r.stderr


def test_a_huge_plan_is_answered(results_dir):
    # 10^8 nodes: the candidate search enumerates divisors up to sqrt(n), not every integer
    # (its time is measured in benchmarks/test_bench_planner.py; the timeout only stops a hang)
    r = repro("plan", "--model", "deepseek-v3", "--platform", "frontier", "--nodes", "100000000")
    assert r.returncode == 0 and "800000000 GPUs" in r.stdout
