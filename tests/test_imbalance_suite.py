"""The imbalance suite: every registered balancer's decision turned into a row plan that the
exact oracle accepts on every kind of workload, the oracle catching a plan that drops,
duplicates or misplaces rows, and the real mode's dispatch over real gloo ranks equal to the
dense reference."""

from __future__ import annotations

import pytest
import torch

from moe_repro.components.balance import balancer_names, get_balancer
from moe_repro.components.balance.base import BalanceStep
from moe_repro.components.balance.row_plan import count_wrong, rows_to_devices, weight_copies
from moe_repro.components.balance.workloads import get_workload
from moe_repro.components.moe.moe_layer import ExpertPlacement
from moe_repro.suites import get_suite
from moe_repro.suites.runner import RunConfig, measure


def _step(workload: str, ep: int, seed: int = 0):
    w = (
        get_workload(workload, 64, 8, 512)
        if workload in ("hot-set", "zero-expert-rank", "ragged-source")
        else get_workload(workload, tokens=512)
    )
    placement = ExpertPlacement.contiguous(w.num_experts, ep)
    a, b = (w.routing(seed, s, ep).source_counts(w.num_experts, ep) for s in (0, 1))
    return BalanceStep(placement, b, a)


@pytest.mark.parametrize(
    "workload", ["hot-set", "zero-expert-rank", "ragged-source", "olmoe-arxiv-L0"]
)
@pytest.mark.parametrize("ep", [2, 4, 16])
def test_every_balancer_plan_passes_the_oracle(workload, ep):
    step = _step(workload, ep)
    for name in balancer_names():
        work = get_balancer(name).run(step)
        rows = rows_to_devices(name, step, work)
        assert count_wrong(step, work, rows) == 0, name
        # independent recount: every (source, expert) row lands somewhere exactly once
        assert torch.equal(rows.sum(2), step.source_counts)


def test_the_oracle_catches_lost_duplicated_and_misplaced_rows():
    step = _step("hot-set", 4)
    work = get_balancer("LLEP").run(step)
    rows = rows_to_devices("LLEP", step, work)
    lost = rows.clone()
    s, e, d = (int(i) for i in (rows > 0).nonzero()[0])
    lost[s, e, d] -= 1
    assert count_wrong(step, work, lost) >= 2  # the pair and its device
    duplicated = rows.clone()
    duplicated[s, e, (d + 1) % 4] += rows[s, e, d]
    assert count_wrong(step, work, duplicated) > 0
    moved = rows.clone()
    moved[s, e, (d + 1) % 4] += moved[s, e, d]
    moved[s, e, d] = 0
    assert count_wrong(step, work, moved) > 0  # right total, wrong device


def test_weight_copies_counts_experts_away_from_home():
    step = _step("hot-set", 2)
    home = step.placement.rank_of_expert().tolist()
    plain = get_balancer("Before LB").run(step)
    assert weight_copies(rows_to_devices("Before LB", step, plain), home) == 0
    feplb = get_balancer("FEPLB").run(step)
    assert weight_copies(rows_to_devices("FEPLB", step, feplb), home) == len(feplb.decision.moves)


@pytest.mark.multiprocess
def test_real_mode_over_gloo_ranks_matches_the_dense_reference():
    suite = get_suite("imbalance")
    grid = suite.grid(
        {
            "mode": ["real"],
            "balancer": ["LLEP", "FasterMoE", "EPLB"],
            "workload": ["ragged-source", "olmoe-switch"],
            "ep": [2],
            "seed": [1],
            "steps": [2],
            "tokens": [256],
        }
    )
    records = measure(suite, grid, RunConfig(warmup=0, repeats=1, min_sample_s=0.0))
    assert len(records) == 6
    for r in records:
        assert r["wrong"] == 0 and r["correct"], r
        assert r["token_bytes"] > 0 and r["decide_us"] > 0


def test_simulated_mode_needs_no_ranks():
    suite = get_suite("imbalance")
    grid = suite.grid(
        {
            "mode": ["simulated"],
            "balancer": ["FEPLB"],
            "workload": ["burst"],
            "ep": [16],
            "seed": [0],
            "steps": [4],
            "tokens": [1024],
        }
    )
    (record,) = measure(suite, grid, RunConfig())
    assert record["simulated"] and record["wrong"] == 0 and record["nodes"] == 2
    assert 0 < record["inter_node_bytes"] <= record["token_bytes"]


def test_the_suite_page_lays_out_balancer_by_workload_with_the_seed_spread(tmp_path):
    from moe_repro.records.environment import collect_environment
    from moe_repro.records.record import SuiteRecord
    from moe_repro.reports import site

    records = []
    for balancer, base in (("Before LB", 3.0), ("FEPLB", 1.5)):
        for workload, scale in (("hot-set", 1.0), ("balanced", 0.5)):
            for seed in range(3):
                records.append(
                    {
                        "suite": "imbalance",
                        "mode": "stats",
                        "balancer": balancer,
                        "workload": workload,
                        "ep": 8,
                        "seed": seed,
                        "max_over_mean": base * scale + seed * 0.1,
                        "decide_us": 10.0,
                        "wrong": 1 if (balancer, workload, seed) == ("FEPLB", "balanced", 2) else 0,
                    }
                )
    run = SuiteRecord(
        suite="imbalance",
        description="x",
        params=["mode", "balancer", "workload", "ep", "seed"],
        metrics=[
            {"name": "time_s", "unit": "s", "better": "lower"},
            {"name": "max_over_mean", "unit": "x", "better": "lower"},
            {"name": "decide_us", "unit": "us", "better": "lower"},
        ],
        records=records,
        environment=collect_environment(["repro", "bench", "imbalance"]),
    )
    (matrix, _) = site.matrix_views(run)
    assert matrix["columns"] == ["hot-set", "balanced"]
    assert [r["name"] for r in matrix["rows"]] == ["Before LB", "FEPLB"]
    before_hot = matrix["rows"][0]["cells"][0]["text"]
    assert (
        before_hot.startswith("3.1") and "(3" in before_hot and "3.2" in before_hot
    )  # median (min-max)
    assert matrix["rows"][1]["cells"][1]["bad"] and not matrix["rows"][0]["cells"][1]["bad"]
    assert "3 seed(s)" in matrix["note"]
    page = site.write_suite_page(tmp_path, "imbalance", [run]).read_text()
    assert "<h2>Matrix</h2>" in page and "hot-set" in page
