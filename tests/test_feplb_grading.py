"""The FEPLB reproductions' grading: the trace statistics, sampled cells and claims graded on
each of 5 seeds by the one policy (records/grading.py), fig4's per-pair volume and modelled time,
and the invariants of the tables (no cause without a recomputation: a deviation names our
component). Expected values are worked out by hand in the comments."""

import pytest
import torch

from moe_repro.components.balance.fastermoe_shadow import dispatch_rows
from moe_repro.records import grading
from moe_repro.reproductions import _feplb_traces as ft
from moe_repro.reproductions import feplb_fig4, feplb_table2, feplb_table3, feplb_table4
from moe_repro.reproductions.spec import NOTE_WORDS, PaperClaim, PaperValue, Reproduction, Result
from derived_how import assert_how_is_the_catalogs

SMALL = {"tokens": 128, "micro_batches": 3, "layers": 3}
N = grading.MIN_SEEDS


# --- trace statistics -----------------------------------------------------------------------------


def test_imbalance_by_hand():
    # experts 0, 1 on rank 0 and 2, 3 on rank 1: device loads 10 + 0 = 10 and 2 + 4 = 6, mean 8
    s = ft.imbalance([10, 0, 2, 4], [0, 0, 1, 1], 2)
    assert s.straggler == 2.0  # 10 - 8
    assert s.device_max_mean == 1.25  # 10 / 8
    assert s.expert_max_mean == 2.5  # 10 / mean(10, 0, 2, 4) = 10 / 4
    assert s.idle_share == 0.2  # (10 - 8) / 10


def test_prediction_error_and_change_by_hand():
    assert ft.prediction_error([4, 4], [6, 2]) == 0.5  # (|6-4| + |2-4|) / (6 + 2)
    assert ft.prediction_error([3, 5], [3, 5]) == 0.0
    assert ft.change_pct(60, 80) == -25.0
    assert ft.derived_printed("6,666", "2,278", 2) == "2.93"  # FEPLB Table 3, Before LB
    assert ft.derived_printed("316.0", "2,278", 3) == "0.139"  # Table 4 / Table 3: us per row


def test_trace_stats_agree_with_the_replay():
    # Before LB's straggler from the statistics must be the replay's (same samples, same means)
    params = {**ft.DEFAULTS, **SMALL}
    for ep in (2, 4):
        stats = ft.trace_stats(params, ep)
        replay = ft.evaluate(params, ep, methods=("Before LB",))["Before LB"]
        assert stats.straggler == pytest.approx(replay.token_straggler)
        assert stats.rows_per_device == 128 * 8  # tokens x top-8
        assert len(stats.layer_stragglers) == 3
        assert stats.device_max_mean == pytest.approx(
            ft._mean(
                ft.imbalance(
                    ft.trace_for(params, ep).expert_counts(l, m),
                    torch.arange(128) // (128 // ep),
                    ep,
                ).device_max_mean
                for l in range(3)
                for m in (1, 2)
            )
        )


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


def test_seeds_are_the_policys_offset_by_the_seed_parameter():
    n = grading.MIN_SEEDS
    assert n >= 9
    assert ft.seeds({"seed": 0}) == list(range(n))
    assert ft.seeds({"seed": 5}) == list(range(5, 5 + n))  # the second window of the seed test
    got = ft.over_seeds({"seed": 3, "x": 1}, lambda p: (p["seed"], p["x"]))
    assert got == [(s, 1) for s in range(3, 3 + n)]


def _repro(printed="100"):
    return Reproduction(
        id="feplb-table3",
        paper_values=[PaperValue("r", "c", printed, "x", "t")],
        paper_claims=[PaperClaim("2/8", "k", "2x lower", "t")],
        compute=lambda r, p: Result(cells=[]),
    )


def test_sampled_cell_grades_each_seed():
    repro = _repro()
    n = grading.MIN_SEEDS
    # paper 100 (half unit 0.5): 100.2 matches; 90 is 10% off ("x": on the log ratio, 11%),
    # inside 15%: close
    assert ft.sampled(repro, "r", "c", [100.2] * n, "x", "n").verdict == "match"
    assert ft.sampled(repro, "r", "c", [90.0] * n, "x", "n").verdict == "close"
    assert ft.sampled(repro, "r", "c", [70.0] * n, "x", "n").verdict == "deviates"  # 30% off
    mixed = ft.sampled(repro, "r", "c", [90.0] * (n - 1) + [70.0], "x", "n")
    assert mixed.verdict == "seed-dependent" and mixed.seeds["agree"] == pytest.approx((n - 1) / n)
    assert mixed.ours == 90.0 and mixed.seeds["range"] == [70.0, 90.0]  # median, range
    with pytest.raises(Exception):
        ft.sampled(repro, "r", "c", [90.0] * (n - 1), "x", "n")  # under the policy's seeds


def test_ratio_claim_reads_2x_by_the_one_rule():
    repro = _repro()
    # "2x" reads 1.5 to 2.5 (its printed precision)
    holds = ft.fastermoe_over_feplb_claim(
        repro, "k", "2x", [2.4, 1.6, 2.0, 2.2, 1.9, 2.1, 1.7, 2.3, 1.8], "s"
    )
    assert holds.verdict == "claim-holds" and "1.5 to 2.5" in holds.reading
    assert ft.fastermoe_over_feplb_claim(repro, "k", "2x", [2.6] * N, "s").verdict == "claim-fails"
    assert (
        ft.fastermoe_over_feplb_claim(repro, "k", "2x", [2.6] + [2.0] * (N - 1), "s").verdict
        == "seed-dependent"
    )
    # "1.8x" reads 1.75 to 1.85
    assert ft.read_per_seed("1.8x", [1.74, 1.76, 1.85, 1.86, 1.8]) == [
        False,
        True,
        True,
        False,
        True,
    ]


def test_lead_grows_claim_is_tested_on_each_seed():
    repro = Reproduction(
        id="feplb-table3",
        paper_values=[],
        compute=lambda r, p: Result([]),
        paper_claims=[PaperClaim("2/8", "FEPLB's lead over FasterMoE grows with EP", "grows", "t")],
    )
    grows = {2: [1.0] * N, 4: [2.0] * N, 8: [3.0] * N}
    assert ft.lead_grows_claim(repro, grows, "s", "p").verdict == "claim-holds"
    # seed 4 falls from EP = 4 to 8: that seed fails, the others hold
    mixed = {2: [1.0] * N, 4: [2.0] * N, 8: [3.0] * (N - 1) + [1.5]}
    cell = ft.lead_grows_claim(repro, mixed, "s", "p")
    assert cell.verdict == "seed-dependent" and cell.seeds["holds"] == [True] * (N - 1) + [False]


# --- fig4: per-pair volume and time -------------------------------------------------------------


def test_pair_rows_by_hand():
    # 2 ranks, experts 0, 1 on rank 0 and 2, 3 on rank 1. Token 0 (source 0) picks 2 and 3,
    # token 1 (source 1) picks 0 and 2 (2 is local to it).
    top = torch.tensor([[2, 3], [0, 2]])
    source = torch.tensor([0, 1])
    ranks = [0, 0, 1, 1]
    one = feplb_fig4.pair_rows(top, source, ranks, 2)
    assert one.tolist() == [[[0, 1], [1, 0]]]  # token 0 once to rank 1, token 1 to rank 0
    two = feplb_fig4.pair_rows(top, source, ranks, 2, pipe=2)
    # experts 2 and 3 are in different stages (local index 0 and 1 of 2): token 0 crosses twice
    assert two.tolist() == [[[0, 1], [1, 0]], [[0, 1], [0, 0]]]
    assert feplb_fig4.pair_rows(top, source, ranks, 2, shadows=(2, 3)).tolist() == [
        [[0, 0], [1, 0]]
    ]
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


def test_pair_rows_is_the_components_rule():
    from moe_repro.components.balance.fastermoe_shadow import dispatch_rows_per_pair

    g = torch.Generator().manual_seed(5)
    top = torch.stack([torch.randperm(32, generator=g)[:4] for _ in range(300)])
    source = torch.arange(300) // 75
    ranks = [e // 8 for e in range(32)]
    for pipe in (1, 2):
        for shadows in ((), (3, 17, 30)):
            assert torch.equal(
                feplb_fig4.pair_rows(top, source, ranks, 4, pipe, shadows),
                dispatch_rows_per_pair(top, source, ranks, 4, pipe, shadows),
            )


def test_messages_of_chains_the_stages():
    rows = torch.tensor([[[0, 2], [1, 0]], [[0, 3], [0, 0]]])
    msgs, deps = feplb_fig4.messages_of(rows, 10)
    assert deps == {"a2a0": [], "a2a1": ["a2a0"]}
    assert sorted(msgs) == [("a2a0", 0, 1, 20), ("a2a0", 1, 0, 10), ("a2a1", 0, 1, 30)]


# --- grading invariants on small runs ----------------------------------------------------------

MODULES = {
    "feplb-table2": feplb_table2,
    "feplb-table3": feplb_table3,
    "feplb-table4": feplb_table4,
    "feplb-fig4": feplb_fig4,
}


@pytest.fixture(scope="module")
def small_runs():
    return {rid: module.REPRODUCTION.run(SMALL) for rid, module in MODULES.items()}


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
    assert (
        printed
        == {
            "feplb-table3": ["6,666", "4,036", "-39", "2,021", "-70"],
            "feplb-table4": ["1.110", "0.625", "-44", "0.352", "-68"],
        }[rid]
    )
    assert all(c is not None for row in grid["rows"] for c in row["cells"])


def test_table2_compares_what_the_paper_prints(small_runs):
    cells = {(c.row, c.column): c for c in small_runs["feplb-table2"].cells}
    # every value FEPLB Table 2 prints is a cell, quoted as printed (forward / backward, ms)
    table2 = {
        "4/2": "8.2/14.9 7.9/14.0 13.1/22.8 8.0/17.1 7.9/14.4",
        "4/4": "7.3/13.2 6.9/12.2 15.3/24.0 7.2/15.2 6.8/12.1",
        "2/8": "6.9/12.5 6.3/11.1 22.8/30.0 6.8/14.5 6.0/10.6",
    }
    methods = ("Before LB", "FasterMoE", "Triton Dist.", "Tutel", "FEPLB")
    for row, line in table2.items():
        for method, pair in zip(methods, line.split()):
            for phase, printed in zip(("fwd", "bwd"), pair.split("/")):
                cell = cells[(row, f"{method} {phase}")]
                assert cell.paper_printed == printed and cell.paper_source == "FEPLB Table 2"
                assert cell.verdict in ("not-comparable", "not-reproduced") and cell.note
    # the forward savings (Table 2's differences, 6.9 - 6.0 = 0.9 at 2/8) are graded per seed
    saving = cells[("2/8", "FEPLB fwd saving vs Before LB")]
    assert saving.paper_printed == "0.9" and "6.9 - 6.0" in saving.paper_source
    assert saving.grade_class == "sampled" and len(saving.seeds["values"]) == grading.MIN_SEEDS
    assert saving.verdict in grading.COMPARED
    before = cells[("2/8", "Before LB fwd")]
    assert before.verdict == "not-comparable" and before.ours is not None


def test_no_cell_is_explained_and_deviations_name_our_component(small_runs):
    # GLM-5 routing is not public: nothing can be recomputed on the paper's input, and the trace,
    # the balancers and the GEMM model are ours, so a deviation names one and is never explained
    for rid, result in small_runs.items():
        for c in result.cells:
            assert c.verdict != "explained", (rid, c.row, c.column)
            if c.verdict == "deviates":
                assert c.fault, (rid, c.row, c.column)


def test_every_number_from_the_traces_is_sampled_at_the_policys_seeds(small_runs):
    for rid, result in small_runs.items():
        for c in result.cells:
            if c.grade_class == "claim":
                if c.verdict != "not-reproduced":
                    assert len(c.seeds["holds"]) == grading.MIN_SEEDS, (rid, c.row, c.column)
            elif c.ours is not None:
                assert c.grade_class == "sampled", (rid, c.row, c.column)
                assert len(c.seeds["values"]) == grading.MIN_SEEDS
            assert c.tolerance in (
                None,
                *(grading.tolerance_words("sampled", q) for q in grading.QUANTITIES),
            )


def test_notes_are_short(small_runs):
    for rid, result in small_runs.items():
        for c in result.cells:
            assert len((c.note or "").split()) <= NOTE_WORDS, (rid, c.row, c.column, c.note)


def test_table4_names_the_factors_of_a_deviation(small_runs):
    cells = {(c.row, c.column): c for c in small_runs["feplb-table4"].cells}
    feplb = cells[("4/2", "FEPLB")]
    if feplb.verdict == "deviates":
        assert "token reduction" in feplb.note and "time per row" in feplb.note
    printed = {
        pv.row: pv.printed for pv in feplb_table4.PAPER_VALUES if pv.column == feplb_table4.PER_ROW
    }
    assert printed == {"4/2": "0.139", "4/4": "0.140", "2/8": "0.167"}  # 316 / 2,278 etc.
    ratio = cells[("2/8", feplb_table4.RATIO)]
    assert ratio.grade_class == "claim" and "1.75 to 1.85" in ratio.reading


def test_table3_shows_the_trace_beside_the_paper(small_runs):
    cells = {(c.row, c.column): c for c in small_runs["feplb-table3"].cells}
    growth = cells[("2/8", feplb_table3.GROWTH)]
    assert growth.paper == 2.93 and growth.ours is not None
    assert cells[("2/8", feplb_table3.IDLE)].verdict == "not-comparable"
    for row in ("4/2", "4/4", "2/8"):
        assert cells[(row, "trace: rows per device (mean)")].ours == 128 * 8
    rows = {"4/2", "4/4", "2/8"}
    assert {c.row for c in small_runs["feplb-table3"].cells} == rows | {
        ft.real_row(r) for r in rows
    }
    # the real-count rows carry FEPLB's reduction on the synthetic trace beside theirs, as a
    # second view: each printed number is graded once, on the synthetic rows
    assert "on the synthetic trace" in cells[(ft.real_row("2/8"), "FEPLB vs Before LB")].note
    for rid in ("feplb-table3", "feplb-table4"):
        for c in small_runs[rid].cells:
            if c.row.endswith(ft.REAL_ROW) and c.paper is not None:
                assert c.verdict == "not-comparable" and "graded once" in c.note, (rid, c.row)
    assert ft.REAL_WORKLOAD in feplb_table3.real_count_workload(SMALL)["why"]


@pytest.mark.parametrize("rid", ["feplb-table3", "feplb-table4"])
def test_a_method_that_moves_nothing_or_agrees_by_coincidence_is_not_evidence(small_runs, rid):
    cells = {(c.row, c.column): c for c in small_runs[rid].cells}
    for row, _ in ft.CONFIGS:
        base = cells[(row, "Before LB")]
        for method in ("FasterMoE", "FEPLB"):
            c, red = cells[(row, method)], cells[(row, f"{method} vs Before LB")]
            if c.seeds["values"] == base.seeds["values"]:  # the balancer moved nothing
                assert c.verdict not in grading.AGREE, (row, method)
            if c.verdict in grading.AGREE and "deviates" in (base.verdict, red.verdict):
                raise AssertionError(f"{rid} {row} {method}: agreement by coincidence counted")


def test_table3_shows_feplb_with_the_other_selection_rule(small_runs):
    # FEPLB Sec. 2's rule in the FEPLB columns; the next-busiest variant as a diagnostic
    cells = {(c.row, c.column): c for c in small_runs["feplb-table3"].cells}
    for row in ("4/2", "4/4", "2/8"):
        diag = cells[(row, feplb_table3.RULE)]
        assert diag.paper is None and diag.ours is not None and diag.unit == "%"
        assert "selects the busiest" in diag.note and "moves nothing in" in diag.note
        assert len(diag.seeds["values"]) == grading.MIN_SEEDS


def test_fig4_compares_time_not_volume(small_runs):
    cells = {(c.row, c.column): c for c in small_runs["feplb-fig4"].cells}
    for phase, paper in (("Dispatch", 46.8), ("Combine", 40.2)):
        time = cells[(phase, "FasterMoE pipe=2 (EP time)")]
        assert time.paper == paper and time.unit == "%" and "flow simulator" in time.note
        assert cells[(phase, "FasterMoE pipe=2 (EP volume)")].paper is None
        assert cells[(phase, "FEPLB (EP time)")].ours == 0.0
        assert cells[(phase, "FEPLB (EP volume)")].ours == 0.0
        # shadowing only removes rows: the claim holds for every shadow set the policy tries
        pipe1 = cells[(phase, "FasterMoE pipe=1 (EP time)")]
        assert pipe1.verdict == "echo" and "cannot fail" in pipe1.note
    # Combine returns Dispatch's rows: the same per-seed numbers, graded once
    combine = cells[("Combine", "FasterMoE pipe=2 (EP time)")]
    assert (
        combine.seeds["values"] == cells[("Dispatch", "FasterMoE pipe=2 (EP time)")].seeds["values"]
    )
    assert combine.verdict in ("not-evidence", "deviates")


def test_exact_history_replays_the_same_micro_batches():
    # history "actual": each replayed micro-batch becomes a pseudo-layer [c, c], so a planner
    # sees this micro-batch's counts as its history; Before LB (no history) is unchanged
    params = {**ft.DEFAULTS, **SMALL}
    trace = ft.trace_for(params, 2)
    exact = ft._layer_trace(trace, 1, "actual")
    assert exact.counts.shape[:2] == (2, 2)  # 3 micro-batches -> 2 replayed
    assert torch.equal(exact.counts[0, 0], trace.counts[1, 1])
    assert torch.equal(exact.counts[0, 1], trace.counts[1, 1])
    assert torch.equal(exact.counts[1, 1], trace.counts[1, 2])
    assert ft.per_layer(params, 2, "Before LB", history="actual") == pytest.approx(
        ft.per_layer(params, 2, "Before LB")
    )
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
    assert ft.per_layer(params, 2, "Before LB", history="unrelated") == pytest.approx(
        ft.per_layer(params, 2, "Before LB")
    )
    # the history reaches the planner: FEPLB's dynamic experts, and so its result, change
    informed = ft.mean_of(ft.per_layer(params, 2, "FEPLB"))
    assert ft.mean_of(ft.per_layer(params, 2, "FEPLB", history="unrelated")) != informed


def test_exact_history_is_a_diagnostic_not_a_cause(small_runs):
    cells = {(c.row, c.column): c for c in small_runs["feplb-table3"].cells}
    for row in ("4/2", "4/4", "2/8"):
        assert cells[(row, feplb_table3.EXACT)].verdict == "no-paper-value"
        assert cells[(row, "FasterMoE vs Before LB")].cause is None


def test_trace_counts_kept_on_disk_are_the_drawn_ones(tmp_path, monkeypatch):
    from moe_repro.components.balance.routing_trace import synthetic_trace

    monkeypatch.setenv("MOE_REPRO_CACHE", str(tmp_path))
    params = {**ft.DEFAULTS, **SMALL, "seed": 7}
    monkeypatch.setattr(ft, "_TRACES", {})
    drawn = ft.trace_for(params, 2)
    assert len(list((tmp_path / "feplb-traces").iterdir())) == 1
    monkeypatch.setattr(ft, "_TRACES", {})
    loaded = ft.trace_for(params, 2)  # read back from disk
    direct = synthetic_trace(3, 3, 128, 8, 128, 2, seed=7 * 1000 + 2)
    assert torch.equal(loaded.counts, direct.counts) and torch.equal(drawn.counts, direct.counts)
    # every token's choices are kept too where the trace kept them, and read back as drawn
    monkeypatch.setattr(ft, "_TRACES", {})
    ft.trace_for({**params, "seed": 8}, 2, keep_tokens=True)
    monkeypatch.setattr(ft, "_TRACES", {})
    tokens = ft.trace_for({**params, "seed": 8}, 2, keep_tokens=True)
    direct = synthetic_trace(3, 3, 128, 8, 128, 2, seed=8 * 1000 + 2, keep_tokens=True)
    assert all(
        torch.equal(a, b)
        for la, lb in zip(tokens.top_experts, direct.top_experts)
        for a, b in zip(la, lb)
    )
    assert len(list((tmp_path / "feplb-traces").iterdir())) == 3  # 2 counts, 1 choices
    monkeypatch.setenv("MOE_REPRO_CACHE", "off")
    assert ft._disk_path(("any",)) is None
