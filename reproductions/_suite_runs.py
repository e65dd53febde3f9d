"""Run a benchmark suite's grid from inside a reproduction (real measurements on this machine)."""

from __future__ import annotations


def run_grid(suite_name: str, points: list[dict], repeats: int, timeout_s: float = 600.0,
             check: bool = True) -> list[dict]:
    """Records of ``points`` (full parameter dicts) measured by suite ``suite_name``."""
    from moe_repro.suites import all_suites
    from moe_repro.suites.runner import RunConfig, run_suite

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    suite = all_suites()[suite_name]
    config = RunConfig(warmup=1, repeats=repeats, min_sample_s=0.01, check=check, timeout_s=timeout_s)
    return run_suite(suite, points, config)


def device_words() -> str:
    """'cpu: <model>' or 'cuda: <GPU name>', the device these measurements ran on."""
    from moe_repro.environment import device_description

    d = device_description()
    return f"{d['device_type']}: {d['device']}"


def pick(records: list[dict], **match) -> dict:
    for r in records:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    raise KeyError(f"no record with {match}")
