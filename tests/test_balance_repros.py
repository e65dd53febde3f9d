"""FasterMoE shadow pieces against brute force, and the load-balancing reproductions' shape:
feplb-table3's rows name the PP/EP pair and its columns the method (the issue's contract)."""

import json


import torch
from click.testing import CliRunner

from moe_repro.cli import cli
from moe_repro.components.balance.fastermoe_shadow import (
    choose_shadows,
    dispatch_rows,
    shadow_loads,
)
from moe_repro.components.balance.load_balance_eval import evaluate_trace
from moe_repro.components.balance.routing_trace import synthetic_trace
from moe_repro.reproductions import all_reproductions
from derived_how import assert_how_is_the_catalogs

SMALL = ["--param", "tokens=128", "--param", "micro_batches=3", "--param", "layers=1"]


def _brute_dispatch(top, source, ranks, pipe, shadows, per):
    sent = set()
    for t in range(top.shape[0]):
        for e in top[t].tolist():
            if e in shadows or ranks[e] == source[t]:
                continue
            local = [x for x in range(len(ranks)) if ranks[x] == ranks[e]].index(e)
            sent.add((t, ranks[e], local * pipe // per))
    return len(sent)


def test_dispatch_rows_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    top = torch.stack([torch.randperm(8, generator=g)[:3] for _ in range(40)])
    source = torch.arange(40) // 10
    ranks = [0, 0, 1, 1, 2, 2, 3, 3]
    for pipe in (1, 2):
        for shadows in ((), (5,)):
            assert dispatch_rows(top, source, ranks, 4, pipe, shadows) == _brute_dispatch(
                top, source, ranks, pipe, set(shadows), 2
            )
    # splitting into stages can only add rows
    assert dispatch_rows(top, source, ranks, 4, 2) >= dispatch_rows(top, source, ranks, 4, 1)


def test_shadows_split_rows_by_source():
    src = torch.tensor([[10, 0, 1, 1], [30, 0, 1, 1]])  # 2 sources, expert 0 hot, on rank 0
    loads = shadow_loads(src.sum(0), [0, 0, 1, 1], 2, [0], src)
    assert loads.tolist() == [10.0, 34.0]  # rank 1 computes its own 30 rows of 0
    # 40/4 -> shadow 0: 10/34 -> shadow 2: 11/33 -> shadow 3: 12/32; expert 1 has no tokens
    assert choose_shadows(src.sum(0), [0, 0, 1, 1], 2, 4, src) == [0, 2, 3]
    assert choose_shadows(src.sum(0), [0, 0, 1, 1], 2, 1, src) == [0]  # max_shadows
    # a hot expert whose tokens all start on its home rank gains nothing from a shadow
    src = torch.tensor([[30, 0, 0, 0], [0, 0, 10, 10]])
    assert choose_shadows(src.sum(0), [0, 0, 1, 1], 2, 4, src) == []


def test_balancers_reduce_the_token_straggler_on_skewed_routing():
    trace = synthetic_trace(1, 4, 32, 4, 256, 4, skew=1.5, seed=1)
    stats = evaluate_trace(trace, dyn=4)
    assert stats["FEPLB"].token_straggler < stats["Before LB"].token_straggler
    assert stats["LLEP"].token_straggler <= stats["FEPLB"].token_straggler  # token-level splits


def test_feplb_table3_rows_and_columns(tmp_path, results_dir):
    out = tmp_path / "t.json"
    r = CliRunner().invoke(cli, ["run", "feplb-table3", "--json", str(out), "--quiet", *SMALL])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    rows = {c["row"] for c in data["cells"]}
    cols = {c["column"] for c in data["cells"]}
    assert rows == {"4/2", "4/4", "2/8", "4/2 real counts", "4/4 real counts", "2/8 real counts"}
    assert {"Before LB", "FasterMoE", "FEPLB"} <= cols
    cell = next(c for c in data["cells"] if c["row"] == "2/8" and c["column"] == "FEPLB")
    assert cell["paper"] == 2021 and cell["ours"] is not None and "synthetic" in cell["note"]
    real = next(
        c for c in data["cells"] if c["row"] == "2/8 real counts" and c["column"] == "FEPLB"
    )
    assert (
        real["paper"] == 2021
        and real["ours"] is not None
        and "real-count workload olmoe-" in real["note"]
    )


def test_the_real_count_workload_is_named_in_the_spec_not_chosen_by_results():
    """Issue 50: the real-count rows' workload is the one the spec names, whatever the results;
    a workload passed as a parameter is used as given."""
    from moe_repro.reproductions import _feplb_traces as ft
    from moe_repro.reproductions.feplb_table3 import real_count_workload

    assert ft.REAL_WORKLOAD in ft.REAL_CANDIDATES
    for tokens in (512, 4096):
        params = {**ft.DEFAULTS, "tokens": tokens}
        assert real_count_workload(params)["workload"] == ft.REAL_WORKLOAD
    given = {**ft.DEFAULTS, "workload": "olmoe-github-L0"}
    assert real_count_workload(given)["workload"] == "olmoe-github-L0"


def test_other_feplb_reproductions_run_small():
    repros = all_reproductions()
    params = {"tokens": 128, "micro_batches": 3, "layers": 1}
    t4 = repros["feplb-table4"].run(params)
    assert_how_is_the_catalogs("feplb-table4", t4)
    assert {c.column for c in t4.cells} >= {"Before LB", "FasterMoE", "FEPLB"}
    f6 = repros["feplb-fig6"].run(params)
    assert_how_is_the_catalogs("feplb-fig6", f6)
    assert {c.column for c in f6.cells} >= {"dyn=2", "dyn=4", "dyn=8"} and f6.figures
    f4_result = repros["feplb-fig4"].run(params)
    assert_how_is_the_catalogs("feplb-fig4", f4_result)
    f4 = {(c.row, c.column): c for c in f4_result.cells}
    assert f4[("Dispatch", "FEPLB (EP time)")].ours == 0.0
    for kind in ("time", "volume"):  # the stages can only add rows, and time
        assert (
            f4[("Dispatch", f"FasterMoE pipe=2 (EP {kind})")].ours
            >= f4[("Dispatch", f"FasterMoE pipe=1 (EP {kind})")].ours
        )
    t2 = repros["feplb-table2"].run(params)
    assert_how_is_the_catalogs("feplb-table2", t2)
    assert any(c.verdict == "not-reproduced" for c in t2.cells)


def test_piper_fig9_and_alg2_tiny_run():
    repros = all_reproductions()
    fig9 = repros["piper-fig9"].run({"steps": 3, "batch": 4})
    assert_how_is_the_catalogs("piper-fig9", fig9)
    assert fig9.figures and all(c.ours is not None for c in fig9.cells)
    alg2_result = repros["piper-alg2"].run({"steps": 3, "batch": 4, "check_every": 1})
    assert_how_is_the_catalogs("piper-alg2", alg2_result)  # the cached trace still says measured
    alg2 = {(c.row, c.column): c.ours for c in alg2_result.cells}
    # No hindsight: a migration planned on one window can be worse for the next steps when the
    # routing moves (it does in 3 steps), so only the shape is checked here; Alg. 2's own
    # guarantee is tested in test_expert_migration.py.
    assert {r for r, _ in alg2} >= {"real run, layer 0", "synthetic, layer 0"}
    assert all(v is not None and v >= 0 for v in alg2.values())


def test_a_cached_counts_only_workload_trace_still_gives_tokens_when_asked():
    # the per-process cache once keyed real-count traces without keep_tokens, so a counts-only
    # trace cached first came back without the tokens a later caller asked for
    from moe_repro.reproductions import _feplb_traces as FT

    params = {"workload": "olmoe-c4-L7", "seed": 7, "layers": 1, "micro_batches": 1, "tokens": 64}
    FT._TRACES.clear()
    counts_only = FT.trace_for(params, 2)
    assert counts_only.top_experts is None
    kept = FT.trace_for(params, 2, keep_tokens=True)
    assert kept.top_experts is not None and len(kept.top_experts[0][0]) == 64 * 2
    assert bool((kept.counts == counts_only.counts).all())
    assert FT.trace_for(params, 2) is kept  # and the kept trace answers counts-only requests
    FT._TRACES.clear()
