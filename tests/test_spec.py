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
    assert verdict_for(pv("100"), 104.0, Tolerance(rel=0.05)) == "match"
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
    assert summarize(cells) == {"match": 1, "deviates": 1, "no-paper-value": 1, "not-reproduced": 1}
    assert status_of(cells) == "some-deviate"
    assert status_of(cells[:1]) == "all-match"
    assert status_of(cells[2:]) == "partly-reproduced"
    assert status_of(cells[3:]) == "not-reproducible-here"
    assert status_of(cells[2:3]) == "no-paper-values"


def test_unknown_parameter_is_rejected():
    with pytest.raises(ValueError, match="unknown parameter"):
        _repro(lambda r, p: Result(cells=[])).run({"nope": 2})
