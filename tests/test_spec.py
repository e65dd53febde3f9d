import pytest

from moe_repro.reproductions.spec import (
    PaperClaim,
    PaperValue,
    Reproduction,
    Result,
    agreement_of,
    grade_of,
    summarize,
)


def pv(printed, unit="GB"):
    return PaperValue("r", "c", printed, unit, "Table X")


def test_printed_precision_interval():
    assert pv("1.21").half_unit == pytest.approx(0.005)
    assert pv("2,057.6").value == 2057.6 and pv("2,057.6").half_unit == pytest.approx(0.05)
    assert pv("420").half_unit == pytest.approx(0.5)


@pytest.mark.parametrize(
    "ours,expected",
    [
        (1.2149, "match"),
        (1.2051, "match"),
        (1.2151, "deviates"),
        (1.2049, "deviates"),
        (None, "not-reproduced"),
    ],
)
def test_exact_grade_at_the_rounding_boundary(ours, expected):
    assert grade_of(pv("1.21"), ours, "exact") == expected


def test_no_paper_value_and_the_prediction_rule():
    assert grade_of(None, 3.0, "exact") == "no-paper-value"
    assert grade_of(pv("100"), 100.4, "prediction") == "match"  # printed precision
    assert grade_of(pv("100"), 114.0, "prediction") == "close"  # the one prediction tolerance
    assert grade_of(pv("100"), 116.0, "prediction") == "deviates"
    assert grade_of(pv("100"), 104.0, "exact") == "deviates"  # exact numbers have no slack
    assert grade_of(pv("100"), 50.0, "other-hardware") == "not-comparable"


def _repro(compute, **kw):
    return Reproduction(
        id="t-x",
        paper_values=[
            PaperValue("a", "size", "2.00", "GB", "Table X"),
            PaperValue("b", "size", "5.0", "GB", "Table X"),
        ],
        paper_claims=[
            PaperClaim("c", "speedup", "2-3.6x", "Sec. 7"),
            PaperClaim("c", "below 16 nodes", "comparable", "Sec. 7"),
        ],
        compute=compute,
        defaults={"k": 1},
        **kw,
    )


def test_compare_builds_cells_with_a_deliberately_deviating_one():
    def compute(repro, params):
        return Result(
            cells=[
                repro.compare("a", "size", 2.004, "GB"),
                repro.compare("b", "size", 5.5, "GB", note="known cause"),
                repro.compare("c", "size", 1.0, "GB"),
                repro.compare("a", "time", None, "ms", note="needs a GPU"),
            ]
        )

    cells = _repro(compute).run().cells
    assert [c.verdict for c in cells] == ["match", "deviates", "no-paper-value", "not-reproduced"]
    assert cells[1].deviation == pytest.approx(0.1) and cells[1].note == "known cause"
    assert cells[0].paper_printed == "2.00" and cells[0].paper_source == "Table X"
    assert cells[0].grade_class == "exact"
    counts = summarize(cells)
    assert {k: v for k, v in counts.items() if v} == {
        "match": 1,
        "deviates": 1,
        "no-paper-value": 1,
        "not-reproduced": 1,
    }
    assert agreement_of(cells) == "1 of 2 compared cells agree, 1 deviate"
    assert agreement_of(cells[2:]) == "nothing compared"


def test_unknown_parameter_and_unknown_class_are_rejected():
    with pytest.raises(ValueError, match="unknown parameter"):
        _repro(lambda r, p: Result(cells=[])).run({"nope": 2})
    with pytest.raises(ValueError, match="grade class"):
        _repro(
            lambda r, p: Result(cells=[r.compare("a", "size", 2.0, "GB", grade_class="loose")])
        ).run()


def test_percent_cells_deviate_in_points_and_negative_cells_keep_their_sign():
    def compute(repro, params):
        return Result(
            cells=[repro.compare("p", "share", 23.0, "%"), repro.compare("n", "delta", -0.9, "x")]
        )

    repro = Reproduction(
        id="t-x",
        paper_values=[
            PaperValue("p", "share", "20", "%", "Fig. 1"),
            PaperValue("n", "delta", "-1.0", "x", "Fig. 1"),
        ],
        compute=compute,
    )
    share, delta = repro.run().cells
    assert share.deviation == pytest.approx(3.0) and share.deviation_unit == "pp"
    assert (
        delta.deviation == pytest.approx(0.1) and delta.deviation_unit == "rel"
    )  # -0.9 is above -1.0


def test_explained_needs_a_counterfactual_that_agrees():
    def compute(repro, params):
        # 2.15 "GB" is 2.00 GiB: recomputed in GiB it matches -> explained
        gib = repro.compare("a", "size", 2.15, "GB").explain(
            "unit-convention",
            "the paper divides by 2^30",
            counterfactual=2.15 / 1.0737,
            removed="GiB instead of GB",
        )
        # a hypothesis with no recomputation stays deviates
        guess = repro.compare("a", "size", 2.5, "GB").explain(
            "unstated-input", "maybe another batch", counterfactual=None, removed="batch 2"
        )
        # a recomputation that still misses stays deviates, and says so
        miss = repro.compare("b", "size", 6.0, "GB").explain(
            "counting-convention", "embeddings counted", counterfactual=5.6, removed="no embeddings"
        )
        blamed = repro.compare("b", "size", 7.0, "GB").blame("planner", "our stage split")
        return Result(cells=[gib, guess, miss, blamed])

    gib, guess, miss, blamed = _repro(compute).run().cells
    assert gib.verdict == "explained" and gib.cause == "unit-convention"
    assert (
        gib.counterfactual["grade"] == "match"
        and gib.counterfactual["removed"] == "GiB instead of GB"
    )
    assert guess.verdict == "deviates" and "not recomputed" in guess.note
    assert miss.verdict == "deviates" and miss.counterfactual["grade"] == "deviates"
    assert "still deviates" in miss.note
    assert blamed.verdict == "deviates" and blamed.fault == "planner"
    with pytest.raises(ValueError, match="cause must be one of"):
        gib.explain("modelling-assumption", "our model", counterfactual=2.0, removed="x")


def test_sampled_cells_hold_over_seeds_or_are_seed_dependent():
    def compute(repro, params):
        steady = repro.compare(
            "b",
            "size",
            None,
            "GB",
            grade_class="sampled",
            seeds=[5.3, 5.4, 5.6, 5.2, 5.5, 5.3, 5.4, 5.6, 5.2],
        )  # all within 15%
        flips = repro.compare(
            "b",
            "size",
            None,
            "GB",
            grade_class="sampled",
            seeds=[5.3, 6.5, 5.6, 5.2, 5.5, 5.3, 5.4, 5.6, 5.2],
        )  # one seed 30% off
        return Result(cells=[steady, flips])

    steady, flips = _repro(compute).run().cells
    assert steady.verdict == "close" and steady.ours == pytest.approx(5.4)
    assert steady.seeds["agree"] == 1.0 and steady.seeds["range"] == [5.2, 5.6]
    assert flips.verdict == "seed-dependent" and flips.seeds["agree"] == pytest.approx(8 / 9)
    with pytest.raises(ValueError, match="at least 9 seeds"):
        _repro(
            lambda r, p: Result(
                cells=[r.compare("b", "size", None, "GB", grade_class="sampled", seeds=[5.0, 5.1])]
            )
        ).run()
    assert agreement_of([steady, flips]) == "1 of 2 compared cells agree, 1 seed-dependent"


def test_claims_read_by_the_policy_echo_and_derived_cells():
    def compute(repro, params):
        low = repro.claim("c", "speedup", None, 1.84, "x", note="best speedup", reading="2-3.6x")
        ok = repro.claim("c", "speedup", None, 1.96, "x", note="best speedup", reading="2-3.6x")
        echo = repro.claim("c", "below 16 nodes", True, 1.0, "x", note="our formula", echo=True)
        derived = repro.compare("a", "size", 2.5, "GB", derived_from="b / size")
        return Result(cells=[low, ok, echo, derived])

    low, ok, echo, derived = _repro(compute).run().cells
    assert low.verdict == "claim-fails" and ok.verdict == "claim-holds"
    assert low.reading == "'2-3.6x' read as 1.95 to 3.65"
    assert echo.verdict == "echo"
    assert derived.verdict == "deviates"
    # the derived cell is shown, not counted; the echo is not evidence
    assert agreement_of([low, ok, echo, derived]) == "1 of 2 compared cells agree, 1 deviate"
    with pytest.raises(ValueError, match="no paper claim"):
        _repro(lambda r, p: Result(cells=[r.claim("zz", "x", True, 1.0, "x", note="n")])).run()


def test_one_cell_type_checked_again_as_stored():
    """The cell a reproduction builds is the record's cell; one changed after it was built (as
    explain() changes it) is checked again when a record takes it: a grade of agreement on NaN
    is refused there."""
    import math

    import pydantic

    from moe_repro.records.record import Cell as StoredCell
    from moe_repro.reproductions import spec as spec_module

    assert spec_module.Cell is StoredCell
    cell = spec_module.Cell(row="r", column="c", paper=1.0, ours=2.0, unit="x", verdict="deviates")
    cell.ours, cell.verdict = math.nan, "match"
    with pytest.raises(pydantic.ValidationError, match="graded match but ours is nan"):
        StoredCell.model_validate(cell)
