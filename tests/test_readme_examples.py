"""Every command example in README.md and in `repro --help` (and every subcommand's --help) runs
as written.

Extraction: README's fenced code blocks (lines starting with `repro`, `mpiexec`, `python -m
pytest` or the install line, continuation backslashes joined, `  # comments` cut) and its inline
`python -m pytest ...` spans; the help texts' "Example(s):" lines and `repro ...` spans in
backticks. Every extracted command must have an entry in HOW below, so a new example cannot go
unchecked.

Placeholders, filled one way: the examples run in order in one scratch directory holding the
results store (MOE_REPRO_RESULTS), a copy of `.ci/` and a link to `benchmarks/`; a file an
example reads is one an earlier example wrote (t.json, my.json), except `my-fabric.json`, a copy
of tests/data/rail-4to1.json. In the help texts, SUITE is `alltoall`, FILE is `my.json`, M is
`tiny-moe`, N is `1`, MODEL is `tiny-moe`.

How each is checked (HOW):
  run      run as written; exit 0
  cheap    long (minutes, or real ranks started): the normal run executes it with the listed
           arguments appended -- `--show-params` (bench and run parse and validate every option
           and id, build the grid, print the parameters, run nothing), `--quick --no-alltoall`
           for calibrate, `--steps 1` for train, `--benchmark-disable` (each benchmark once, its
           output still checked) for the micro-benchmarks -- and a test marked slow runs it as
           written (opt-in: MOE_REPRO_LONG_EXAMPLES=1; over half an hour in all)
  launcher needs a launcher (mpiexec beside this Python): slow, skipped without one
  gpu      needs a CUDA GPU: slow, skipped without one (run as written on a GPU node)
  install  the install + main-job and install + test commands, and the test commands: run by
           CI (.ci/run) as written (the whole suite as its quick and heavy halves)
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import patient

ROOT = Path(__file__).resolve().parent.parent
HELP_PLACEHOLDERS = {
    "SUITE": "alltoall",
    "FILE": "my.json",
    "MODEL": "tiny-moe",
    "M": "tiny-moe",
    "N": "1",
}
SHOW = ["--show-params"]

# command as written -> (how, arguments appended for the cheap check)
HOW: dict[str, tuple[str, list[str]]] = {
    # README: install lines (CI runs them)
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 --index-url "
    "https://download.pytorch.org/whl/cpu && pip install -e . && "
    "repro run piper-table4 && repro run --all --how A,M,S --quiet --budget 20 && "
    "repro validate > /dev/null && "
    "echo gemm memcopy moe-dispatch alltoall attention expert-gemm eplb-policy feplb-balancer "
    "llep-layer ssmb-memory | xargs -n 1 repro bench --quick && "
    "repro bench imbalance --quick --ep 8 --steps 2 && repro site build --out site/_build": (
        "install",
        [],
    ),
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 --index-url "
    "https://download.pytorch.org/whl/cpu && pip install -e \".[test,peers]\" && "
    'python -m pytest -q -m "not heavy" --durations=15': ("install", []),
    # README: the heavy set and the whole suite (CI runs the quick command, then the heavy set)
    "python -m pytest -q -m heavy --durations=15": ("install", []),
    "python -m pytest -q --durations=15": ("install", []),
    # README: what you can do
    "repro list": ("run", []),
    "repro run piper-table4 --json t.json": ("run", []),
    "repro run piper-table4 --out reports-out": ("run", []),
    "repro run --paper piper": ("cheap", SHOW),
    "repro run xmoe-fig11 --show-params": ("run", []),
    "repro bench gemm --n 512,1024": ("cheap", SHOW),
    "repro bench allreduce --ranks 2,4": ("cheap", SHOW),
    "mpiexec -n 4 repro bench allreduce --backend mpi": ("launcher", []),
    "repro bench alltoall --nodes 2 --gpus-per-node 2 --algo flat,halo,rbd --check": (
        "cheap",
        SHOW,
    ),
    "repro bench alltoall --nodes 1 --gpus-per-node 4 --algo flat --path dispatch,collective --sizes 1M:16M "
    "--backend gloo,mpi": ("cheap", SHOW),
    "repro bench alltoall --nodes 512 --gpus-per-node 8 --platform frontier --algo flat,halo": (
        "run",
        [],
    ),
    "repro bench alltoall --nodes 16": ("run", []),
    "repro bench alltoall --nodes 16 --platform my-fabric.json --latency-model serial": ("run", []),
    "repro plan --model gpt3-175b --platform dgx-h100 --nodes 64": ("run", []),
    "repro plan --model deepseek-v3 --platform frontier --nodes 64 --method piper": ("run", []),
    "repro validate": ("run", []),
    "repro validate --predictor step-time": ("run", []),
    "repro calibrate --out my.json": ("cheap", ["--quick", "--no-alltoall"]),
    "repro plan --model tiny-moe --nodes 1 --platform my.json": ("run", []),
    "repro train --model tiny-moe --pp 2 --ep 2 --steps 4 --check-reference": (
        "cheap",
        ["--steps", "1"],
    ),
    "repro site build --out site/_build": ("run", []),
    "repro run piper-table4 --json t2.json && repro gate --baseline t.json --current t2.json": (
        "run",
        [],
    ),
    "repro export --kind suites --format csv --out results.csv": ("run", []),
    "repro bench moe-dispatch --impl pft,megatron,deepspeed": ("cheap", SHOW),
    "repro bench moe-dispatch --impl pft,megatron-nodrop,deepspeed-einsum --tokens 1024 --d-model 512": (
        "cheap",
        SHOW,
    ),
    "repro bench alltoall --nodes 1 --gpus-per-node 4 --algo flat --backend gloo --sizes 4M --check "
    "--path dispatch,combine,collective,megatron-dispatch,megatron-combine": ("cheap", SHOW),
    "repro run --all --how A,M,S --quiet --json .ci/baseline.json": ("cheap", SHOW),
    "python -m pytest benchmarks/ --benchmark-columns=median,iqr,rounds": (
        "cheap",
        ["--benchmark-disable"],
    ),
    # README: running on a GPU node (repro doctor runs its CPU half on a machine without a GPU)
    "repro doctor": ("run", []),
    "python -m pytest -q -m gpu": ("gpu", []),
    "repro bench gemm --device cuda": ("gpu", []),
    # --help texts
    "repro run piper-table4": ("run", []),
    "repro run piper-table4 --json t.json --out piper-report": ("run", []),
    "repro bench gemm --param n=512,1024": ("cheap", SHOW),
    "repro bench allreduce --quick": ("cheap", SHOW),
    "repro bench alltoall --show-params": ("run", []),
    "repro plan --model gpt3-175b --nodes 64 --platform dgx-h100 --json p.json": ("run", []),
    "repro plan --model mixtral-8x7b --nodes 2 --platform dgx-h100 --explain-memory": ("run", []),
    "repro train --model tiny-moe --pp 2 --ep 2 --steps 4 --check-reference --json t.json": (
        "cheap",
        ["--steps", "1"],
    ),
}

PREFIXES = ("repro ", "mpiexec ", "python -m pytest", "python3 -m venv")


def _clean(line: str) -> str:
    line = re.split(r"\s{2,}#", line)[0]  # a trailing comment
    return " ".join(line.split())


def readme_examples() -> list[str]:
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```\n(.*?)```", text, flags=re.S):
        block = block.replace("\\\n", " ")
        out += [_clean(line) for line in block.splitlines() if line.strip().startswith(PREFIXES)]
    out += [_clean(span) for span in re.findall(r"`(python -m pytest [^`]+)`", text)]
    return list(dict.fromkeys(out))


def _help(*args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", "from moe_repro.cli import main; main()", *args, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def help_examples() -> list[str]:
    top = _help()
    commands = re.findall(r"^  (\w+)\s{2,}", top.split("Commands:")[1].split("\n\n")[0], flags=re.M)
    texts = [top] + [_help(c) for c in commands] + [_help("site", "build")]
    out = []
    for text in texts:
        lines = text.splitlines()
        for i, line in enumerate(lines):
            stripped = line.strip()
            if stripped.startswith("repro ") and (
                i and "Example" in "".join(lines[max(0, i - 8) : i])
            ):
                out.append(re.split(r"\s{2,}", stripped)[0])  # the command, before its description
            elif stripped.startswith("Example: repro "):
                out.append(stripped[len("Example: ") :])
        joined = " ".join(text.split())
        out += [span for span in re.findall(r"`(repro [^`]+)`", joined)]
    filled = []
    for cmd in out:
        words = [HELP_PLACEHOLDERS.get(w, w) for w in cmd.split()]
        filled.append(" ".join(words))
    # bare `repro list` and the like repeat README's; ids already there are kept once
    return list(dict.fromkeys(filled))


@functools.cache
def _examples() -> tuple[str, ...]:
    # once per test session: each extraction starts a Python per subcommand for its --help
    return tuple(dict.fromkeys(readme_examples() + help_examples()))


def all_examples() -> list[str]:
    return list(_examples())


def test_every_example_has_a_way_to_be_checked():
    missing = [c for c in all_examples() if c not in HOW]
    assert not missing, f"examples with no entry in HOW: {missing}"
    assert len(all_examples()) >= 30


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / ".ci", d / ".ci")
    (d / "benchmarks").symlink_to(ROOT / "benchmarks")
    shutil.copy(ROOT / "tests" / "data" / "rail-4to1.json", d / "my-fabric.json")
    return d


def _run(
    command: str, extra: list[str], cwd: Path, timeout: float = patient(90)
) -> subprocess.CompletedProcess:
    """Run one example in ``cwd`` (``extra`` appended to each `repro`/pytest part of it); the
    timeout is a hang guard, scaled for a busy machine."""
    env = {
        **os.environ,
        "MOE_REPRO_RESULTS": str(cwd / "results"),
        "COLUMNS": "100",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    parts = [shlex.join(shlex.split(p) + extra) for p in command.split(" && ")]
    return subprocess.run(
        " && ".join(parts),
        shell=True,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_examples_run(scratch):
    """Every `run` and `cheap` example, in order (later ones read what earlier ones wrote)."""
    failures = []
    for command in all_examples():
        how, extra = HOW[command]
        if how not in ("run", "cheap"):
            continue
        r = _run(command.strip(), extra if how == "cheap" else [], scratch)
        if r.returncode != 0:
            failures.append(
                f"{command} {' '.join(extra)}: exit {r.returncode}: {r.stderr.strip()[-400:]}"
            )
    assert not failures, "\n".join(failures)
    # what the examples promise to write, they wrote, inside the scratch directory
    for name in (
        "t.json",
        "t2.json",
        "results.csv",
        "my.json",
        "site/_build/index.html",
        "reports-out",
        "piper-report",
    ):
        assert (scratch / name).exists(), name


# Run as written, the long examples take over half an hour on a 2-core machine (`repro run --paper
# piper` alone measures for 17 minutes): too long for every test run, so they are opt-in.
LONG = os.environ.get("MOE_REPRO_LONG_EXAMPLES") == "1"


@pytest.mark.slow
@pytest.mark.skipif(not LONG, reason="long examples as written: set MOE_REPRO_LONG_EXAMPLES=1")
@pytest.mark.parametrize("command", [c for c in HOW if HOW[c][0] in ("cheap", "launcher", "gpu")])
def test_long_examples_run_as_written(command, scratch):
    if HOW[command][0] == "launcher" and not (Path(sys.executable).parent / "mpiexec").exists():
        pytest.skip("needs mpiexec beside this Python (pip install mpich)")
    if HOW[command][0] == "gpu":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU")
        if command.startswith("python -m pytest"):  # the project's own tests: from its root
            scratch = ROOT
    if command.startswith("repro plan") or command.startswith("repro gate"):
        pytest.skip("reads files an earlier example writes: covered by test_examples_run")
    r = _run(command.strip(), [], scratch, timeout=patient(360))
    assert r.returncode == 0, r.stderr[-2000:]
