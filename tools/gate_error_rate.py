"""Measure the regression gate's false-positive rate and power on this machine.

    python tools/gate_error_rate.py --rounds 12 --out gate-error-rate.json

Three cheap suites (gemm, memcopy, moe-dispatch at small single-point grids, one torch thread)
are measured in rounds; each round runs, per suite, two baseline runs and one run at each
injected slowdown (the suites' ``slowdown`` knob, suites/base.py: 5%, 10%, 25%), in a shuffled
order, each a fresh run of the point (setup, warm-up, calibration, repeats) through the suite
runner. The A/A pairs are every pair of distinct baseline runs of a suite; the power pairs every
(baseline, slowed) pair (records/error_rate.py). Each rule (threshold x Mann-Whitney level) is
scored on wall time and on CPU time, with the first 5 samples of each run (the default repeats
of ``repro bench``) and with all of them, and the chosen rule is the one with the most power at
10% among those with at most 1% false positives. The load average is recorded with every run
and summarized, since the rates hold for the load they were measured under.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

SUITES = {
    "gemm": {"n": [128], "dtype": ["float32"], "device": ["cpu"]},
    "memcopy": {"mbytes": [4], "device": ["cpu"], "threads": [1]},
    "moe-dispatch": {
        "impl": ["pft"],
        "stage": ["total"],
        "tokens": [512],
        "d_model": [256],
        "experts": [16],
        "top_k": [4],
        "device": ["cpu"],
        "threads": [1],
    },
}
SIZES = (0.05, 0.10, 0.25)
METRICS = ("time_s", "cpu_time_s")


def _load1() -> float:
    return os.getloadavg()[0]


def measure_pools(rounds: int, repeats: int, seed: int) -> dict:
    """Per suite: baseline runs and slowed runs (their samples per metric), and the load."""
    import torch

    from moe_repro.suites import get_suite
    from moe_repro.suites.runner import RunConfig, measure

    torch.set_num_threads(1)
    rng = random.Random(seed)
    config = RunConfig(repeats=repeats, check=False)
    pools: dict = {
        name: {"baseline": [], "slowed": {str(s): [] for s in SIZES}, "load": []} for name in SUITES
    }
    start = time.monotonic()
    for r in range(rounds):
        for name, grid in SUITES.items():
            suite = get_suite(name)
            (point,) = suite.grid(grid)
            order = [0.0, 0.0, *SIZES]
            rng.shuffle(order)
            for size in order:
                load = _load1()
                (rec,) = measure(suite, [dict(point, slowdown=size)], config)
                samples = {m: rec["samples"][m] for m in METRICS}
                pool = pools[name]
                (pool["baseline"] if size == 0 else pool["slowed"][str(size)]).append(samples)
                pool["load"].append((load + _load1()) / 2)
        elapsed = time.monotonic() - start
        print(f"round {r + 1}/{rounds} done, {elapsed:.0f} s, load {_load1():.1f}", file=sys.stderr)
    return pools


def analyse(pools: dict, repeats: int) -> dict:
    from moe_repro.records import gate
    from moe_repro.records.error_rate import choose, pair_stats, rates

    table = []
    realized: dict = {}
    for metric in METRICS:
        for samples in sorted({min(5, repeats), repeats}):
            aa_all: list = []
            ab_all: dict[str, list] = {str(s): [] for s in SIZES}
            for name, pool in pools.items():
                base = [run[metric] for run in pool["baseline"]]
                slowed = {s: [run[metric] for run in runs] for s, runs in pool["slowed"].items()}
                aa, ab = pair_stats(base, slowed, samples)
                aa_all += aa
                for s in ab:
                    ab_all[s] += ab[s]
                if samples == repeats:
                    med = statistics.median(statistics.median(x) for x in base)
                    realized.setdefault(name, {})[metric] = {
                        s: statistics.median(statistics.median(x) for x in runs) / med
                        for s, runs in slowed.items()
                    }
            table += rates(metric, samples, aa_all, ab_all)
    default = [
        r for r in table if r.threshold == gate.DEFAULT_THRESHOLD and r.alpha == gate.DEFAULT_ALPHA
    ]
    loads = [x for pool in pools.values() for x in pool["load"]]
    best = {
        f"{metric} n={n}": choose([r for r in table if r.metric == metric and r.samples == n])
        for metric in METRICS
        for n in sorted({min(5, repeats), repeats})
    }
    per_suite = []
    for name, pool in pools.items():
        for metric in METRICS:
            base = [run[metric] for run in pool["baseline"]]
            slowed = {s: [run[metric] for run in runs] for s, runs in pool["slowed"].items()}
            for samples in sorted({min(5, repeats), repeats}):
                suite_table = rates(metric, samples, *pair_stats(base, slowed, samples))
                chosen = choose(suite_table)
                at_default = next(
                    r
                    for r in suite_table
                    if r.threshold == gate.DEFAULT_THRESHOLD
                    and r.alpha == gate.DEFAULT_ALPHA
                    and r.statistic == "median"
                )
                per_suite.append(
                    {
                        "suite": name,
                        "default": at_default.to_dict(),
                        "chosen": chosen.to_dict() if chosen else None,
                    }
                )
    return {
        "per_suite": per_suite,
        "rules": [r.to_dict() for r in table],
        "gate_default": [r.to_dict() for r in default],
        "chosen": {k: (v.to_dict() if v else None) for k, v in best.items()},
        "realized_slowdown": realized,
        "load_1min": {
            "min": min(loads),
            "median": statistics.median(loads),
            "max": max(loads),
            "cpu_count": os.cpu_count(),
        },
        "runs": {
            name: {
                "baseline": len(p["baseline"]),
                "slowed": {s: len(r) for s, r in p["slowed"].items()},
            }
            for name, p in pools.items()
        },
    }


def report(result: dict) -> str:
    lines = [
        "load average (1 min) while measuring: min {min:.1f}, median {median:.1f}, "
        "max {max:.1f} on {cpu_count} cores".format(**result["load_1min"])
    ]
    head = (
        "metric       n   stat    threshold  alpha  FPR     power 5%  10%     25%     (A/A pairs)"
    )
    lines.append("gate default rule:")
    lines.append(head)
    for r in result["gate_default"]:
        lines.append(_line(r))
    lines.append("chosen (most power at 10% with FPR <= 1%):")
    lines.append(head)
    for r in result["chosen"].values():
        if r:
            lines.append(_line(r))
    lines.append("per suite, gate default rule | most power at 10% with FPR <= 1% (none: no rule):")
    for entry in result["per_suite"]:
        chosen = entry["chosen"]
        lines.append(
            f"  {entry['suite']:<13}{_line(entry['default'])}  |  "
            + (_line(chosen).split(None, 2)[2] if chosen else "none")
        )
    lines.append("realized slowdown (median of slowed runs / median of baseline runs):")
    for name, metrics in result["realized_slowdown"].items():
        for metric, sizes in metrics.items():
            shown = ", ".join(f"{float(s):.0%}: x{v:.3f}" for s, v in sizes.items())
            lines.append(f"  {name} {metric}: {shown}")
    return "\n".join(lines)


def _line(r: dict) -> str:
    p = r["power"]
    return (
        f"{r['metric']:<12} {r['samples']:<3} {r['statistic']:<7} {r['threshold']:<10.1%} "
        f"{r['alpha']:<6g} "
        f"{r['false_positive_rate']:<7.2%} {p.get('0.05', 0):<9.1%} {p.get('0.1', 0):<7.1%} "
        f"{p.get('0.25', 0):<7.1%} ({r['aa_pairs']})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the pools and the rates (JSON)")
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.repeats < 4:
        parser.error("--rounds must be >= 2 and --repeats >= 4")
    pools = measure_pools(args.rounds, args.repeats, args.seed)
    result = analyse(pools, args.repeats)
    print(report(result))
    if args.out:
        from moe_repro.records.atomic import atomic_write_json

        atomic_write_json(args.out, {"pools": pools, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
