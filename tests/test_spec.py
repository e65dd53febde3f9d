import pytest

from moe_repro.reproductions.spec import (PaperValue, Reproduction, Result, Tolerance, status_of,
                                          summarize, verdict_for)


def pv(printed, unit="GB"):
    return PaperValue("r", "c", printed, unit, "Table X")


def test_printed_precision_interval():
    assert pv("1.21").half_unit == pytest.approx(0.005)
    assert pv("2,057.6").value == 2057.6 and pv("2,057.6").half_unit == pytest.approx(0.05)
    assert pv("420").half_unit == pytest.approx(0.5)


@pytest.mark.parametrize("ours,expected", [(1.2149, "match"), (1.2051, "match"), (1.2151, "deviates"),
                                           (1.2049, "deviates"), (None, "not-reproduced")])
def test_verdict_at_the_rounding_boundary(ours, expected):
    assert verdict_for(pv("1.21"), ours, Tolerance()) == expected


def test_no_paper_value_and_relative_slack():
    assert verdict_for(None, 3.0, Tolerance()) == "no-paper-value"
    assert verdict_for(pv("100"), 100.4, Tolerance(rel=0.05)) == "match"   # printed precision
    assert verdict_for(pv("100"), 104.0, Tolerance(rel=0.05)) == "close"   # the stated slack
    assert verdict_for(pv("100"), 106.0, Tolerance(rel=0.05)) == "deviates"
    assert verdict_for(pv("100"), 100.4, Tolerance(printed=False)) == "deviates"


def _repro(compute):
    return Reproduction(id="t-x",
                        paper_values=[PaperValue("a", "size", "2.00", "GB", "Table X"),
                                      PaperValue("b", "size", "5.0", "GB", "Table X")],
                        compute=compute, defaults={"k": 1})


def test_compare_builds_cells_with_a_deliberately_deviating_one():
    def compute(repro, params):
        return Result(cells=[repro.compare("a", "size", 2.004, "GB"),
                             repro.compare("b", "size", 5.5, "GB", note="known cause"),
                             repro.compare("c", "size", 1.0, "GB"),
                             repro.compare("a", "time", None, "ms", note="needs a GPU")])

    cells = _repro(compute).run().cells
    assert [c.verdict for c in cells] == ["match", "deviates", "no-paper-value", "not-reproduced"]
    assert cells[1].deviation == pytest.approx(0.1) and cells[1].note == "known cause"
    assert cells[0].paper_printed == "2.00" and cells[0].paper_source == "Table X"
    counts = summarize(cells)
    assert {k: v for k, v in counts.items() if v} == {"match": 1, "deviates": 1, "no-paper-value": 1,
                                                      "not-reproduced": 1}
    assert status_of(cells) == "some-deviate"
    assert status_of(cells[:1]) == "reproduced"
    assert status_of([cells[0], cells[3]]) == "partly-reproduced"
    assert status_of(cells[3:]) == "not-reproducible-here"
    # nothing compared: never "partly reproduced", whatever else the cells hold
    assert status_of(cells[2:]) == "not-compared"
    assert status_of(cells[2:3]) == "not-compared"


def test_unknown_parameter_is_rejected():
    with pytest.raises(ValueError, match="unknown parameter"):
        _repro(lambda r, p: Result(cells=[])).run({"nope": 2})


def test_percent_cells_deviate_in_points_and_negative_cells_keep_their_sign():
    def compute(repro, params):
        return Result(cells=[repro.compare("p", "share", 23.0, "%"),
                             repro.compare("n", "delta", -0.9, "x")])

    repro = Reproduction(id="t-x", paper_values=[PaperValue("p", "share", "20", "%", "Fig. 1"),
                                                 PaperValue("n", "delta", "-1.0", "x", "Fig. 1")],
                         compute=compute)
    share, delta = repro.run().cells
    assert share.deviation == pytest.approx(3.0) and share.deviation_unit == "pp"
    assert delta.deviation == pytest.approx(0.1) and delta.deviation_unit == "rel"  # -0.9 is above -1.0


def test_explained_echo_not_comparable_and_claims():
    from moe_repro.reproductions.spec import PaperClaim

    def compute(repro, params):
        gib = repro.compare("a", "size", 2.15, "GB").explain(
            "unit-convention", "the paper divides by 2^30 here: 2.15 GB = 2.00 GiB")
        close = repro.compare("b", "size", 5.2, "GB", tolerance=Tolerance(rel=0.05))
        echo = repro.compare("a", "size", 2.0, "GB", echo=True)
        other = repro.compare("b", "size", 9.0, "GB", not_comparable="ours is % of time, theirs of volume")
        holds = repro.claim("c", "below 16 nodes", True, 1.1, "x", note="max ratio 1.1 <= 1.2")
        fails = repro.claim("c", "below 16 nodes", False, 3.3, "x", note="max ratio 3.3 > 1.2")
        return Result(cells=[gib, close, echo, other, holds, fails])

    repro = Reproduction(id="t-x", compute=compute,
                         paper_values=[PaperValue("a", "size", "2.00", "GB", "Table X"),
                                       PaperValue("b", "size", "5.0", "GB", "Table X")],
                         paper_claims=[PaperClaim("c", "below 16 nodes", "comparable", "Sec. 7")])
    cells = repro.run().cells
    assert [c.verdict for c in cells] == ["explained", "close", "echo", "not-comparable",
                                          "claim-holds", "claim-fails"]
    assert cells[0].cause == "unit-convention" and "2^30" in cells[0].note
    assert cells[1].tolerance == "printed precision (half a unit of the last digit) + 5.0% relative"
    assert cells[4].paper_printed == "comparable" and cells[4].paper_source == "Sec. 7"
    assert status_of(cells[:1]) == "explained-deviations"
    assert status_of(cells[2:4]) == "not-compared"   # an echo and a different quantity: no evidence
    assert status_of(cells[:5]) == "explained-deviations"
    assert status_of(cells) == "some-deviate"        # a failed claim is a deviation
    with pytest.raises(ValueError, match="cause must be one of"):
        cells[1].explain("guess", "a hunch")
    with pytest.raises(ValueError, match="no paper claim"):
        repro.claim("zz", "below 16 nodes", True, 1.0, "x", note="n")
