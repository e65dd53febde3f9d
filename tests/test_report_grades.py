"""What a reader sees of the grades: the index counts each grade per paper and explains every
letter, grade and status; a reproduction page shows each cell's grade with its cause, percent
deviations in percentage points, the paper in full with a citation, and the command as run."""

from __future__ import annotations

from markupsafe import escape
import re

import pytest

from moe_repro.cli import main
from moe_repro.records.record import GRADE_MEANING, STATUS_MEANING
from moe_repro.reports.html import deviation


def test_deviation_is_points_for_percent_cells_and_relative_otherwise():
    assert deviation({"deviation": 3.04, "deviation_unit": "pp"}) == "+3.0 pp"
    assert deviation({"deviation": -0.0517, "deviation_unit": "rel"}) == "-5.2%"
    assert deviation({"deviation": 0.25}) == "+25.0%"      # records stored before the unit existed
    assert deviation({"deviation": None}) == ""


def _console(*args):
    """The console entry point, as a user runs it (it records the command line that ran)."""
    with pytest.raises(SystemExit) as done:
        main(list(args))
    assert done.value.code == 0


def test_index_and_page_show_grades_causes_and_citation(results_dir, tmp_path):
    _console("run", "piper-table4", "--quiet", "--param", "gpus=8")
    _console("site", "build", "--out", str(tmp_path / "site"))
    index = (tmp_path / "site" / "index.html").read_text()
    # every grade and status is explained, and A/M/R/S are
    for words in (*GRADE_MEANING.values(), *STATUS_MEANING.values()):
        assert str(escape(words)) in index
    for letter in ("A &middot; analytic", "M &middot; Monte Carlo", "R &middot; real measurement",
                   "S &middot; simulated"):
        assert letter in index
    # the legend is closed, so its one-line summary itself says what each letter means
    summary = index[index.index("<summary>How to read this"):index.index("</summary>")]
    assert all(f"<b>{l}</b> {w}" in summary for l, w in
               (("A", "analytic"), ("M", "Monte Carlo"), ("R", "real measurement"), ("S", "simulated")))
    assert 'title="outside tolerance, cause not found"' in index  # grade chips say what they mean
    # Piper's counts per grade: Table IV's GiB rows are explained, the rest match or deviate
    piper = index[index.index("Piper: Efficient Large-Scale"):index.index("X-MoE")]
    counts = dict((g, int(n)) for n, g in re.findall(r'<span class="grade [\w-]+"[^>]*>(\d+) ([\w-]+)</span>', piper))
    assert counts["explained"] == 8 and counts["match"] == 2 and counts["deviates"] == 4
    assert "partly-reproduced" not in piper.split("<tbody>")[1].split("</tbody>")[0]
    page = (tmp_path / "site" / "repro" / "piper-table4.html").read_text()
    assert page.count("<br><small>unit-convention</small>") == 8   # each explained cell names its cause
    assert "@misc{" in page or "@article{" in page           # the citation block
    assert "Sajal Dash" in page                                 # the paper's authors
    assert "repro run piper-table4 --quiet --param gpus=8" in page   # the command as it was run


def test_paper_grid_lays_cells_out_in_the_papers_rows_and_columns():
    from moe_repro.reports.html import paper_grid

    cells = [{"row": r, "column": c, "verdict": "match", "paper_printed": f"{r}{c}", "ours": 1.0}
             for r in ("A", "B") for c in ("x", "y", "z") if (r, c) != ("B", "y")]
    grid = paper_grid({"cells": cells})
    assert grid["columns"] == ["x", "y", "z"]
    assert [row["label"] for row in grid["rows"]] == ["A", "B"]
    assert [c and c["paper_printed"] for c in grid["rows"][1]["cells"]] == ["Bx", None, "Bz"]
    # one column, or too many to scan, is left to the per-cell table
    assert paper_grid({"cells": [{"row": r, "column": "x"} for r in "ABC"]}) is None
    assert paper_grid({"cells": [{"row": "A", "column": str(i)} for i in range(9)] +
                       [{"row": "B", "column": "0"}]}) is None


def test_paper_grid_follows_a_reproductions_own_layout_with_column_groups():
    from moe_repro.reports.html import paper_grid

    cells = [{"row": r, "column": f"{m} {ph}", "verdict": "not-reproduced", "paper_printed": f"{r}{m}{ph}",
              "ours": None} for r in ("1", "2") for m in ("a", "b") for ph in ("fwd", "bwd")]
    cells.append({"row": "all", "column": "claim", "verdict": "not-reproduced"})
    layout = {"corner": "PP/EP", "rows": ["2", "1"],
              "groups": [{"label": m, "columns": [{"label": ph, "column": f"{m} {ph}"} for ph in ("fwd", "bwd")]}
                         for m in ("b", "a")]}
    grid = paper_grid({"cells": cells, "extra": {"paper_layout": layout}})
    assert grid["corner"] == "PP/EP"
    assert grid["groups"] == [{"label": "b", "span": 2}, {"label": "a", "span": 2}]
    assert grid["columns"] == ["fwd", "bwd", "fwd", "bwd"]
    assert [row["label"] for row in grid["rows"]] == ["2", "1"]
    assert [c["paper_printed"] for c in grid["rows"][0]["cells"]] == ["2bfwd", "2bbwd", "2afwd", "2abwd"]
    assert grid["outside"] == 1  # the claim is not in the paper's table
    # a layout is shown however many columns it has (the default grid stops at 8)
    wide = {"corner": "", "rows": ["1"], "groups": [{"label": "g", "columns": [
        {"label": str(i), "column": str(i)} for i in range(12)]}]}
    assert len(paper_grid({"cells": [{"row": "1", "column": str(i)} for i in range(12)],
                           "extra": {"paper_layout": wide}})["columns"]) == 12


def test_paper_grid_can_transpose_our_rows_into_the_papers_columns():
    from moe_repro.reports.html import paper_grid

    # ours: one row per model, one column per component; the paper: one row per component
    cells = [{"row": model, "column": comp, "ours": f"{model}/{comp}"}
             for model in ("small", "big") for comp in ("weights", "logits", "other")]
    layout = {"corner": "component", "groups": [{"label": "ours", "columns": [{"label": "small"},
                                                                              {"label": "big"}]}],
              "rows": [{"label": "Logits O(NV/P)", "keys": [["small", "logits"], ["big", "logits"]]},
                       {"label": "Weights", "keys": [["small", "weights"], None]}]}
    grid = paper_grid({"cells": cells, "extra": {"paper_layout": layout}})
    assert grid["columns"] == ["small", "big"]
    assert [[c and c["ours"] for c in row["cells"]] for row in grid["rows"]] == [
        ["small/logits", "big/logits"], ["small/weights", None]]
    assert grid["outside"] == 3  # big/weights and both "other" cells


def test_mop_table1_page_has_the_papers_table():
    from moe_repro.reports.html import paper_grid
    from moe_repro.reproductions import all_reproductions
    from moe_repro.reproductions.spec import record_of

    repro = all_reproductions()["mop-table1"]
    grid = paper_grid(record_of(repro, repro.run(), {}, ["repro"]).model_dump())
    # MoP Table 1's seven components, in its order, one column per model size
    assert [row["label"].split(" · ")[0] for row in grid["rows"]] == [
        "Dense weights Θ_dns", "Attention activations", "Expert weights Θ_exp", "MoE activations",
        "Vocabulary weights Θ_voc", "Vocabulary logits", "Optimizer state {m, v, master}"]
    assert grid["columns"] == ["120B (16 GPUs)", "600B (64 GPUs)", "1T (96 GPUs)"]
    assert all(c is not None for row in grid["rows"] for c in row["cells"])


def test_feplb_table2_page_shows_table_2_as_printed(monkeypatch):
    from types import SimpleNamespace

    from moe_repro.reports.html import render_reproduction
    from moe_repro.reproductions import _feplb_traces as ft
    from moe_repro.reproductions import all_reproductions
    from moe_repro.reproductions.spec import record_of

    # the layout does not depend on the modelled makespans: skip the traces (minutes on CPU)
    monkeypatch.setattr(ft, "evaluate", lambda params, ep, **kw: {
        m: SimpleNamespace(gemm_makespan_s=1e-3) for m in ("Before LB", "FasterMoE", "FEPLB")})
    repro = all_reproductions()["feplb-table2"]
    payload = record_of(repro, repro.run(), {}, ["repro", "run", "feplb-table2"]).model_dump()
    page = render_reproduction(payload)
    grid = page[page.index("In the paper's layout"):page.index("Paper vs ours")]
    assert '<th rowspan="2">PP/EP</th>' in grid
    for method in ("Before LB", "FasterMoE", "Triton Dist.", "Tutel", "FEPLB"):
        assert f'<th colspan="2">{method}</th>' in grid
    assert grid.count("<th>fwd</th><th>bwd</th>") == 5
    # Table 2's first row, forward / backward per method, in the paper's order
    shown = r'title="(?:not-reproduced|not-comparable)">([\d.]+)<br>'
    assert [float(v) for v in re.findall(shown, grid)[:10]] == [
        8.2, 14.9, 7.9, 14.0, 13.1, 22.8, 8.0, 17.1, 7.9, 14.4]
    assert "The 8 cells outside the paper's table" in grid   # 6 savings, -13%, the claim

