import pytest

from moe_repro.reproductions import all_reproductions


@pytest.fixture(scope="module")
def cells():
    result = all_reproductions()["piper-table4"].run()
    return {(c.row, c.column): c for c in result.cells}


def test_every_model_has_size_and_latency_with_units(cells):
    rows = {r for r, _ in cells}
    assert rows == {
        "Switch-Base",
        "Mixtral 8x7B",
        "Mixtral 8x22B",
        "Grok-1",
        "GLaM (1.2T)",
        "DeepSeek-V2",
        "DeepSeek-V3",
    }
    for (row, col), c in cells.items():
        assert c.unit == ("GB" if col == "Send Size / GPU" else "ms")
        assert c.paper_source == "Piper Table IV"


def test_values_follow_the_formula_in_decimal_gb(cells):
    # DeepSeek-V3 by hand: 48 * 256 * 7168 * 2048 / 8 = 22,548,578,304 B
    assert cells[("DeepSeek-V3", "Send Size / GPU")].ours == pytest.approx(22.548578304)
    assert cells[("DeepSeek-V3", "Latency")].ours == pytest.approx(22.548578304 / 50 * 1e3)


def test_switch_base_matches_and_notes_its_two_matrix_ffn(cells):
    c = cells[("Switch-Base", "Send Size / GPU")]
    assert c.verdict == "match"
    assert "2 matrices" in c.note


def test_rows_printed_in_gib_are_explained_by_their_recomputation_in_gib(cells):
    # 48 * 8 * 4096 * 14336 / 8 B = 2.625 GiB, printed as 2.63 under a "GB" header
    c = cells[("Mixtral 8x7B", "Send Size / GPU")]
    assert c.verdict == "explained" and c.cause == "unit-convention" and "mixes units" in c.note
    assert c.counterfactual["ours"] == pytest.approx(48 * 8 * 4096 * 14336 / 8 / 2**30)
    assert c.counterfactual["grade"] == "match" and "GiB" in c.counterfactual["removed"]
    # in GiB its latency is 2.625 / 50 s = 52.50 ms, not the printed 52.6 (= printed 2.63 / 50): the
    # recomputation does not agree at the printed precision, so the cell stays a deviation
    lat = cells[("Mixtral 8x7B", "Latency")]
    assert lat.verdict == "deviates" and lat.counterfactual["ours"] == pytest.approx(52.5)
    assert "printed size" in lat.note
    # DeepSeek-V3: 21 GiB exactly, 420 ms
    assert cells[("DeepSeek-V3", "Latency")].counterfactual["ours"] == pytest.approx(420.0)
    assert cells[("DeepSeek-V3", "Latency")].verdict == "explained"


def test_every_explained_cell_carries_an_agreeing_recomputation(cells):
    for c in cells.values():
        if c.verdict == "explained":
            assert c.counterfactual and c.counterfactual["grade"] == "match", (c.row, c.column)
        assert len((c.note or "").split()) <= 60, (c.row, c.column)


def test_glam_follows_from_neither_unit(cells):
    c = cells[("GLaM (1.2T)", "Send Size / GPU")]
    # 48 * 64 * 8192 * 32768 / 8 B = 103.08 GB = 96 GiB; the table prints 102.88
    assert c.verdict == "deviates" and c.counterfactual["ours"] == pytest.approx(96.0)
    assert c.counterfactual["grade"] == "deviates" and "still deviates" in c.note


def test_parameters_change_the_result():
    r = all_reproductions()["piper-table4"].run({"gpus": 16})
    c = {(x.row, x.column): x for x in r.cells}[("Switch-Base", "Send Size / GPU")]
    assert c.ours == pytest.approx(1.207959552 / 2)
    assert c.verdict == "deviates"
