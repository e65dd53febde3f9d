"""Every suite's parameters are declared once (suites/base.py Param and Rule) and checked in the
parent before any rank starts: a bad value for ANY declared parameter of ANY suite is one line
on stderr, exit 2, with no rank started and nothing measured or stored.

"No rank started" is enforced, not inferred: the launcher and the grid runner are replaced by
functions that fail the test if called, so a value that slips past validation into a rank (or
into a measurement in this process) fails here. Validation only: nothing is run.
"""

from __future__ import annotations

import contextlib
import io
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moe_repro.cli import main
from moe_repro.suites import all_suites

SUITES = all_suites()
DECLARED = [(name, key) for name, suite in SUITES.items() for key in suite.schema]
CASES = [
    (name, key, value) for name, key in DECLARED for value in SUITES[name].schema[key].bad_values()
]
RULE_CASES = [
    (name, i, rule.example) for name, suite in SUITES.items() for i, rule in enumerate(suite.rules)
]

# The inputs the issue found reaching the ranks (or accepted); each must now stop in the parent.
ISSUE_CASES = [
    ["llep-layer", "--ranks", "3"],
    ["llep-layer", "--top-k", "9"],
    ["ssmb-memory", "--ranks", "3"],
    ["ssmb-memory", "--top-k", "17"],
    ["dispatch-stages", "--top-k", "300", "--experts", "256"],
    ["vocab-loss", "--tokens", "0"],
    ["allreduce", "--bytes", "5"],
    ["rank-layout-traffic", "--order", "random"],
    ["pp-ep-train", "--model", "nosuch"],
    ["memcopy", "--mbytes", "100000000"],
    ["eplb-policy", "--skew", "nan"],
    ["gemm", "--n", "64,0"],
    ["alltoall", "--nodes", "100000"],
    ["allreduce", "--ranks", "1000"],
    ["allreduce", "--timeout", "nan"],
    ["allreduce", "--min-sample-s", "inf"],
    ["moe-layer", "--capacity-factor", "1e400"],
]


class RankStarted(AssertionError):
    pass


@pytest.fixture(autouse=True)
def no_rank_may_start(monkeypatch, tmp_path):
    """Fail if anything would launch a rank or measure: validation must have stopped it."""
    import moe_repro.runtime.launch as launch
    import moe_repro.suites.runner as runner

    def refuse(*args, **kwargs):
        raise RankStarted("a bad input reached the runner")

    monkeypatch.setattr(launch, "run_ranks", refuse)
    monkeypatch.setattr(runner, "measure", refuse)
    monkeypatch.setattr(runner, "run_point", refuse)
    monkeypatch.setenv("MOE_REPRO_RESULTS", str(tmp_path / "results"))


def bench(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(["bench", *args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, err.getvalue()


def assert_refused(args: list[str], tmp_path) -> None:
    code, err = bench(args)
    assert "RankStarted" not in err and "Traceback" not in err, (args, err)
    assert code == 2, (args, code, err)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("repro: error:"), (args, err)
    results = tmp_path / "results"
    assert not (results.exists() and any(results.rglob("*.json"))), "nothing stored"


def test_every_parameter_of_every_suite_is_declared():
    for name, suite in SUITES.items():
        assert set(suite.schema) == set(suite.params), name
        # the defaults and the quick grid satisfy the declaration (they are what users run)
        for key, declared in suite.schema.items():
            for value in [*suite.params[key], *suite.quick.get(key, [])]:
                declared.validate(key, value)
    assert len(CASES) > 10 * len(DECLARED) // 2


@pytest.mark.parametrize("name,key,value", CASES, ids=[f"{n}-{k}-{v[:12]!r}" for n, k, v in CASES])
def test_each_declared_bad_value_is_refused_in_the_parent(name, key, value, tmp_path):
    assert_refused([name, "--quick", f"--{key.replace('_', '-')}", value], tmp_path)


@pytest.mark.parametrize(
    "name,index,example", RULE_CASES, ids=[f"{n}-rule{i}" for n, i, _ in RULE_CASES]
)
def test_each_rule_across_parameters_is_refused_in_the_parent(name, index, example, tmp_path):
    args = [name, "--quick"]
    for key, value in example.items():
        args += [f"--{key.replace('_', '-')}", value]
    suite = SUITES[name]
    with pytest.raises(ValueError) as refused:
        suite.grid(suite.parse_overrides([f"{k}={v}" for k, v in example.items()]), quick=True)
    assert refused.value.args[0], name
    assert_refused(args, tmp_path)


@pytest.mark.parametrize("args", ISSUE_CASES, ids=[" ".join(a) for a in ISSUE_CASES])
def test_the_issues_bad_inputs_stop_before_any_rank(args, tmp_path):
    assert_refused(args, tmp_path)


def _bad_number(declared, draw_int: bool):
    """Numbers outside a declared range, NaN and infinities, as the command line writes them."""
    outside = []
    if declared.min is not None:
        outside.append(
            st.integers(max_value=math.floor(declared.min) - 1)
            if draw_int
            else st.floats(max_value=declared.min, exclude_max=True, allow_nan=False)
        )
    if declared.max is not None:
        outside.append(
            st.integers(min_value=math.floor(declared.max) + 1)
            if draw_int
            else st.floats(min_value=declared.max, exclude_min=True, allow_nan=False)
        )
    outside.append(st.sampled_from([float("nan"), float("inf"), float("-inf")]))
    return st.one_of(*outside).map(lambda v: repr(v) if isinstance(v, float) else str(v))


@st.composite
def bad_inputs(draw):
    name, key = draw(st.sampled_from(DECLARED))
    declared = SUITES[name].schema[key]
    if declared.kind in (int, float):
        value = draw(
            st.one_of(
                _bad_number(declared, declared.kind is int), st.sampled_from(declared.bad_values())
            )
        )
    elif declared.choices:
        junk = st.text(
            st.characters(blacklist_characters=",\x00", blacklist_categories=("Cs",)), max_size=40
        ).filter(lambda t: t.strip() not in declared.choices)
        value = draw(st.one_of(junk, st.sampled_from(declared.bad_values())))
    else:
        value = draw(st.sampled_from(declared.bad_values()))
    return name, key, value


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=bad_inputs())
def test_generated_bad_values_for_every_declared_parameter(case, tmp_path):
    name, key, value = case
    if value.startswith("--"):
        value = "=" + value  # still one value: --key==--x reads as '=--x'
    assert_refused([name, "--quick", f"--{key.replace('_', '-')}={value}"], tmp_path)
