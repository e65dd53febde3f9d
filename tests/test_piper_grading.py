"""Grading of piper-fig10/12/13/14 (issue 16, "Investigate before you label"): the helpers the
causes rest on, and that each reproduction grades what it found the way its notes say."""

from __future__ import annotations

import pytest

from moe_repro.records import grading

from moe_repro.components.model.zoo import get_model
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources.memory_model import piper_eq4
from moe_repro.records.record import CAUSES
from moe_repro.reproductions.spec import NOTE_WORDS
from moe_repro.reproductions import all_reproductions
from moe_repro.reproductions import piper_fig10, piper_fig12, piper_fig13
from moe_repro.reproductions._resource import (
    PIPER_MFU_PEAK_TFLOPS,
    best_plan,
    half_unit_of_words,
    mfu_peak,
    smallest_fit,
    words_interval,
)


def _cells(rid):
    result = all_reproductions()[rid].run()
    return result, {(c.row, c.column): c for c in result.cells}


# ------------------------------------------------------------------------------------- helpers


@pytest.mark.parametrize("layout", [(32, 16), (16, 8), (4, 2)])
def test_eq4_terms_rebuild_the_printed_equation(layout):
    m = get_model("xmoe-super")
    PP, EP = layout
    M = 4 * PP
    printed = piper_eq4(
        m.d_model,
        m.d_ffn,
        m.n_experts,
        m.layers,
        m.heads,
        m.top_k,
        M,
        4096,
        EP,
        PP,
        M,
        0,
        flash=True,
    )
    assert piper_fig10.eq4_stage0(m, PP, EP, 1.0, 4096, M) == pytest.approx(printed, rel=1e-12)
    # each switch moves it the way it should
    assert piper_fig10.eq4_stage0(m, PP, EP, 1.0, 4096, M, n_mat=2) < printed
    assert piper_fig10.eq4_stage0(m, PP, EP, 1.0, 4096, M, expert_act_per_ep=False) > printed
    assert piper_fig10.eq4_stage0(m, PP, EP, 1.0, 4096, M, overhead=4e9) == pytest.approx(
        printed + 4e9
    )


def test_min_nodes_is_the_first_count_that_fits():
    assert piper_fig10.min_nodes({8: 100e9, 16: 70e9, 32: 60e9, 64: 50e9}, 64e9) == 32
    assert (
        piper_fig10.min_nodes({64: 50e9, 8: 100e9, 32: 60e9}, 64e9) == 32
    )  # order of the dict is irrelevant
    assert piper_fig10.min_nodes({8: None, 16: 65e9}, 64e9) is None


def test_layouts_obey_eq7_to_eq10():
    m, p = get_model("xmoe-super"), load_builtin("frontier")
    got = piper_fig10.layouts(m, 512, p)
    assert got and all(
        pp * ep == 512 and m.n_experts % ep == 0 and pp <= m.layers and ep <= 32 for pp, ep in got
    )
    assert (32, 16) in got and (8, 64) not in got  # EP = 64 leaves the switch group (Eq. 10)


def test_mfu_peak_finds_the_denominator_of_printed_pairs():
    pairs = [(t, m) for _, _, t, m, _ in piper_fig12._PRINTED.values()]
    peak, hits = mfu_peak(pairs)
    assert peak == PIPER_MFU_PEAK_TFLOPS == 191.0
    assert hits == {191.5: 0, 191.0: 5}
    assert mfu_peak([("100.0", "52.2")])[0] == 191.5  # 100 / 191.5 = 52.22%
    assert mfu_peak([("100.0", "60.0")])[0] is None


def test_words_are_read_at_the_precision_they_are_written_in():
    assert half_unit_of_words("20") == 5 and half_unit_of_words("2") == 0.5
    assert half_unit_of_words("3.6") == pytest.approx(0.05) and half_unit_of_words(
        "1.1"
    ) == pytest.approx(0.05)
    assert words_interval("20", "50") == (15, 55)
    lo, hi = words_interval("2", "3.6")
    assert (lo, hi) == (1.5, pytest.approx(3.65))


def test_smallest_fit_is_the_smallest_integer_node_count():
    for key, ckpt in (("mixtral-8x22b", True), ("mixtral-8x7b", False)):
        pl = smallest_fit(key, "frontier", 4096, 4, checkpointing=ckpt)
        assert pl is not None and pl.best is not None
        if not ckpt:
            assert not pl.best.checkpointing
        if pl.nodes > 1:
            assert (
                best_plan(key, "frontier", pl.nodes - 1, 4096, 4, allow_checkpointing=ckpt).best
                is None
            )
    with_ac = smallest_fit("mixtral-8x7b", "frontier", 4096, 4, checkpointing=True)
    without = smallest_fit("mixtral-8x7b", "frontier", 4096, 4, checkpointing=False)
    assert with_ac.nodes <= without.nodes


def test_expert_kind_follows_sec_2a():
    assert piper_fig12.expert_kind(get_model("mixtral-8x7b")) == "large"
    assert piper_fig12.expert_kind(get_model("llama4-scout")) == "large"  # 16 experts, top-1
    assert piper_fig12.expert_kind(get_model("deepseek-v2")) == "fine-grained"  # top-6
    assert piper_fig12.expert_kind(get_model("llama4-maverick")) == "neither"  # 128 experts, top-1


# ----------------------------------------------------------------------------- reproductions


@pytest.mark.parametrize(
    "rid", ["piper-fig10", "piper-fig11", "piper-fig12", "piper-fig13", "piper-fig14"]
)
def test_every_label_says_how_it_was_found(rid):
    result, _ = _cells(rid)
    for c in result.cells:
        assert len((c.note or "").split()) <= NOTE_WORDS, (rid, c.row, c.column)
        if c.verdict == "explained":
            assert c.cause in CAUSES and c.note and c.paper_printed is not None
            # a cause is a recomputation that agrees under the cell's own class
            assert c.counterfactual and c.counterfactual["grade"] in ("match", "close"), (
                rid,
                c.row,
            )
            assert c.fault is None
        if c.verdict in ("claim-holds", "claim-fails"):
            assert c.note and c.paper_printed and c.paper_source
        if c.verdict == "not-reproduced":
            assert c.note


def test_fig10_minimum_nodes_follow_eq4_and_the_stage_model_difference_is_ours():
    result, cells = _cells("piper-fig10")
    eq4 = cells[(piper_fig10.ROW, piper_fig10.MIN_NODES)]
    assert eq4.ours == 64 and eq4.verdict == "match"
    stage = cells[(piper_fig10.ROW_STAGE, piper_fig10.MIN_NODES)]
    # our stage model's accounting is ours: a deviation naming the component, never explained
    assert (
        stage.verdict == "deviates" and stage.cause is None and stage.fault == "stage memory model"
    )
    assert result.extra["min_nodes"]["stage 1f1b"] is None  # without checkpointing nothing fits
    assert not [
        c for c in result.cells if c.verdict == "not-reproduced"
    ]  # EDP beyond E GPUs is computed
    params = cells[(piper_fig10.ROW, piper_fig10.PARAMS)]
    assert params.unit.startswith("2^30") and params.ours == pytest.approx(545.5, abs=0.05)
    assert params.verdict == "explained" and params.cause == "counting-convention"
    assert abs(params.deviation) < 0.01  # in the paper's unit the count is 0.1% off, not 7.5%
    # recounted without the 61 routers of d_model x E = 7168 x 256 weights each
    from moe_repro.components.model.params import param_counts

    total = param_counts(get_model("xmoe-super")).total
    assert params.counterfactual["ours"] == pytest.approx((total - 61 * 7168 * 256) / 2**30)
    assert (
        cells[(piper_fig10.ROW, piper_fig10.PARAMS_CAPTION)].verdict == "deviates"
    )  # 615: a guess only
    # both claims follow from our own model: shown, not evidence
    assert cells[("1F1B vs GPipe", "peak memory per GPU")].verdict == "echo"
    assert cells[("binding stage", "1F1B stage 0")].verdict == "echo"


def test_fig12_uses_the_hatching_and_the_papers_mfu():
    result, cells = _cells("piper-fig12")
    for key, (row, _, _, _, hatched) in piper_fig12._PRINTED.items():
        ac = cells[(row, piper_fig12.AC)]
        assert ac.verdict == "echo" and ac.ours == float(hatched)
        t, mfu = cells[(row, piper_fig12.TFLOPS)], cells[(row, piper_fig12.MFU)]
        assert mfu.ours == pytest.approx(100 * t.ours / 191.0)
        # the MFU restates the TFLOPS cell: shown, counted once
        assert mfu.derived_from == f"{row} / {piper_fig12.TFLOPS}" and mfu.verdict == t.verdict
    for key in (
        "mixtral-8x22b",
        "llama4-maverick",
        "deepseek-v2",
    ):  # Table I disagrees with the labels
        c = cells[(piper_fig12._PRINTED[key][0], piper_fig12.PARAMS)]
        # no count of ours gives the figure's label: a deviation, the hypothesis in the note
        assert c.verdict == "deviates" and "Table I" in c.note and c.grade_class == "exact"
    assert {c.verdict for c in result.cells if c.row in (piper_fig12.ORDER, piper_fig12.RANGE)} <= {
        "claim-holds",
        "claim-fails",
    }
    fig = next(f for f in result.figures if f.name == "piper-fig12")
    assert "TFLOPS per GPU" in fig.ylabel
    assert all(f.form == "bars" for f in result.figures)  # Fig. 12 is a bar chart
    kinds = {s["kind"] for s in fig.series}
    assert kinds == {"paper", "ours"} and all(len(s["x"]) == len(s["y"]) == 5 for s in fig.series)


def test_fig13_has_the_figure_of_the_paper_and_its_claims():
    result, cells = _cells("piper-fig13")
    fig = next(f for f in result.figures if f.name == "piper-fig13")
    labels = [s["label"] for s in fig.series]
    for name in ("DeepSpeed-MoE", "DeepSpeed-TED", "Tutel", "X-MoE", "Piper"):
        assert name in labels
    assert any(s["kind"] == "ours" for s in fig.series)
    tutel = next(s for s in fig.series if s["label"] == "Tutel")
    assert tutel["y"] == [33.0, 4.7, None, None]  # OOM is a gap, not a zero
    assert "TFLOPS per GPU" in fig.ylabel
    fits = cells[(piper_fig13.FITS, "memory-feasible layout")]
    assert fits.verdict == "claim-holds" and fits.ours == 4
    assert fig.form == "bars" and tutel["oom"] == [
        piper_fig13._PRINTED[k][0] for k in ("xmoe-large", "xmoe-super")
    ]
    ratio = cells[(piper_fig13.SPEEDUP_RANGE, "ratio")]
    # "2-3.6x" is read by the policy as 1.95 to 3.65; ours for Small (74.87 / 44.0 = 1.70x) is below it
    assert "1.95 to 3.65" in ratio.reading
    assert ratio.verdict == "claim-fails" and ratio.ours == pytest.approx(
        cells[("10.1B Small", piper_fig13.PIPER)].ours / 44.0
    )


def test_fig14_claims_and_the_span_of_unstated_inputs():
    result, cells = _cells("piper-fig14")
    assert (
        cells[("TFLOPS / GPU with scale", "declines as E and GPUs grow")].verdict == "claim-holds"
    )
    assert (
        cells[("862B on 512 and 1.7T on 1024 GPUs", "memory-feasible layout")].verdict
        == "claim-holds"
    )
    mfu = cells[("1.7T model", "MFU on 1024 GPUs")]
    assert mfu.ours == pytest.approx(100 * cells[("E=256", "TFLOPS / GPU")].ours / 191.0)
    for row in ("E=16", "E=128", "E=256"):
        assert "ours spans" in cells[(row, "TFLOPS / GPU")].note
    # "20%" read by the policy as 19.5 to 20.5
    assert "19.5 to 20.5" in mfu.reading and mfu.verdict == (
        "claim-holds" if 19.5 <= mfu.ours <= 20.5 else "claim-fails"
    )
    # 110.73B is printed 110: truncated, but truncating changes no other label's digits (10.07 ->
    # 10, 862.37 -> 862, 1.72T -> 1.7T round the same), so the rest of the figure cannot
    # contradict it: fitted to one cell, the policy does not accept it
    e16 = cells[("E=16", "Parameters")]
    assert e16.verdict == "deviates" and "fewer than two cells" in e16.note
    spans = {i["model"]: i["tflops_span"] for i in result.extra["inputs"]}
    assert all(len(v) == 8 for v in spans.values())


def test_fig14_scaling_factors_rebuild_tflops_and_the_loss_is_the_all_to_all():
    from moe_repro.reproductions.piper_fig14 import scaling_factors

    m = get_model("m10b-e256")
    e = best_plan(m.key, "frontier", 128, 4096, 4).best.estimate
    f = scaling_factors(e, m.layers)
    assert f["flops"] * f["fill"] * f["rate"] * f["allreduce"] / 1e12 == pytest.approx(
        e.tflops_per_gpu, rel=1e-12
    )
    small = best_plan("m10b-e16", "frontier", 8, 4096, 4).best.estimate
    g = scaling_factors(small, m.layers)
    # weak scaling: per-GPU compute per layer is the same at 64 and 1024 GPUs; the all-to-all is not
    assert f["compute_ms"] == pytest.approx(g["compute_ms"], rel=0.01)
    assert f["alltoall_ms"] > 4 * g["alltoall_ms"]
    _, cells = _cells("piper-fig14")
    eff = cells[("E=16 -> E=256", "Weak-scaling efficiency 64 -> 1024 GPUs")]
    # a prediction validate does not score on Frontier: ours within 15% of the paper's 73% (not
    # 15% plus half a printed unit) is close, outside it deviates; counted apart
    assert eff.grade_class == grading.UNSCORED
    assert eff.verdict == (
        "match"
        if abs(eff.ours - 73) <= 0.5
        else "close"
        if abs(eff.ours - 73) <= 0.15 * 73
        else "deviates"
    )
    assert "ruled out" in eff.detail and "Step by step" in eff.detail


def test_fig12_the_output_head_is_blamed_on_our_planner_where_it_carries_the_deviation():
    _, cells = _cells("piper-fig12")
    scout = cells[("Llama 4 Scout", piper_fig12.TFLOPS)]
    # our planner's stage split: a deviation naming the planner, never explained
    assert scout.verdict == "deviates" and scout.fault == "planner" and scout.cause is None
    assert "without the head the same layout gives" in scout.note
    assert cells[("Llama 4 Scout", piper_fig12.MFU)].verdict == "deviates"
    for key in ("mixtral-8x7b", "deepseek-v2"):  # the head is a small part of these deviations
        c = cells[(piper_fig12._PRINTED[key][0], piper_fig12.TFLOPS)]
        assert c.fault != "planner" and "fraction of its own ceiling" in c.detail
        assert "alpha" in c.detail


def test_unstated_inputs_are_a_hypothesis_not_a_cause():
    """Fig. 12/14 state no micro-batch count (nor Fig. 14 a sequence): a span of ours over guesses that
    covers the paper's value is no recomputation with the paper's input, so such cells stay deviations."""
    for rid in ("piper-fig12", "piper-fig14"):
        _, cells = _cells(rid)
        for c in cells.values():
            assert c.cause != "unstated-input", (rid, c.row)
            if (
                c.column == "TFLOPS / GPU"
                and c.verdict == "deviates"
                and "inside" in (c.note or "")
            ):
                assert "hypothesis" in c.note
    _, cells = _cells("piper-fig12")
    v2 = cells[("DeepSeek-V2", piper_fig12.TFLOPS)]  # 54.7 vs 46.8: +17%, outside the 15% tolerance
    assert v2.verdict == "deviates" and "hypothesis" in v2.note
    assert cells[("Mixtral 8x7B", piper_fig12.TFLOPS)].verdict == "deviates"
    # Mixtral 8x22B (58.6 vs 55.4) and Maverick (35.2 vs 37.8) are within 15% of the measurement
    for row in ("Mixtral 8x22B", "Llama 4 Maverick"):
        c = cells[(row, piper_fig12.TFLOPS)]
        assert c.verdict == "close" and abs(c.ours - c.paper) <= 0.15 * c.paper


def test_fig11_notes_bound_ours_by_its_compute_rates():
    _, cells = _cells("piper-fig11")
    c = cells[("Mixtral 8x22B", "TFLOPS / GPU (one layer, one node)")]
    assert (
        c.verdict == "deviates" and "even with no communication ours would be" in c.detail.lower()
    )
    assert c.fault == "performance model" and c.grade_class == grading.UNSCORED
    v2 = cells[("DeepSeek-V2", "TFLOPS / GPU (one layer, one node)")]
    assert "fine-grained layers" in v2.detail
    # 88.6 vs the measured 78.3: +13%, within the one prediction tolerance
    assert v2.verdict == "close" and v2.fault is None


def test_fig12_kernel_rates_are_ruled_out_for_mixtral_8x7b():
    """Piper states no GEMM rate above the profile's for Mixtral's experts; the counterfactuals (copies
    of the profile, the default untouched) leave too much of the deviation to record the rate as its cause."""
    import dataclasses
    import math

    from moe_repro.components.resources.perf_model import estimate
    from moe_repro.components.resources.planner import plan
    from moe_repro.reproductions.piper_fig11 import PRINTED as FIG11

    _, cells = _cells("piper-fig12")
    c = cells[("Mixtral 8x7B", piper_fig12.TFLOPS)]
    assert c.verdict == "deviates" and "kernel rates ruled out" in c.detail
    assert "approach or exceed the 100 TFLOPS region" in c.detail
    assert cells[("Mixtral 8x7B", piper_fig12.MFU)].verdict == "deviates"
    p = load_builtin("frontier")
    assert (
        p.gemm_flops == 100e12 and p.attention_flops == 80e12
    )  # the default profile is not changed
    paper, paper_one = (
        float(piper_fig12._PRINTED["mixtral-8x7b"][2]),
        float(FIG11["mixtral-8x7b"][1]),
    )
    cf = piper_fig12.rate_counterfactuals("mixtral-8x7b", "frontier", 4096, 4, 4, False, paper_one)
    # the planner's layout at 4 nodes: micro-batch x 4096 tokens x top-2 x its EP / 8 experts,
    # compute-bound on the roofline
    best = plan(get_model("mixtral-8x7b"), p, 4, seq=4096, alpha=4, allow_checkpointing=False).best
    assert cf["tokens_per_expert"] == best.micro_batch * 4096 * 2 * best.ep / 8
    assert cf["intensity"] > 10 * cf["ridge"]
    whole = math.log(c.ours / paper)
    assert 0 < 1 - math.log(cf["attention"] / paper) / whole < 1 - piper_fig12.HEAD_SHARE
    # the fitted GEMM rate reproduces Fig. 11's single layer, and still leaves over a tenth of the deviation
    layer = dataclasses.replace(get_model("mixtral-8x7b"), layers=1, moe_layers=None, vocab=None)
    q = dataclasses.replace(
        p,
        gemm_flops=cf["gemm"] * 1e12,
        attention_flops=piper_fig12.FIG3_ATTENTION_TOP_TFLOPS * 1e12,
    )
    assert estimate(
        layer, q, PP=1, EP=8, micro_batch=1, seq=4096, M=1
    ).tflops_per_gpu == pytest.approx(paper_one)
    assert 100 < cf["gemm"] < p.peak_flops / 1e12
    assert math.log(cf["fit"] / paper) / whole > 1 - piper_fig12.HEAD_SHARE
