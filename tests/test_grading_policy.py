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
    assert grading.grade_value(100, 0.5, 115.4, "prediction") == "close"
    assert grading.grade_value(100, 0.5, 115.6, "prediction") == "deviates"
    assert grading.grade_value(100, 0.5, 101, "exact") == "deviates"
    assert grading.grade_value(100, 0.5, 1, "other-hardware") == "not-comparable"
    assert grading.comparable(100, 114) and not grading.comparable(100, 120)


def test_consensus_over_seeds():
    assert grading.consensus(["match"] * 5) == ("match", 1.0)
    assert grading.consensus(["match", "close", "close", "match", "close"]) == ("close", 1.0)
    assert grading.consensus(["close"] * 4 + ["deviates"]) == ("seed-dependent", 0.8)
    assert grading.consensus(["deviates"] * 5) == ("deviates", 0.0)
    with pytest.raises(grading.PolicyError):
        grading.consensus(["match"] * 4)


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
        )
    ]
    cells.append({"verdict": "deviates", "derived_from": "x / y"})
    counts = grading.agreement(cells)
    assert counts == {"compared": 7, "agree": 3, "explained": 1, "deviate": 2, "seed_dependent": 1}
    assert grading.agreement_line(counts) == (
        "3 of 7 compared cells agree, 1 explained, 2 deviate, 1 seed-dependent"
    )
