import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from click.testing import CliRunner

from linkcheck import broken_links
from moe_repro.cli import cli
from moe_repro.records.record import CAUSES, VERDICTS
from conftest import patient
from procs import none_left_with_env, processes_with_env


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def repro(*args, env=None, timeout=120):
    """The real console entry point in a subprocess (exit codes and stderr as a user sees them)."""
    return subprocess.run(
        [sys.executable, "-c", "from moe_repro.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_list_shows_implemented_and_planned(results_dir):
    out = invoke("list")
    assert out.exit_code == 0
    assert "piper-table4" in out.output and "gemm" in out.output and "allreduce" in out.output
    data = json.loads(invoke("list", "--json").output)
    ids = {r["id"]: r for r in data["reproductions"]}
    assert ids["piper-table4"]["implemented"] is True
    assert len(ids) >= 35  # the whole DESIGN.md inventory is listed


def test_list_of_one_paper_and_a_misspelled_paper():
    data = json.loads(invoke("list", "--json", "--paper", "mop").output)
    assert [r["id"] for r in data["reproductions"]] == [
        "mop-table1",
        "mop-table2",
        "mop-vocab",
        "mop-llep",
    ]
    suites = {s["name"]: s for s in data["suites"]}
    assert suites["gemm"]["distributed"] is False and suites["allreduce"]["distributed"] is True
    done = repro("list", "--paper", "pipr")
    assert done.returncode == 2
    assert done.stderr.strip() == "repro: error: unknown paper 'pipr'; did you mean piper?"


# Imported by the command, any of these would mean `repro list` pays for torch or the specs.
HEAVY = ("torch", "numpy", "pandas", "matplotlib")
LAYERS_NOT_NEEDED = ("moe_repro.reproductions", "moe_repro.suites", "moe_repro.components")


@pytest.mark.parametrize(
    "args,code", [(["--help"], 0), (["list"], 0), (["list", "--json"], 0), (["run", "nosuch"], 2)]
)
def test_help_and_list_start_without_heavy_imports(args, code, tmp_path):
    """Run the command in a fresh interpreter and read which modules it imported (a typo in
    `repro run` is answered from the catalog, before the reports' matplotlib or torch load)."""
    program = (
        "import json, sys\n"
        "from moe_repro.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit as e:\n"
        f"    assert e.code in (None, {code}), e.code\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    if code:
        assert "unknown reproduction 'nosuch'" in done.stderr
    loaded = json.loads(done.stdout.splitlines()[-1])
    heavy = [m for m in loaded if m.split(".")[0] in HEAVY]
    layers = [m for m in loaded if m.startswith(LAYERS_NOT_NEEDED)]
    assert heavy == [] and layers == []


def test_run_writes_the_contract(results_dir, tmp_path):
    out_json = tmp_path / "out.json"
    res = invoke("run", "piper-table4", "--json", str(out_json), "--out", str(tmp_path / "rep"))
    assert res.exit_code == 0
    assert "Switch-Base" in res.output and "deviates" in res.output
    data = json.loads(out_json.read_text())
    assert {"id", "title", "cells", "environment"} <= set(data)
    for cell in data["cells"]:
        assert {"row", "column", "paper", "ours", "unit", "verdict"} <= set(cell)
        assert cell["verdict"] in VERDICTS
        if cell["verdict"] in ("deviates", "explained"):
            assert cell["note"]
        if cell["verdict"] == "explained":
            assert cell["cause"] in CAUSES
    env = data["environment"]
    for key in (
        "python",
        "torch",
        "cpu_model",
        "cpu_count",
        "hostname",
        "git_commit",
        "git_dirty",
        "timestamp",
        "command",
    ):
        assert key in env
    assert (tmp_path / "rep" / "piper-table4.html").exists()
    assert len(list((results_dir / "reproductions" / "piper-table4").glob("*.json"))) == 1


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "nope"], "unknown reproduction 'nope'"),
        (["run", "piper-tabel4"], "did you mean piper-table4"),
        (["run", "piper-table4", "--param", "gpus=0"], "positive"),
        (["bench", "gemmm"], "did you mean gemm"),
        (["bench", "gemm", "--param", "n=abc"], "cannot read"),
        (["bench", "gemm", "--size", "3"], "no parameter 'size'"),
        (["run", "--bogus"], "No such option"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(results_dir, args, needle):
    res = repro(*args)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_bench_gemm_via_cli(results_dir, tmp_path):
    out = tmp_path / "g.json"
    res = invoke("bench", "gemm", "--n", "32,48", "--repeats", "2", "--json", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["suite"] == "gemm" and len(data["records"]) == 2 and "environment" in data
    assert all(r["correct"] for r in data["records"])


def test_site_links_every_reproduction_page(results_dir, tmp_path):
    invoke("run", "piper-table4", "--quiet")
    invoke("bench", "gemm", "--n", "32", "--repeats", "2")
    site = tmp_path / "site"
    assert invoke("site", "build", "--out", str(site)).exit_code == 0
    index = (site / "index.html").read_text()
    listed = [r["id"] for r in json.loads(invoke("list", "--json").output)["reproductions"]]
    for rid in listed:  # every id of `repro list` has its page, run or not
        assert f'href="repro/{rid}.html"' in index, rid
        assert (site / "repro" / f"{rid}.html").exists()
    for suite in ("gemm", "allreduce"):
        assert f'href="suites/{suite}.html"' in index
    page = (site / "repro" / "piper-table4.html").read_text()
    assert "Mixtral 8x7B" in page and "repro run piper-table4" in page
    # the GiB reading is tried on the whole table and its refusal is on the page
    assert "in GiB (2^30 bytes)" in page and "not accepted" in page
    assert broken_links(site) == []


@pytest.mark.multiprocess
@pytest.mark.timing
def test_killed_rank_makes_bench_exit_nonzero_within_timeout(results_dir):
    tag = uuid.uuid4().hex
    env = dict(os.environ, MOE_REPRO_TEST_TAG=tag)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from moe_repro.cli import main; main()",
            "bench",
            "allreduce",
            "--ranks",
            "3",
            "--backend",
            "gloo",
            "--bytes",
            "4096",
            "--repeats",
            "100000",
            "--min-sample-s",
            "0.05",
            "--timeout",
            f"{patient(9):g}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        workers = []
        deadline = time.monotonic() + patient(
            30
        )  # a hang guard: a loaded machine starts ranks slowly
        while len(workers) < 3 and time.monotonic() < deadline:  # wait for the three ranks
            workers = [p for p in processes_with_env(tag) if p != proc.pid and _is_worker(p)]
            time.sleep(0.2)
        assert len(workers) == 3
        time.sleep(3)  # let them get into the timed collectives
        os.kill(workers[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=patient(30))  # a hang guard only: --timeout ends it first
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert "rank(s)" in err and "Traceback" not in err
    assert "did not finish" not in err  # found from the death, not at the timeout
    assert none_left_with_env(tag, patient(0.5))


def _is_worker(pid):
    try:
        return b"moe_repro.runtime.worker" in open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return False


def test_paper_rerun_resumes_unless_forced(results_dir, monkeypatch):
    from moe_repro.records import environment

    monkeypatch.setattr(
        environment, "git_state", lambda: {"git_commit": "c0ffee", "git_dirty": False}
    )
    first = invoke("run", "--paper", "piper", "--how", "A")
    assert first.exit_code == 0
    n_runs = len(list((results_dir / "reproductions" / "piper-table4").glob("*.json")))
    again = invoke("run", "--paper", "piper", "--how", "A")
    assert "piper-table4: up to date" in again.output
    assert len(list((results_dir / "reproductions" / "piper-table4").glob("*.json"))) == n_runs
    invoke("run", "--paper", "piper", "--how", "A", "--force")
    assert len(list((results_dir / "reproductions" / "piper-table4").glob("*.json"))) == n_runs + 1


def test_how_filter_rejects_unknown_letters(results_dir):
    res = repro("run", "--all", "--how", "Q")
    assert res.returncode == 2 and "--how" in res.stderr


def test_export_csv_and_jsonl(results_dir, tmp_path):
    import pandas as pd

    invoke("run", "piper-table4", "--quiet")
    assert (
        invoke("export", "--kind", "reproductions", "--out", str(tmp_path / "r.csv")).exit_code == 0
    )
    df = pd.read_csv(tmp_path / "r.csv")
    # Table IV's GiB cells deviate: the one convention rule refuses GiB (it breaks Switch-Base)
    assert len(df) == 14 and set(df["verdict"]) == {"match", "deviates"}
    assert (
        invoke(
            "export",
            "--kind",
            "reproductions",
            "--format",
            "jsonl",
            "--out",
            str(tmp_path / "r.jsonl"),
        ).exit_code
        == 0
    )
    assert len(pd.read_json(tmp_path / "r.jsonl", lines=True)) == 14
    res = repro("export", "nothing", "--out", str(tmp_path / "x.csv"))
    assert res.returncode == 2


def test_bench_show_params_teaches_the_grid(results_dir):
    res = invoke("bench", "gemm", "--show-params")
    assert res.exit_code == 0
    assert "--n 256,512,1024,2048" in res.output and "matrix size" in res.output
    assert "tflops [TFLOP/s, higher is better]" in res.output


def test_run_help_names_every_grade():
    """The grades are the record schema's; the help that teaches them must not drift from it."""
    # the help is wrapped to the terminal, which may break a grade at its hyphen
    text = " ".join(CliRunner().invoke(cli, ["run", "--help"]).output.split()).replace("- ", "-")
    missing = [v for v in VERDICTS if v not in text]
    assert not missing, f"repro run --help does not name: {missing}"
