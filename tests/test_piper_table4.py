import pytest

from moe_repro.reproductions import all_reproductions


@pytest.fixture(scope="module")
def cells():
    result = all_reproductions()["piper-table4"].run()
    return {(c.row, c.column): c for c in result.cells}


def test_every_model_has_size_and_latency_with_units(cells):
    rows = {r for r, _ in cells}
    assert rows == {"Switch-Base", "Mixtral 8x7B", "Mixtral 8x22B", "Grok-1", "GLaM (1.2T)",
                    "DeepSeek-V2", "DeepSeek-V3"}
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


def test_rows_printed_in_gib_are_flagged_as_a_unit_mix(cells):
    # 48 * 4096 * 14336 B = 2.625 GiB, printed as 2.63 under a "GB" header
    c = cells[("Mixtral 8x7B", "Send Size / GPU")]
    assert c.verdict == "explained" and c.cause == "unit-convention"
    assert "GiB" in c.note and "mixes units" in c.note
    # 52.6 = printed 2.63 / 50: the latency inherits the rounded size
    assert "printed size" in cells[("Mixtral 8x7B", "Latency")].note


def test_glam_follows_from_neither_unit(cells):
    c = cells[("GLaM (1.2T)", "Send Size / GPU")]
    assert c.verdict == "deviates" and "neither" in c.note


def test_parameters_change_the_result():
    r = all_reproductions()["piper-table4"].run({"gpus": 16})
    c = {(x.row, x.column): x for x in r.cells}[("Switch-Base", "Send Size / GPU")]
    assert c.ours == pytest.approx(1.207959552 / 2)
    assert c.verdict == "deviates"
