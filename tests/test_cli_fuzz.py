"""Property-based fuzzing of the command line (hypothesis): whatever the options, no traceback,
an exit code the command documents, and one line on stderr when it exits nonzero.

The commands fuzzed are those whose valid paths finish in well under a second (plan, list,
gate, export, run of an analytic reproduction), so every generated case runs the real command
in this process; inputs mix valid values, near misses and junk.
"""

from __future__ import annotations

import contextlib
import io
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moe_repro.cli import main

JUNK = st.sampled_from(
    [
        "",
        "-1",
        "0",
        "nan",
        "inf",
        "1e309",
        "2.5",
        "🙂",
        "x" * 300,
        "--",
        "../..",
        "/nonexistent/x.json",
        "None",
        "[]",
        "{}",
        "999999999999999999999",
    ]
)
INTS = st.one_of(st.integers(-5, 10**12).map(str), JUNK)
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), JUNK)
MODELS = st.one_of(
    st.sampled_from(["deepseek-v3", "mixtral-8x7b", "tiny-moe", "deepseek-v4"]), JUNK
)
PLATFORMS = st.one_of(st.sampled_from(["frontier", "dgx-h100", "h200", "local", "fronteir"]), JUNK)


def invoke(args: list[str], tmp: str) -> tuple[int, str]:
    err = io.StringIO()
    code = 0
    os.environ["MOE_REPRO_RESULTS"] = os.path.join(tmp, "results")
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(args)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, err.getvalue()


def check(args: list[str], tmp: str, allowed: set[int]) -> None:
    code, err = invoke(args, tmp)
    assert "Traceback" not in err, (args, err)
    assert code in allowed, (args, code, err)
    if code != 0:
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("repro: "), (args, err)


SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(
    model=MODELS,
    platform=PLATFORMS,
    nodes=INTS,
    seq=INTS,
    batch=INTS,
    micro=INTS,
    zero=st.one_of(st.sampled_from(["0", "1", "2", "3"]), JUNK),
)
def test_plan(tmp_path, model, platform, nodes, seq, batch, micro, zero):
    check(
        [
            "plan",
            "--model",
            model,
            "--platform",
            platform,
            "--nodes",
            nodes,
            "--seq",
            seq,
            "--global-batch",
            batch,
            "--micro-batches",
            micro,
            "--zero",
            zero,
        ],
        str(tmp_path),
        {0, 2},
    )


@SETTINGS
@given(
    paper=st.one_of(st.sampled_from(["piper", "xmoe", "feplb", "mop", "pipr"]), JUNK),
    as_json=st.booleans(),
)
def test_list(tmp_path, paper, as_json):
    check(["list", "--paper", paper] + (["--json"] if as_json else []), str(tmp_path), {0, 2})


@SETTINGS
@given(
    baseline=st.one_of(JUNK, st.just(".ci/baseline.json")),
    current=JUNK,
    threshold=st.one_of(st.sampled_from(["5%", "0.05", "-1%", "200%"]), JUNK),
    alpha=FLOATS,
)
def test_gate(tmp_path, baseline, current, threshold, alpha):
    check(
        [
            "gate",
            "--baseline",
            baseline,
            "--current",
            current,
            "--threshold",
            threshold,
            "--alpha",
            alpha,
        ],
        str(tmp_path),
        {2},
    )


@SETTINGS
@given(
    rid=st.one_of(
        st.sampled_from(["piper-table4", "piper-tabel4", "xmoe-table2", "mop-table1"]), JUNK
    ),
    how=st.one_of(st.sampled_from(["A", "S", "A,S", "Q"]), JUNK),
)
def test_run(tmp_path, rid, how):
    check(["run", rid, "--quiet"], str(tmp_path), {0, 2})
    check(
        ["run", "--paper", rid, "--how", how, "--quiet"]
        if rid in ("piper", "mop")
        else ["run", "--how", how, rid, "--quiet"],
        str(tmp_path),
        {0, 2},
    )


@SETTINGS
@given(
    names=st.lists(JUNK, max_size=2),
    kind=st.one_of(st.sampled_from(["suites", "reproductions"]), JUNK),
    fmt=st.one_of(st.sampled_from(["csv", "jsonl"]), JUNK),
)
def test_export(tmp_path, names, kind, fmt):
    check(
        ["export", *names, "--kind", kind, "--format", fmt, "--out", str(tmp_path / "x.csv")],
        str(tmp_path),
        {0, 2},
    )
