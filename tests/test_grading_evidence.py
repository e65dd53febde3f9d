"""Issue 50: agreement only evidence can earn. Each defect the issue names is planted in a toy
reproduction built with the spec API, and the one policy (records/grading.py) must refuse it:
a reversed speedup within 15%, a balancer that moves nothing, a claim that holds by
construction, a per-cell unit switch; and a range read as one claim, a reused number, percent
changes judged on the underlying ratio, unscored predictions counted apart."""

from __future__ import annotations

import random

import pytest

from moe_repro.records import grading
from moe_repro.reproductions.spec import PaperClaim, PaperValue, Reproduction, Result

N = grading.MIN_SEEDS


def _repro(values=(), claims=(), compute=None, **kw) -> Reproduction:
    return Reproduction(
        id="planted",
        paper_values=list(values),
        paper_claims=list(claims),
        compute=compute or (lambda r, p: Result(cells=[])),
        **kw,
    )


def test_a_reversed_speedup_within_15_percent_is_refused():
    r = _repro([PaperValue("HALO", "speedup", "1.1", "x", "planted")], grade_class="prediction")
    slower = r.compare("HALO", "speedup", 0.966, "x")  # 12% from 1.1, on the wrong side of 1
    assert slower.verdict == "deviates"
    assert r.compare("HALO", "speedup", 1.2, "x").verdict == "close"  # right side, within 15%
    # on the log ratio: 2.0 / 1.149 is inside; 2.0 x 0.86 is 14% off but 16% on the log
    r = _repro([PaperValue("HALO", "speedup", "2.0", "x", "planted")], grade_class="prediction")
    assert r.compare("HALO", "speedup", 2.0 / 1.149, "x").verdict == "close"
    assert r.compare("HALO", "speedup", 2.0 * 0.86, "x").verdict == "deviates"


def test_a_range_is_one_claim_read_by_the_policy():
    r = _repro(claims=[PaperClaim("HALO", "range", "1.1x - 9x lower latency", "planted")])
    points = [0.966, 1.3, 7.8]
    cell = r.claim(
        "HALO", "range", None, min(points), "x", "planted", reading="1.1-9x", values=points
    )
    assert cell.verdict == "claim-fails" and "1.05 to 9.05" in cell.reading
    ok = r.claim("HALO", "range", None, 1.3, "x", "planted", reading="1.1-9x", values=[1.3, 7.8])
    assert ok.verdict == "claim-holds"


def test_a_sampled_direction_that_fails_at_the_median_fails():
    r = _repro(claims=[PaperClaim("LLEP", "faster", "LLEP is faster", "planted")])
    mixed = [True] * 3 + [False] * (N - 3)
    cell = r.claim("LLEP", "faster", False, 0.58, "x", "planted", seeds_hold=mixed)
    assert cell.verdict == "claim-fails"
    assert r.claim("LLEP", "faster", True, 1.2, "x", "p", seeds_hold=mixed).verdict == (
        "seed-dependent"
    )


def test_percent_changes_are_judged_on_the_underlying_ratio():
    r = _repro([PaperValue("EP=8", "reduction", "-70", "%", "planted")], grade_class="prediction")
    # -70% is a ratio of 0.30: 15% of it is 4.5 points, not 10.5
    assert r.compare("EP=8", "reduction", -67.0, "%", quantity="change").verdict == "close"
    assert r.compare("EP=8", "reduction", -60.0, "%", quantity="change").verdict == "deviates"
    assert r.compare("EP=8", "reduction", 1.0, "%", quantity="change").verdict == "deviates"
    # a percent saved: 52.5% saved is a ratio of 0.475, 15% of it is 7.1 points
    r = _repro([PaperValue("RBD", "saved", "52.5", "%", "planted")], grade_class="prediction")
    assert r.compare("RBD", "saved", 46.0, "%", quantity="reduction").verdict == "close"
    assert r.compare("RBD", "saved", 45.0, "%", quantity="reduction").verdict == "deviates"
    assert r.compare("RBD", "saved", 45.0, "%").verdict == "close"  # a share: 15% of 52.5


def test_a_balancer_that_moves_nothing_is_not_evidence():
    before = [1000.0 + 10 * i for i in range(N)]
    r = _repro(
        [PaperValue("4/4", "FasterMoE", "1,010", "tokens", "planted")], grade_class="sampled"
    )
    cell = r.compare("4/4", "FasterMoE", None, "tokens", grade_class="sampled", seeds=before,
                     without=before)  # fmt: skip
    assert cell.verdict == "not-evidence"
    counts = grading.agreement([cell])
    assert counts["agree"] == 0 and counts["compared"] == 0 and counts["not_evidence"] == 1
    moved = [b * 0.99 for b in before]  # the same numbers, but the balancer acted
    assert r.compare("4/4", "FasterMoE", None, "tokens", grade_class="sampled", seeds=moved,
                     without=before).verdict in grading.AGREE  # fmt: skip
    # one value: the reduction of a method that does nothing is the baseline's 0
    r2 = _repro([PaperValue("4/4", "cut", "0.3", "%", "planted")], grade_class="prediction")
    assert r2.compare("4/4", "cut", 0.0, "%", without=0.0).verdict == "deviates"
    r3 = _repro([PaperValue("4/4", "cut", "0", "%", "planted")], grade_class="prediction")
    assert r3.compare("4/4", "cut", 0.0, "%", without=0.0).verdict == "not-evidence"


def test_a_reused_number_is_not_evidence_on_every_cell():
    values = [40.0 + i for i in range(N)]
    pvs = [PaperValue(p, "pipe=2", "44", "%", "planted") for p in ("Dispatch", "Combine")]

    def compute(repro, params):
        return Result(
            cells=[
                repro.compare(p, "pipe=2", None, "%", grade_class="sampled", seeds=list(values))
                for p in ("Dispatch", "Combine")
            ]
        )

    cells = _repro(pvs, compute=compute, grade_class="sampled").run().cells
    assert cells[0].verdict in grading.AGREE + ("seed-dependent",)
    assert cells[1].verdict == "not-evidence" and "Dispatch / pipe=2" in cells[1].note


def test_a_claim_that_holds_by_construction_is_echo():
    r = _repro(claims=[PaperClaim("Dispatch", "pipe=1", "negligible overhead", "planted")])
    rows = [random.Random(s).randint(1, 100) for s in range(16)]

    def extra_pct(shadowed):  # shadowing only removes rows: the extra can never be positive
        kept = sum(x for i, x in enumerate(rows) if i not in shadowed)
        return 100.0 * (kept - sum(rows)) / sum(rows)

    perturbed = [set(random.Random(s).sample(range(16), s % 16)) for s in range(20)]
    reading = grading.read_claim("<1%")
    cell = r.claim(
        "Dispatch", "pipe=1", None, extra_pct({1}), "%", "planted", reading="<1%",
        counterfactual=(lambda s: reading.holds(extra_pct(s)), perturbed, "the shadow set"),
    )  # fmt: skip
    assert cell.verdict == "echo"
    # a claim the same perturbations can break stays a claim
    rows_up = lambda s: 100.0 * len(s) / 16  # noqa: E731  (adds rows)
    can = r.claim(
        "Dispatch", "pipe=1", None, 0.5, "%", "planted", reading="<1%",
        counterfactual=(lambda s: reading.holds(rows_up(s)), perturbed, "the shadow set"),
    )  # fmt: skip
    assert can.verdict == "claim-holds"


def test_a_per_cell_unit_switch_is_refused():
    gib = 2.0**30 / 1e9
    pvs = [
        PaperValue("Switch-Base", "GB", "7.00", "GB", "planted"),  # printed in GB
        PaperValue("Switch-Large", "GB", "26.08", "GB", "planted"),  # printed in GiB
    ]
    r = _repro(pvs, grade_class="exact")
    ours = {"Switch-Base": 7.0, "Switch-Large": 28.0}
    cells = {(k, "GB"): r.compare(k, "GB", v, "GB") for k, v in ours.items()}
    assert [c.verdict for c in cells.values()] == ["match", "deviates"]
    recount = {key: c.ours / gib for key, c in cells.items()}  # GiB applied to the whole table
    judged = r.try_convention(cells, recount, "unit-convention", "GiB", "in GiB")
    assert not judged.accepted and judged.broken == (("Switch-Base", "GB"),)
    assert cells[("Switch-Large", "GB")].verdict == "deviates"
    # applied to the one cell it fits only: fitted, cannot be contradicted, refused too
    cells = {(k, "GB"): r.compare(k, "GB", v, "GB") for k, v in ours.items()}
    one = {("Switch-Large", "GB"): 28.0 / gib}
    assert not r.try_convention(cells, one, "unit-convention", "GiB", "in GiB").accepted
    assert cells[("Switch-Large", "GB")].verdict == "deviates"


def test_a_convention_that_holds_on_the_whole_table_explains():
    gib = 2.0**30 / 1e9
    pvs = [PaperValue(k, "GB", p, "GB", "planted") for k, p in (("a", "6.52"), ("b", "26.08"))]
    r = _repro(pvs, grade_class="exact")
    cells = {(k, "GB"): r.compare(k, "GB", v, "GB") for k, v in (("a", 7.0), ("b", 28.0))}
    recount = {key: c.ours / gib for key, c in cells.items()}
    assert r.try_convention(cells, recount, "unit-convention", "GiB", "in GiB").accepted
    assert all(c.verdict == "explained" for c in cells.values())


def test_a_recomputation_inside_the_precision_by_a_hair_is_reported():
    pvs = [PaperValue("x", "params", "545", "B", "planted")]

    def compute(repro, params):
        cell = repro.compare("x", "params", 560.0, "B")
        cell.explain("counting-convention", "routers left out", 545.47, "routers")
        return Result(cells=[cell])

    (cell,) = _repro(pvs, compute=compute, grade_class="exact").run().cells
    assert cell.verdict == "explained"
    assert cell.counterfactual["margin_units"] == pytest.approx(0.03)
    assert "less than 0.1" in cell.note


def test_predictions_validate_does_not_score_are_counted_apart():
    pvs = [PaperValue("r", "t", "10", "ms", "planted")]

    def compute(repro, params):
        return Result(cells=[repro.compare("r", "t", 10.2, "ms")])

    unscored = _repro(pvs, compute=compute, grade_class="prediction").run({}).cells[0]
    assert unscored.grade_class == grading.UNSCORED and unscored.verdict == "match"
    counts = grading.agreement([unscored])
    assert counts["compared"] == 0 and counts["unscored"] == counts["unscored_agree"] == 1
    scored = _repro(
        pvs, compute=compute, grade_class="prediction", predictor="step-time", platform="dgx-a100"
    )
    assert scored.run({}).cells[0].grade_class == "prediction"
