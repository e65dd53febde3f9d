"""Run a benchmark suite's grid from inside a reproduction (real measurements on this machine)."""

from __future__ import annotations


def run_grid(suite_name: str, points: list[dict], repeats: int, timeout_s: float = 600.0,
             check: bool = True) -> list[dict]:
    """Records of ``points`` (full parameter dicts) measured by suite ``suite_name``: the one way
    a reproduction measures. Multi-process suites are launched by the runner, one world per
    distinct world parameters. Params a suite derives from a point (e.g. ranks = nodes x
    gpus_per_node) are added here, as the suite's own grid does."""
    from moe_repro.suites import all_suites
    from moe_repro.suites.runner import RunConfig, run_suite

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    suite = all_suites()[suite_name]
    if suite.derived_params is not None:
        points = [{**p, **suite.derived_params(p)} for p in points]
    config = RunConfig(warmup=1, repeats=repeats, min_sample_s=0.01, check=check, timeout_s=timeout_s)
    return run_suite(suite, points, config)


def device_words() -> str:
    """'cpu: <model>' or 'cuda: <GPU name>', the device these measurements ran on."""
    from moe_repro.records.environment import device_description

    d = device_description()
    return f"{d['device_type']}: {d['device']}"


def pick(records: list[dict], **match) -> dict:
    for r in records:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    raise KeyError(f"no record with {match}")


def without_samples(records: list[dict]) -> list[dict]:
    """Records as stored in a reproduction's extra: medians and spreads, not the raw samples."""
    return [{k: v for k, v in r.items() if k != "samples"} for r in records]


def csv_param(text, kind=str) -> list:
    """'a,b,c' (a reproduction parameter) -> [kind(a), kind(b), kind(c)]."""
    return [kind(t.strip()) for t in str(text).split(",") if t.strip()]
