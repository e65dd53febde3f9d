"""The one grading policy (records/grading.py), tested from its stated rules."""

import math

import pytest

from moe_repro.records import grading


@pytest.mark.parametrize(
    "printed,half", [("2", 0.5), ("1.55", 0.005), ("2,057.6", 0.05), ("~40", 0.5)]
)
def test_half_unit_of_the_printed_digit(printed, half):
    assert grading.half_unit(printed) == pytest.approx(half)


@pytest.mark.parametrize(
    "text,lo,hi,inside,outside",
    [
        ("2x", 1.5, 2.5, [1.5, 2.23, 2.5], [1.49, 2.51]),
        ("2-3.6x", 1.95, 3.65, [1.95, 3.0], [1.84, 3.7]),  # one precision for the whole range
        ("1-3 pp", 0.5, 3.5, [0.5, 3.5], [0.4, 3.6]),
        ("1.55x", 1.545, 1.555, [1.55], [1.56]),
    ],
)
def test_numbers_in_words_read_at_their_printed_precision(text, lo, hi, inside, outside):
    r = grading.read_claim(text)
    assert (r.low, r.high) == pytest.approx((lo, hi))
    assert all(r.holds(v) for v in inside) and not any(r.holds(v) for v in outside)


def test_bounds_strict_as_stated_inclusive_with_precision():
    below = grading.read_claim("<1%")
    assert below.holds(0.99) and not below.holds(1.0) and math.isinf(below.low)
    up_to = grading.read_claim("up to 1.55x")
    assert up_to.holds(1.554) and not up_to.holds(1.556)
    over = grading.read_claim("over 2x")
    assert over.holds(2.01) and not over.holds(2.0)
    with pytest.raises(grading.PolicyError):
        grading.read_claim("much faster")


def test_one_prediction_tolerance_for_every_class_that_has_one():
    # 15% of the value, as stated: the printed half unit is not added to it
    assert grading.grade_value(100, 0.5, 114.9, "prediction") == "close"
    assert grading.grade_value(100, 0.5, 115.1, "prediction") == "deviates"
    assert grading.grade_value(10, 0.5, 11.6, "prediction") == "deviates"  # 16%: not 15% + 0.5
    assert grading.grade_value(100, 0.5, 101, "exact") == "deviates"
    assert grading.grade_value(100, 0.5, 1, "other-hardware") == "not-comparable"
    assert grading.comparable(100, 114) and not grading.comparable(100, 120)


def test_consensus_over_seeds():
    assert grading.MIN_SEEDS >= 9
    n = grading.MIN_SEEDS
    assert grading.consensus(["match"] * n) == ("match", 1.0)
    assert grading.consensus(["match", "close"] * (n // 2) + ["close"] * (n % 2)) == ("close", 1.0)
    assert grading.consensus(["close"] * (n - 1) + ["deviates"]) == (
        "seed-dependent",
        pytest.approx((n - 1) / n),
    )
    assert grading.consensus(["deviates"] * n) == ("deviates", 0.0)
    with pytest.raises(grading.PolicyError):
        grading.consensus(["match"] * (n - 1))


def test_agreement_counts_and_line():
    cells = [
        {"verdict": v}
        for v in (
            "match",
            "close",
            "claim-holds",
            "deviates",
            "claim-fails",
            "explained",
            "seed-dependent",
            "echo",
            "no-paper-value",
            "not-evidence",
        )
    ]
    cells.append({"verdict": "deviates", "derived_from": "x / y"})
    cells += [
        {"verdict": "close", "grade_class": "prediction (unscored)"},
        {"verdict": "deviates", "grade_class": "prediction (unscored)"},
    ]
    counts = grading.agreement(cells)
    assert counts == {
        "compared": 7,
        "agree": 3,
        "explained": 1,
        "deviate": 2,
        "seed_dependent": 1,
        "not_evidence": 1,
        "unscored": 2,
        "unscored_agree": 1,
    }
    assert grading.agreement_line(counts) == (
        "3 of 7 compared cells agree, 1 explained, 2 deviate, 1 seed-dependent; "
        "1 not evidence; 2 prediction (unscored) (1 agree, counted apart)"
    )
