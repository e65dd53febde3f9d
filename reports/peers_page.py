"""The "moe-repro vs Megatron-core vs DeepSpeed" page, built from stored suite runs.

It reads the newest run of each MoE suite that holds peer records (a non-empty ``peer``
parameter, which the suites fill with the package and version that ran) and lays out, per grid
point, every implementation's median time per stage with its spread, the ratio to ours, and the
suite's correctness check (#wrong against a loop over tokens under each peer's semantics). What
the equivalence tests assert is stated beside it; they run in CI, not at report time.

A second section lays out the expert-parallel passes: the newest moe-layer run holding records at
ranks > 1 with ``backward`` = 1 (stage ``layer``: each implementation's own expert-parallel
layer, forward + backward, over real ranks), one row per ranks count, each implementation's
median time with its spread and its ratio to ours at the same ranks count.
"""

from __future__ import annotations

import sys
from pathlib import Path

from moe_repro.records.atomic import atomic_write_bytes, atomic_write_text, inside
from moe_repro.records.record import SuiteRecord
from moe_repro.reports import html
from moe_repro.reports.figures import render_figure

SUITES = ("moe-dispatch", "moe-layer")
OURS = "pft"
# What tests/test_peer_equivalence.py asserts (CI installs the peers and makes it mandatory).
EQUIVALENCE_TESTS = [
    "Megatron-core permute / unpermute vs our gather / weighted scatter: outputs, input gradients "
    "and router-logit gradients bitwise equal in fp32, without dropping and with "
    "apply_router_token_dropping (probs) at capacity factors 0.5, 1.0, 1.25; 28 routings per "
    "factor (uneven load, empty experts).",
    "DeepSpeed top1gating with random token selection: the same kept pairs and weights as our "
    "drop policy \"random\" drawn from the same seed.",
    "DeepSpeed top1gating without it: the same count kept per expert (its order among equal "
    "entries is arbitrary); identical where nothing overflows.",
    "DeepSpeed top2gating (second expert not sampled): our \"slot\" policy with renormalisation "
    "after drop; topkgating drop_policy probs and position: ours with renormalisation.",
]


def peer_runs(store) -> list[SuiteRecord]:
    """The newest run of each MoE suite that compared at least one peer."""
    found = []
    for name in SUITES:
        for run in reversed(store.runs("suite", name)):
            if any(r.get("peer") for r in run.records):
                found.append(run)
                break
    return found


def _ms(x: float) -> str:
    """Milliseconds for people: three significant figures, no scientific notation."""
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}" if x >= 0.001 else f"{x:.6f}"


def _point_key(record: dict, axes: list[str]) -> tuple:
    return tuple((k, record.get(k)) for k in axes)


def comparison(run: SuiteRecord) -> dict:
    """One suite run as tables: per grid point (all axes but impl and stage), per stage, per impl."""
    records = run.records
    impls = list(dict.fromkeys(r["impl"] for r in records))
    stages = list(dict.fromkeys(r["stage"] for r in records))
    axes = [k for k in run.params if k not in ("impl", "stage")]
    points = list(dict.fromkeys(_point_key(r, axes) for r in records))
    by = {(_point_key(r, axes), r["stage"], r["impl"]): r for r in records}
    tables = []
    for point in points:
        rows = []
        for impl in impls:
            cells, wrong, package = [], [], ""
            for stage in stages:
                r, ours = by.get((point, stage, impl)), by.get((point, stage, OURS))
                if r is None:
                    cells.append(None)
                    continue
                ratio = r["time_s"] / ours["time_s"] if ours and ours.get("time_s") else None
                cells.append(
                    {
                        "ms": r["time_s"] * 1e3,
                        "ms_text": _ms(r["time_s"] * 1e3),
                        "iqr_text": _ms(r.get("time_s_iqr", 0.0) * 1e3),
                        "range_text": f"{_ms(r.get('time_s_min', r['time_s']) * 1e3)}-"
                        f"{_ms(r.get('time_s_max', r['time_s']) * 1e3)}",
                        "ratio": ratio,
                    }
                )
                if r.get("wrong") is not None:
                    wrong.append(int(r["wrong"]))
                package = r.get("peer") or package
            rows.append(
                {
                    "impl": impl,
                    "cells": cells,
                    "package": package or "moe-repro",
                    "wrong": sum(wrong) if wrong else None,
                }
            )
        tables.append({"point": ", ".join(f"{k}={v}" for k, v in point), "rows": rows})
    versions = sorted({r["peer"] for r in records if r.get("peer")})
    return {
        "suite": run.suite,
        "impls": impls,
        "stages": stages,
        "tables": tables,
        "versions": versions,
        "environment": run.environment.model_dump(),
    }


def figure(comp: dict, table_index: int = 0) -> dict:
    """Median time per stage (a categorical axis): grouped bars, one per implementation (stages
    are not a sequence, so no line joins them)."""
    table = comp["tables"][table_index]
    series = []
    for row in table["rows"]:
        pairs = [(stage, cell["ms"]) for stage, cell in zip(comp["stages"], row["cells"]) if cell]
        series.append(
            {
                "label": row["impl"],
                "x": [p[0] for p in pairs],
                "y": [p[1] for p in pairs],
                "kind": "ours",
            }
        )
    return {
        "name": f"peers-{comp['suite']}",
        "title": f"{comp['suite']}: median time per stage",
        "xlabel": "stage",
        "ylabel": "time (ms, median, log scale)",
        "series": series,
        "xscale": "linear",
        "yscale": "log",
        "form": "bars",
    }


def _multi_rank(record: dict) -> bool:
    """A forward + backward pass of the whole layer over more than one rank."""
    return (
        record.get("stage") == "layer"
        and int(record.get("ranks", 1) or 1) > 1
        and str(record.get("backward", 0)) == "1"
        and record.get("time_s") is not None
    )


def multi_rank_run(store) -> SuiteRecord | None:
    """The newest moe-layer run with forward + backward records at ranks > 1 that ran a peer."""
    for run in reversed(store.runs("suite", "moe-layer")):
        picked = [r for r in run.records if _multi_rank(r)]
        if any(r.get("peer") for r in picked):
            return run
    return None


def multi_rank_comparison(run: SuiteRecord) -> dict:
    """Per ranks count (and any other axis the run varied), each implementation's median time of
    one forward + backward layer pass, its spread (IQR, min-max) and the ratio to ours."""
    records = [r for r in run.records if _multi_rank(r)]
    impls = list(dict.fromkeys(r["impl"] for r in records))
    others = [k for k in run.params if k not in ("impl", "stage", "ranks", "backward")]
    varied = [k for k in others if len({str(r.get(k)) for r in records}) > 1]
    keys = sorted(
        dict.fromkeys((int(r["ranks"]), *(str(r.get(k)) for k in varied)) for r in records)
    )
    by = {((int(r["ranks"]), *(str(r.get(k)) for k in varied)), r["impl"]): r for r in records}
    rows = []
    for key in keys:
        ours = by.get((key, OURS))
        cells = []
        for impl in impls:
            r = by.get((key, impl))
            if r is None:
                cells.append(None)
                continue
            t = r["time_s"]
            cells.append(
                {
                    "ms_text": _ms(t * 1e3),
                    "iqr_text": _ms(r.get("time_s_iqr", 0.0) * 1e3),
                    "range_text": f"{_ms(r.get('time_s_min', t) * 1e3)}-{_ms(r.get('time_s_max', t) * 1e3)}",
                    "ratio": t / ours["time_s"] if ours and ours.get("time_s") else None,
                    "wrong": r.get("wrong"),
                }
            )
        label = ", ".join(f"{k}={v}" for k, v in zip(varied, key[1:]))
        rows.append({"ranks": key[0], "label": label, "cells": cells})
    packages = {
        impl: next((r["peer"] for r in records if r["impl"] == impl and r.get("peer")), "moe-repro")
        for impl in impls
    }
    return {
        "impls": impls,
        "packages": packages,
        "rows": rows,
        "fixed": ", ".join(f"{k}={records[0].get(k)}" for k in others if k not in varied),
        "environment": run.environment.model_dump(),
    }


def write_peers_page(store, out: Path) -> Path:
    comps = []
    multi = None
    run = multi_rank_run(store)
    if run is not None:
        try:
            multi = multi_rank_comparison(run)
        except (
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            IndexError,
            ZeroDivisionError,
        ) as e:
            sys.stderr.write(
                f"repro: warning: peers page: moe-layer multi-rank run of {run.timestamp} "
                f"left out ({type(e).__name__}: {' '.join(str(e).split())[:200]})\n"
            )
    for run in peer_runs(store):
        try:
            comp = comparison(run)
            fig = figure(comp)
            drawn = render_figure(fig)
        except (
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            IndexError,
            ZeroDivisionError,
        ) as e:
            # a stored run that validates but cannot be laid out: named and left out
            sys.stderr.write(
                f"repro: warning: peers page: {run.suite} run of {run.timestamp} "
                f"left out ({type(e).__name__}: {' '.join(str(e).split())[:200]})\n"
            )
            continue
        names = {fmt: f"{fig['name']}.{fmt}" for fmt in drawn}
        for fmt, data in drawn.items():
            atomic_write_bytes(inside(out, names[fmt]), data)
        comp["figure"] = {"title": fig["title"], **names}
        comps.append(comp)
    return atomic_write_text(
        inside(out, "peers.html"),
        html.environment()
        .get_template("peers.html")
        .render(
            comparisons=comps,
            multi=multi,
            tests=EQUIVALENCE_TESTS,
            ours=OURS,
            home="index.html",
            css=html.css(),
        ),
    )
