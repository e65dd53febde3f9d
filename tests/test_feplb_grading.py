"""The FEPLB reproductions' grading logic (issue 16): the trace statistics, the sampling
intervals and claim tests on them, fig4's per-pair volume and modelled time, and the grading
invariants of the tables (a cause only where one was found). Expected values are worked out by
hand in the comments."""

import pytest
import torch

from moe_repro.components.balance.fastermoe_shadow import dispatch_rows
from moe_repro.records.record import CAUSES
from moe_repro.reproductions import _feplb_traces as ft
from moe_repro.reproductions import all_reproductions
from moe_repro.reproductions import feplb_fig4, feplb_table3, feplb_table4
from moe_repro.reproductions.spec import PaperValue, Reproduction, Result, status_of
from derived_how import assert_how_is_the_catalogs

SMALL = {"tokens": 128, "micro_batches": 3, "layers": 3}


# --- trace statistics -----------------------------------------------------------------------------

def test_imbalance_by_hand():
    # experts 0, 1 on rank 0 and 2, 3 on rank 1: device loads 10 + 0 = 10 and 2 + 4 = 6, mean 8
    s = ft.imbalance([10, 0, 2, 4], [0, 0, 1, 1], 2)
    assert s.straggler == 2.0                   # 10 - 8
    assert s.device_max_mean == 1.25            # 10 / 8
    assert s.expert_max_mean == 2.5             # 10 / mean(10, 0, 2, 4) = 10 / 4
    assert s.idle_share == 0.2                  # (10 - 8) / 10


def test_prediction_error_and_change_by_hand():
    assert ft.prediction_error([4, 4], [6, 2]) == 0.5      # (|6-4| + |2-4|) / (6 + 2)
    assert ft.prediction_error([3, 5], [3, 5]) == 0.0
    assert ft.change_pct(60, 80) == -25.0
    assert ft.derived_printed("6,666", "2,278", 2) == "2.93"   # FEPLB Table 3, Before LB
    assert ft.derived_printed("316.0", "2,278", 3) == "0.139"  # Table 4 / Table 3: us per row


def test_trace_stats_agree_with_the_replay():
    # Before LB's straggler from the statistics must be the replay's (same samples, same means)
    params = {**ft.DEFAULTS, **SMALL}
    for ep in (2, 4):
        stats = ft.trace_stats(params, ep)
        replay = ft.evaluate(params, ep, methods=("Before LB",))["Before LB"]
        assert stats.straggler == pytest.approx(replay.token_straggler)
        assert stats.rows_per_device == 128 * 8                 # tokens x top-8
        assert len(stats.layer_stragglers) == 3
        assert stats.device_max_mean == pytest.approx(
            ft._mean(ft.imbalance(ft.trace_for(params, ep).expert_counts(l, m),
                                  torch.arange(128) // (128 // ep), ep).device_max_mean
                     for l in range(3) for m in (1, 2)))


# --- intervals and claims ----------------------------------------------------------------------

def test_independent_growth_matches_a_simulation():
    # EP sources of a fixed token count each: an expert's count scales with EP (its deviation
    # too, for a fixed popularity spread); a device sums E / EP independent experts. The
    # straggler (max - mean of EP devices) at EP = 4 and 8 over EP = 2's: ft.independent_growth
    g = torch.Generator().manual_seed(0)
    pop = torch.randn(20000, 128, generator=g, dtype=torch.float64)

    def straggler(ep):
        devices = (ep * pop).reshape(-1, ep, 128 // ep).sum(-1)
        return float((devices.max(-1).values - devices.mean(-1)).mean())

    for ep in (4, 8):
        assert straggler(ep) / straggler(2) == pytest.approx(ft.independent_growth(ep), rel=0.03)


def test_bootstrap_interval_is_deterministic_and_bounded():
    assert ft.bootstrap_interval(ft.mean_of, [7.0, 7.0, 7.0]) == (7.0, 7.0)
    lo, hi = ft.bootstrap_interval(ft.mean_of, [1.0, 2.0, 3.0])
    assert 1.0 <= lo <= 2.0 <= hi <= 3.0
    assert ft.bootstrap_interval(ft.mean_of, [1.0, 2.0, 3.0]) == (lo, hi)      # seeded


def test_direction_and_trend():
    assert ft.direction((1, 2)) is True and ft.direction((-2, -1)) is False
    assert ft.direction((-1, 1)) is None
    rising = [[1.0, 1.0, 1.0], [5.0, 5.0, 5.0], [9.0, 9.0, 9.0]]
    assert ft.trend(rising, ft.mean_of, increasing=True)[0] is True
    assert ft.trend(rising, ft.mean_of, increasing=False)[0] is False
    # resampling [0, 10] gives means 0, 5, 10 against 5: differences +5, 0, -5 -> undecided
    assert ft.trend([[0.0, 10.0], [5.0, 5.0]], ft.mean_of, increasing=True)[0] is None
    # one step decided against the claim fails it even if another is undecided
    assert ft.trend([[0.0, 10.0], [5.0, 5.0], [1.0, 1.0]], ft.mean_of, increasing=True)[0] is False


def test_interval_tolerance_takes_the_paper_side():
    assert ft.interval_tolerance(10, (8, 15), 14).abs == 5       # paper above ours: up to 15
    assert ft.interval_tolerance(10, (8, 15), 9).abs == 2        # below: down to 8
    assert ft.interval_tolerance(10, (8, 15), None).abs == 5


def _repro(printed="100"):
    return Reproduction(id="feplb-table3", paper_values=[PaperValue("r", "c", printed, "x", "t")],
                        compute=lambda r, p: Result(cells=[]))


def test_estimate_cell_close_only_inside_the_interval():
    repro = _repro()
    assert ft.estimate_cell(repro, "r", "c", 90.0, (80.0, 105.0), "x", "n").verdict == "close"
    cell = ft.estimate_cell(repro, "r", "c", 90.0, (80.0, 95.0), "x", "n")
    assert cell.verdict == "deviates" and "95% interval" in cell.note
    assert ft.estimate_cell(repro, "r", "c", 100.2, (99.0, 101.0), "x", "n").verdict == "match"


# --- fig4: per-pair volume and time -------------------------------------------------------------

def test_pair_rows_by_hand():
    # 2 ranks, experts 0, 1 on rank 0 and 2, 3 on rank 1. Token 0 (source 0) picks 2 and 3,
    # token 1 (source 1) picks 0 and 2 (2 is local to it).
    top = torch.tensor([[2, 3], [0, 2]])
    source = torch.tensor([0, 1])
    ranks = [0, 0, 1, 1]
    one = feplb_fig4.pair_rows(top, source, ranks, 2)
    assert one.tolist() == [[[0, 1], [1, 0]]]           # token 0 once to rank 1, token 1 to rank 0
    two = feplb_fig4.pair_rows(top, source, ranks, 2, pipe=2)
    # experts 2 and 3 are in different stages (local index 0 and 1 of 2): token 0 crosses twice
    assert two.tolist() == [[[0, 1], [1, 0]], [[0, 1], [0, 0]]]
    assert feplb_fig4.pair_rows(top, source, ranks, 2, shadows=(2, 3)).tolist() == [[[0, 0], [1, 0]]]
    # busiest port per stage: stage 0 sends/receives 1 everywhere, stage 1 rank 0 sends 1
    assert feplb_fig4.busiest_port_rows(one) == 1 and feplb_fig4.busiest_port_rows(two) == 2


def test_pair_rows_sums_to_dispatch_rows():
    g = torch.Generator().manual_seed(3)
    top = torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(64)])
    source = torch.arange(64) // 16
    ranks = [e // 4 for e in range(16)]
    for pipe in (1, 2):
        for shadows in ((), (1, 9)):
            rows = feplb_fig4.pair_rows(top, source, ranks, 4, pipe, shadows)
            assert int(rows.sum()) == dispatch_rows(top, source, ranks, 4, pipe, shadows)
            assert all(int(rows[s].diagonal().sum()) == 0 for s in range(pipe))


def test_messages_of_chains_the_stages():
    rows = torch.tensor([[[0, 2], [1, 0]], [[0, 3], [0, 0]]])
    msgs, deps = feplb_fig4.messages_of(rows, 10)
    assert deps == {"a2a0": [], "a2a1": ["a2a0"]}
    assert sorted(msgs) == [("a2a0", 0, 1, 20), ("a2a0", 1, 0, 10), ("a2a1", 0, 1, 30)]


# --- table 4: the Before LB split --------------------------------------------------------------

def test_table4_split_names_the_larger_factor():
    paper_tokens, paper_per_row = 2278.0, 316.0 / 2278.0          # Table 3 / Table 4, row 4/2
    # twice the paper's straggler at the paper's per-row time: the input's factor
    cause, note = feplb_table4._split_base("4/2", 0.632, 2 * paper_tokens, paper_per_row)
    assert cause == "different-input" and "= 2.00" in note
    # the paper's straggler at 0.75x the per-row time: the GEMM model's factor
    cause, note = feplb_table4._split_base("4/2", 0.237, paper_tokens, 0.75 * paper_per_row)
    assert cause == "modelling-assumption" and "= 0.75" in note
    printed = {pv.row: pv.printed for pv in feplb_table4.PAPER_VALUES
               if pv.column == feplb_table4.PER_ROW}
    assert printed == {"4/2": "0.139", "4/4": "0.140", "2/8": "0.167"}


# --- grading invariants on small runs ----------------------------------------------------------

@pytest.fixture(scope="module")
def small_runs():
    repros = all_reproductions()
    return {rid: repros[rid].run(SMALL) for rid in
            ("feplb-table2", "feplb-table3", "feplb-table4", "feplb-fig4")}


def test_feplb_table3_derives_its_label(small_runs):
    assert_how_is_the_catalogs("feplb-table3", small_runs["feplb-table3"])


@pytest.mark.parametrize("rid,unit", [("feplb-table3", "tokens"), ("feplb-table4", "ms")])
def test_straggler_tables_are_laid_out_as_printed(small_runs, rid, unit):
    from moe_repro.reports.html import paper_grid

    result = small_runs[rid]
    grid = paper_grid({"cells": [c.to_dict() for c in result.cells], "extra": result.extra})
    assert [g["label"] for g in grid["groups"]] == ["Before LB", "FasterMoE", "FEPLB"]
    assert grid["columns"] == [unit, unit, "vs Before LB (%)", unit, "vs Before LB (%)"]
    # row 2/8 as FEPLB prints it: Table 3 "6,666 4,036 (-39%) 2,021 (-70%)",
    # Table 4 "1.110 0.625 (-44%) 0.352 (-68%)"
    printed = [c["paper_printed"] for c in grid["rows"][2]["cells"]]
    assert printed == {"feplb-table3": ["6,666", "4,036", "-39", "2,021", "-70"],
                       "feplb-table4": ["1.110", "0.625", "-44", "0.352", "-68"]}[rid]
    assert all(c is not None for row in grid["rows"] for c in row["cells"])


def test_table2_is_not_compared(small_runs):
    cells = small_runs["feplb-table2"].cells
    assert status_of(cells) == "not-compared"
    assert all(c.note for c in cells if c.verdict in ("not-reproduced", "not-comparable"))


def test_explained_cells_name_a_found_cause(small_runs):
    for rid in ("feplb-table3", "feplb-table4"):
        cells = {(c.row, c.column): c for c in small_runs[rid].cells}
        for (row, column), c in cells.items():
            if c.verdict != "explained":
                continue
            assert c.cause in CAUSES and c.note
            if column in ("FasterMoE", "FEPLB"):
                # a method's absolute value is explained only where its reduction is reproduced
                # or the reduction's own gap was traced to the input
                reduction = cells[(row, f"{column} vs Before LB")]
                assert reduction.verdict in ("match", "close") or (
                    reduction.verdict == "explained" and reduction.cause == "different-input")
                if rid == "feplb-table3" and c.cause == "different-input":
                    # the input's scale is a cause only where the input's own statistic is off
                    assert cells[(row, "Before LB")].verdict in ("deviates", "explained")
            if column.endswith("per straggler row"):
                assert c.cause == "modelling-assumption"


def test_undecided_claims_say_so(small_runs):
    for rid in ("feplb-table3", "feplb-table4"):
        for c in small_runs[rid].cells:
            if c.paper_printed and c.verdict == "not-reproduced":
                assert "not decided" in c.note
            if c.verdict in ("claim-holds", "claim-fails"):
                assert "95% interval" in c.note


def test_table3_shows_the_trace_beside_the_paper(small_runs):
    cells = {(c.row, c.column): c for c in small_runs["feplb-table3"].cells}
    growth = cells[("2/8", feplb_table3.GROWTH)]
    assert growth.paper == 2.93 and growth.ours is not None
    assert cells[("2/8", feplb_table3.IDLE)].verdict == "not-comparable"
    for row in ("4/2", "4/4", "2/8"):
        assert cells[(row, "trace: rows per device (mean)")].ours == 128 * 8
    assert {c.row for c in small_runs["feplb-table3"].cells} == {"4/2", "4/4", "2/8"}


def test_table3_shows_feplb_with_the_other_selection_rule(small_runs):
    # FEPLB Sec. 2's rule in the FEPLB columns; the next-busiest variant as a diagnostic
    cells = {(c.row, c.column): c for c in small_runs["feplb-table3"].cells}
    for row in ("4/2", "4/4", "2/8"):
        diag = cells[(row, feplb_table3.RULE)]
        assert diag.paper is None and diag.ours is not None and diag.unit == "%"
        assert "selects the busiest dynamic expert" in diag.note and "paired" in diag.note


def test_fig4_compares_time_not_volume(small_runs):
    cells = {(c.row, c.column): c for c in small_runs["feplb-fig4"].cells}
    for phase, paper in (("Dispatch", 46.8), ("Combine", 40.2)):
        time = cells[(phase, "FasterMoE pipe=2 (EP time)")]
        assert time.paper == paper and time.unit == "%" and "flow simulator" in time.note
        assert cells[(phase, "FasterMoE pipe=2 (EP volume)")].paper is None
        assert cells[(phase, "FEPLB (EP time)")].ours == 0.0
        assert cells[(phase, "FEPLB (EP volume)")].ours == 0.0
        assert cells[(phase, "FasterMoE pipe=1 (EP time)")].verdict in ("claim-holds", "claim-fails")


def test_exact_history_replays_the_same_micro_batches():
    # history "actual": each replayed micro-batch becomes a pseudo-layer [c, c], so a planner
    # sees this micro-batch's counts as its history; Before LB (no history) is unchanged
    params = {**ft.DEFAULTS, **SMALL}
    trace = ft.trace_for(params, 2)
    exact = ft._layer_trace(trace, 1, "actual")
    assert exact.counts.shape[:2] == (2, 2)                       # 3 micro-batches -> 2 replayed
    assert torch.equal(exact.counts[0, 0], trace.counts[1, 1])
    assert torch.equal(exact.counts[0, 1], trace.counts[1, 1])
    assert torch.equal(exact.counts[1, 1], trace.counts[1, 2])
    assert ft.per_layer(params, 2, "Before LB", history="actual") == \
        pytest.approx(ft.per_layer(params, 2, "Before LB"))
    with pytest.raises(ValueError):
        ft.evaluate_layers(params, 2, history="next")


def test_unrelated_history_shows_the_next_layers_counts_and_replays_the_same_micro_batches():
    # history "unrelated": the planner sees the same micro-batch of the next layer (the last
    # layer wraps to the first); what is replayed, and so Before LB, does not change
    params = {**ft.DEFAULTS, **SMALL}
    trace = ft.trace_for(params, 2)
    last = trace.num_layers - 1
    stale = ft._layer_trace(trace, last, "unrelated")
    assert stale.counts.shape[:2] == (2, 2)
    assert torch.equal(stale.counts[0, 0], trace.counts[0, 1])
    assert torch.equal(stale.counts[0, 1], trace.counts[last, 1])
    assert torch.equal(stale.counts[1, 0], trace.counts[0, 2])
    assert torch.equal(stale.counts[1, 1], trace.counts[last, 2])
    assert ft.per_layer(params, 2, "Before LB", history="unrelated") == \
        pytest.approx(ft.per_layer(params, 2, "Before LB"))
    # the history reaches the planner: FEPLB's dynamic experts, and so its result, change
    informed = ft.mean_of(ft.per_layer(params, 2, "FEPLB"))
    assert ft.mean_of(ft.per_layer(params, 2, "FEPLB", history="unrelated")) != informed


def test_fastermoe_explained_only_with_exact_history_evidence(small_runs):
    cells = {(c.row, c.column): c for c in small_runs["feplb-table3"].cells}
    for row in ("4/2", "4/4", "2/8"):
        assert cells[(row, feplb_table3.EXACT)].verdict == "no-paper-value"
        pct = cells[(row, "FasterMoE vs Before LB")]
        if pct.verdict == "explained":
            assert pct.cause == "different-input" and "paired on the layers" in pct.note
