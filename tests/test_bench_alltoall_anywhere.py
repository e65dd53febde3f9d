"""`repro bench alltoall` answers on any machine: real ranks where the world fits, the launcher's
world under mpiexec, and the simulator (said in the first line) where neither holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RAIL_4_TO_1 = Path(__file__).parent / "data" / "rail-4to1.json"


def repro(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-c", "from moe_repro.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_sixteen_nodes_are_simulated_on_the_default_platform(tmp_path, results_dir):
    out = tmp_path / "r.json"
    r = repro("bench", "alltoall", "--nodes", "16", "--algo", "flat,halo", "--json", str(out))
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("simulated on dgx-h100") and "not a measurement" in first
    # the grid it simulates comes first, not the local ranks that did not fit
    assert first.startswith("simulated on dgx-h100 (16 nodes x 8 GPUs = 128 ranks;")
    records = json.loads(out.read_text())["records"]
    for rec in records:
        # 16 nodes of the platform's 8 GPUs, marked simulated, with the platform and assumptions
        assert rec["simulated"] is True and rec["platform"] == "dgx-h100" and rec["ranks"] == 128
        assert rec["latency_model_used"] == "overlapped"
        assert any("rail-optimised" in a for a in rec["assumptions"])


def test_under_the_simulated_line_the_unmeasured_values_and_the_track_record(results_dir):
    """Right under "simulated on": every value of the profile's ``approximate`` list that the
    simulation reads, with its value from the profile file, then the simulator's record against
    the published all-to-all points and this run's bytes per peer (1 MiB over 128 ranks)."""
    from moe_repro.reproductions.validation import validate

    profile = json.loads(
        (
            Path(__file__).parents[1] / "components" / "network" / "platforms" / "dgx-h100.json"
        ).read_text()
    )
    r = repro("bench", "alltoall", "--nodes", "16", "--algo", "flat", "--sizes", "1M")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].startswith("  dgx-h100: values no measurement set")
    assert "network.per_message_us" in profile["approximate"]
    assert f"network.per_message_us = {profile['network']['per_message_us']:g}" in lines[1]
    assert f"network.window = {profile['network']['window']:g}" in lines[1]
    assert "gpu." not in lines[1]  # the GPU's rates do not enter a network simulation
    (summary,) = validate(("alltoall-bandwidth",))
    assert lines[2].startswith(
        f"  how far to trust it: the simulator's all-to-all bandwidth, scored against "
        f"{summary.predicted} published runs"
    )
    assert f"MAPE {summary.mape:.1%}" in lines[2]
    assert f"this run sends {2**20 / 128 / 1e3:.3g} KB per peer" in lines[2]
    assert lines[2].endswith("per peer, smaller than any scored run's")


def test_a_platform_file_is_accepted_and_a_rail_taper_favours_halo(tmp_path, results_dir):
    out = tmp_path / "r.json"
    r = repro(
        "bench",
        "alltoall",
        "--nodes",
        "16",
        "--platform",
        str(RAIL_4_TO_1),
        "--algo",
        "flat,halo",
        "--experts",
        "128",
        "--sizes",
        "16M",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"simulated on {RAIL_4_TO_1}")
    flat, halo = json.loads(out.read_text())["records"]
    assert flat["time_s"] > 2 * halo["time_s"]  # the spine taper slows flat's cross-rail bytes


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--platform", "frontir"], "did you mean frontier?"),
        (["--platform", "missing.json"], "not found"),
        (["--gpus-per-node", "9", "--platform", "dgx-h100"], "8 GPUs per node"),
        (["--latency-model", "fast"], "latency_model must be one of"),
    ],
)
def test_bad_platform_input_is_one_line_and_exit_2(args, needle, results_dir):
    r = repro("bench", "alltoall", "--nodes", "16", *args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_under_mpiexec_the_defaults_come_from_the_launched_world(tmp_path, results_dir):
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("no mpiexec beside this Python (pip install mpich)")
    out = tmp_path / "r.json"
    r = subprocess.run(
        [
            str(mpiexec),
            "-n",
            "4",
            sys.executable,
            "-c",
            "from moe_repro.cli import main; main()",
            "bench",
            "alltoall",
            "--backend",
            "mpi",
            "--algo",
            "flat",
            "--quick",
            "--repeats",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = json.loads(out.read_text())["records"]
    assert rec["nodes"] == 1 and rec["gpus_per_node"] == 4 and rec["simulated"] is False


SIMULATE_AND_REPORT_IMPORTS = """
import sys
from moe_repro.cli import main
try:
    main()
except SystemExit as e:
    print("exit", e.code, "torch imported:", "torch" in sys.modules, file=sys.stderr)
"""


def test_a_simulated_world_at_scale_never_imports_torch(tmp_path):
    # Importing torch costs more than simulating 8192 ranks: the simulated path must not need it.
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            SIMULATE_AND_REPORT_IMPORTS,
            "--results",
            str(tmp_path),
            "bench",
            "alltoall",
            "--nodes",
            "1024",
            "--gpus-per-node",
            "8",
            "--platform",
            "frontier",
            "--algo",
            "flat,halo",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.stdout.startswith("simulated on frontier")
    assert r.stderr.strip().splitlines()[-1] == "exit 0 torch imported: False", r.stderr[-2000:]


def test_dispatch_and_bare_collective_side_by_side(tmp_path, results_dir):
    # One run, two paths, both checked against the loop-over-tokens reference.
    out = tmp_path / "r.json"
    r = repro(
        "bench",
        "alltoall",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--algo",
        "flat",
        "--backend",
        "gloo",
        "--path",
        "dispatch,collective",
        "--quick",
        "--repeats",
        "2",
        "--check",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    records = json.loads(out.read_text())["records"]
    assert [rec["path"] for rec in records] == ["dispatch", "collective"]
    assert all(rec["wrong"] == 0 and rec["bytes"] == records[0]["bytes"] for rec in records)


def test_the_bare_collective_is_flats_only(results_dir):
    r = repro("bench", "alltoall", "--nodes", "1", "--algo", "halo", "--path", "collective")
    assert r.returncode == 2 and "use it with --algo flat" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_auto_backend_says_what_it_picked(tmp_path, results_dir, monkeypatch):
    from moe_repro.runtime.launch import mpi_unavailable

    out = tmp_path / "r.json"
    r = repro(
        "bench",
        "alltoall",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--algo",
        "flat",
        "--quick",
        "--repeats",
        "2",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    (rec,) = json.loads(out.read_text())["records"]
    picked = "gloo" if mpi_unavailable() else "mpi"
    assert r.stdout.startswith(f"backend {picked} (auto: ") and rec["backend"] == picked
    # without an mpiexec, auto falls back to gloo and says why
    monkeypatch.setenv("MOE_REPRO_MPIEXEC", str(tmp_path / "no-such-mpiexec"))
    r = repro(
        "bench",
        "alltoall",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--algo",
        "flat",
        "--quick",
        "--repeats",
        "2",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert (
        r.stdout.startswith("backend gloo (auto: no MPI here: mpiexec ")
        and "does not exist" in r.stdout
    )
    assert json.loads(out.read_text())["records"][0]["backend"] == "gloo"
