"""``repro doctor``: runs the checks this machine allows, says which it skipped, fails loudly."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from moe_repro.cli import doctor_cmd
from moe_repro.cli.doctor_cmd import Check

HAS_GPU = torch.cuda.is_available()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_doctor_runs_the_cpu_half_and_lists_what_it_skipped(results_dir):
    r = subprocess.run(
        [sys.executable, "-c", "from moe_repro.cli import main; main()", "doctor"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    lines = r.stdout.splitlines()
    assert lines[0].startswith("repro doctor: python ") and f"torch {torch.__version__}" in lines[0]
    status = {
        line.split(":")[0].split(None, 1)[1]: line.split()[0]
        for line in lines[1:]
        if line.startswith("  ")
    }
    for cpu_check in (
        "gloo (CPU) all-reduce and all-to-all, 2 ranks",
        "one trainer step (EP=2 over gloo) vs the single-process reference",
        "FEPLB expert copy path over gloo, 2 ranks",
    ):
        assert status[cpu_check] == "passed", r.stdout
    assert "#wrong 0" in r.stdout
    if not HAS_GPU:
        assert status["driver and GPUs"] == "skipped"
        # the Triton check joins the list where the triton extra is not installed
        not_checked = [line for line in lines if line.startswith("not checked on this machine: ")]
        assert len(not_checked) == 1, r.stdout
        items = not_checked[0].split(": ", 1)[1].split("; ")
        assert "driver and GPUs" in items, items
        assert any(item.startswith("NCCL all-reduce") for item in items), items
        assert "gloo worker thread" in r.stdout  # the copy path says where it ran


def test_a_failed_check_exits_1_in_one_line(monkeypatch, capsys):
    from moe_repro.cli import main

    monkeypatch.setattr(
        doctor_cmd,
        "run_checks",
        lambda: (
            {"torch": "x"},
            [Check("gloo all-to-all", "failed", "#wrong 12"), Check("NCCL", "skipped", "no GPU")],
        ),
    )
    with pytest.raises(SystemExit) as e:
        main(["doctor"])
    out = capsys.readouterr()
    assert e.value.code == 1
    assert "  failed   gloo all-to-all: #wrong 12" in out.out
    assert out.err.strip().splitlines() == ["repro: error: 1 check(s) failed: gloo all-to-all"]
