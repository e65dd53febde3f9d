"""What a reader sees of the grades: the index gives per paper and per reproduction how many
compared cells agree, explain every letter, grade and cause, and states the grading policy; a
reproduction page opens with the paper's claims and our evidence, then its figures, then the
graded cells (ungraded ones behind a toggle), shows what the policy recorded with each cell, the
paper in full with a citation, and the command as run."""

from __future__ import annotations

import json
import re

from markupsafe import escape

import pytest

from moe_repro.cli import main
from moe_repro.records import grading
from moe_repro.records.record import CAUSE_MEANING, GRADE_MEANING
from moe_repro.reports.html import deviation, render_reproduction


def test_deviation_is_points_for_percent_cells_and_relative_otherwise():
    assert deviation({"deviation": 3.04, "deviation_unit": "pp"}) == "+3.0 pp"
    assert deviation({"deviation": -0.0517, "deviation_unit": "rel"}) == "-5.2%"
    assert deviation({"deviation": 0.25}) == "+25.0%"  # records stored before the unit existed
    assert deviation({"deviation": None}) == ""


def _console(*args):
    """The console entry point, as a user runs it (it records the command line that ran)."""
    with pytest.raises(SystemExit) as done:
        main(list(args))
    assert done.value.code == 0


def _compared_counts(cells) -> tuple[int, int, int]:
    """(compared, agree, explained) counted here from the grades, derived cells left out."""
    compared = [
        c
        for c in cells
        if not c.get("derived_from")
        and c["verdict"]
        in (
            "match",
            "close",
            "claim-holds",
            "deviates",
            "claim-fails",
            "explained",
            "seed-dependent",
        )
    ]
    return (
        len(compared),
        sum(c["verdict"] in ("match", "close", "claim-holds") for c in compared),
        sum(c["verdict"] == "explained" for c in compared),
    )


def test_index_and_page_show_counts_policy_causes_and_citation(results_dir, tmp_path):
    _console(
        "run", "piper-table4", "--quiet", "--param", "gpus=8", "--json", str(tmp_path / "t4.json")
    )
    _console("site", "build", "--out", str(tmp_path / "site"))
    index = (tmp_path / "site" / "index.html").read_text()
    # every grade and cause is explained, and A/M/R/S are; no worst-grade status is left
    for words in (*GRADE_MEANING.values(), *CAUSE_MEANING.values()):
        assert str(escape(words)) in index
    assert "status" not in index.lower()
    for letter in (
        "A &middot; analytic",
        "M &middot; Monte Carlo",
        "R &middot; real measurement",
        "S &middot; simulated",
    ):
        assert letter in index
    # the policy is stated: its classes with their rules, the tolerance with its reason, the
    # reading of claims in words
    policy = index[index.index('id="grading-policy"') :]
    for name, rule in grading.GRADE_CLASSES.items():
        assert f"<td>{name}</td><td>{escape(rule)}</td>" in policy
    assert str(escape(grading.PREDICTION_TOLERANCE_REASON)) in policy
    assert "2-3.6x" in policy and "1.95 to 3.65" in policy  # read_claim's own rule, quoted
    # the legend is closed, so its one-line summary itself says what each letter means
    summary = index[index.index("<summary>How to read this") : index.index("</summary>")]
    assert all(
        f"<b>{l}</b> {w}" in summary
        for l, w in (
            ("A", "analytic"),
            ("M", "Monte Carlo"),
            ("R", "real measurement"),
            ("S", "simulated"),
        )
    )
    # counts, per reproduction and per paper, counted here from the run's cells
    cells = json.loads((tmp_path / "t4.json").read_text())["cells"]
    compared, agree, explained = _compared_counts(cells)
    assert compared > 0
    line = f"{agree} of {compared} compared cells agree"
    piper = index[index.index("Piper: Efficient Large-Scale") : index.index("X-MoE")]
    row = piper[piper.index('href="repro/piper-table4.html"') :]
    row = row[: row.index("</tr>")]
    assert line in row and (f"{explained} explained" in row) == bool(explained)
    assert (
        line in piper[: piper.index("<table class=\"listing\">")]
    )  # the paper's line: its only run reproduction
    page = (tmp_path / "site" / "repro" / "piper-table4.html").read_text()
    assert line in page[: page.index('id="answer"')]  # the count is the first thing under the title
    explained_cells = [c for c in cells if c["verdict"] == "explained"]
    assert (
        page.count(f"<br><small>{explained_cells[0]['cause']}</small>") >= 1
        if explained_cells
        else True
    )
    assert "@misc{" in page or "@article{" in page  # the citation block
    assert "Sajal Dash" in page  # the paper's authors
    assert "repro run piper-table4 --quiet --param gpus=8" in page  # the command as it was run


def _cell(row, column, verdict, **kw):
    base = {
        "row": row,
        "column": column,
        "verdict": verdict,
        "paper": None,
        "ours": 1.0,
        "unit": "x",
        "note": None,
        "paper_printed": None,
    }
    return {**base, **kw}


PAYLOAD = {
    "id": "demo-fig1",
    "title": "A demo",
    "paper": "piper",
    "element": "Fig. 1",
    "how": "A",
    "how_words": "analytic",
    "description": "d",
    "params": {},
    "command": "repro run demo-fig1",
    "environment": {"timestamp": "2026-11-25T10:00:00+00:00", "command": "repro run demo-fig1"},
    "assumptions": ["an assumption"],
    "cells": [
        _cell(
            "size",
            "1",
            "match",
            paper=2.0,
            paper_printed="2.0",
            ours=2.01,
            grade_class="exact",
            note="agrees at the printed precision",
        ),
        _cell("size", "2", "no-paper-value", ours=3.0, note="ours only"),
        _cell(
            "speedup",
            "all",
            "claim-fails",
            paper_printed="2-3.6x faster",
            ours=1.7,
            grade_class="claim",
            reading="'2-3.6x' read as 1.95 to 3.65",
            note="ours 1.70x at the smallest model",
        ),
        _cell(
            "time",
            "big",
            "deviates",
            paper=10.0,
            paper_printed="10",
            ours=14.0,
            grade_class="prediction",
            fault="the planner's stage split",
            note="the output head's stage is the slowest",
            detail="A long investigation. " * 30,
        ),
        _cell(
            "bytes",
            "GB",
            "explained",
            paper=4.0,
            paper_printed="4.0",
            ours=3.73,
            grade_class="exact",
            cause="unit-convention",
            note="GiB printed as GB",
            counterfactual={
                "cause": "unit-convention",
                "removed": "GB instead of GiB",
                "ours": 4.0,
                "grade": "match",
            },
        ),
        _cell(
            "load",
            "seed",
            "seed-dependent",
            paper=1.5,
            paper_printed="1.5",
            ours=1.6,
            grade_class="sampled",
            note="flips with the trace",
            seeds={"values": [1.4, 1.5, 1.9, 2.0, 1.6], "range": [1.4, 2.0], "agree": 0.6},
        ),
        _cell(
            "MFU",
            "big",
            "deviates",
            paper=50.0,
            paper_printed="50",
            ours=70.0,
            unit="%",
            grade_class="prediction",
            derived_from="time / big",
            note="TFLOPS / peak",
        ),
        _cell(
            "speedup",
            "one rank",
            "claim-holds",
            paper_printed="2-3.6x faster",
            ours=2.5,
            grade_class="claim",
            derived_from="speedup / all",
            note="against their own code",
        ),
        _cell(
            "echo",
            "all",
            "echo",
            paper_printed="follows from Eq. 3",
            grade_class="claim",
            note="our own formula",
        ),
        _cell("long", "note", "no-paper-value", note=" ".join(["word"] * 90)),
    ],
}


def test_a_page_opens_with_claims_and_evidence_then_figures_then_graded_cells():
    page = render_reproduction(
        PAYLOAD, figures=[{"title": "Fig 1", "png": "f.png", "svg": "f.svg"}]
    )
    answer, figure = page.index('id="answer"'), page.index('src="f.png"')
    graded = page.index('id="graded"')
    assert answer < figure < graded
    top = page[answer:figure]
    # the claim first, with ours, its grade, the reading and the one-line why; then what does not
    # agree; the cells that agree counted in one line
    assert (
        top.index("2-3.6x faster") < top.index("the output head") < top.index("GiB printed as GB")
    )
    assert "claim-fails" in top and "1.7" in top and "read as 1.95 to 3.65" in top
    assert "flips with the trace" in top
    assert "1 other paper value agrees (1 match)" in top
    assert "TFLOPS / peak" not in top  # a derived cell stands behind its source
    assert "against their own code" not in top  # a derived claim too
    assert "follows from Eq. 3" not in top  # an echo claim is no evidence: counted, not listed
    assert "1 claim following from our own formulas (echo)" in top
    # the count line: 6 compared (the derived MFU counted once, at its source), the echo not
    assert "1 of 5 compared cells agree, 1 explained, 2 deviate, 1 seed-dependent" in page
    # graded cells in the open table, ungraded ones behind a toggle
    toggle = page.index('<details class="ungraded"')
    assert graded < toggle
    graded_table = page[graded:toggle]
    assert 'tr class="match"' in graded_table and 'tr class="no-paper-value"' not in graded_table
    assert "ours only" not in graded_table and "our own formula" not in graded_table
    hidden = page[toggle : page.index("</details>", toggle)]
    assert "3 ungraded cells" in hidden and "ours only" in hidden and "our own formula" in hidden


def test_a_cell_shows_what_the_policy_recorded_and_links_its_investigation():
    page = render_reproduction(PAYLOAD)
    table = page[page.index('id="graded"') :]
    assert "class: prediction" in table and "claim in words" in table
    assert "recomputed with GB instead of GiB: 4 x (match)" in table
    assert "5 seeds: 1.4 to 2 x, 60% of seeds agree" in table
    assert "at fault: the planner&#39;s stage split (ours)" in table
    assert "derived from time / big (counted there)" in table
    # the long investigation sits in its own section at the bottom, linked from its cell
    link = re.search(r'<a href="#(detail-\d+)">the investigation', table).group(1)
    section = page[page.index(f'id="{link}"') :]
    assert "A long investigation." in section
    assert page.index(f'id="{link}"') > page.index('id="graded"')
    # a note longer than a line is cut on the page and kept whole in that section
    assert " ".join(["word"] * 90) not in table[: table.index('id="investigations"')]
    assert " ".join(["word"] * 90) in page[page.index('id="investigations"') :]


def test_a_page_without_comparisons_says_so_first():
    payload = {**PAYLOAD, "cells": [_cell("a", "b", "no-paper-value"), _cell("c", "d", "echo")]}
    page = render_reproduction(payload)
    assert "nothing compared" in page[: page.index('id="answer"')]
    top = page[page.index('id="answer"') : page.index('id="graded"')]
    assert "Nothing here is compared with the paper: 1 echo, 1 no-paper-value" in top


def test_paper_grid_lays_cells_out_in_the_papers_rows_and_columns():
    from moe_repro.reports.html import paper_grid

    cells = [
        {"row": r, "column": c, "verdict": "match", "paper_printed": f"{r}{c}", "ours": 1.0}
        for r in ("A", "B")
        for c in ("x", "y", "z")
        if (r, c) != ("B", "y")
    ]
    grid = paper_grid({"cells": cells})
    assert grid["columns"] == ["x", "y", "z"]
    assert [row["label"] for row in grid["rows"]] == ["A", "B"]
    assert [c and c["paper_printed"] for c in grid["rows"][1]["cells"]] == ["Bx", None, "Bz"]
    # one column, or too many to scan, is left to the per-cell table
    assert paper_grid({"cells": [{"row": r, "column": "x"} for r in "ABC"]}) is None
    assert (
        paper_grid(
            {
                "cells": [{"row": "A", "column": str(i)} for i in range(9)]
                + [{"row": "B", "column": "0"}]
            }
        )
        is None
    )


def test_paper_grid_follows_a_reproductions_own_layout_with_column_groups():
    from moe_repro.reports.html import paper_grid

    cells = [
        {
            "row": r,
            "column": f"{m} {ph}",
            "verdict": "not-reproduced",
            "paper_printed": f"{r}{m}{ph}",
            "ours": None,
        }
        for r in ("1", "2")
        for m in ("a", "b")
        for ph in ("fwd", "bwd")
    ]
    cells.append({"row": "all", "column": "claim", "verdict": "not-reproduced"})
    layout = {
        "corner": "PP/EP",
        "rows": ["2", "1"],
        "groups": [
            {"label": m, "columns": [{"label": ph, "column": f"{m} {ph}"} for ph in ("fwd", "bwd")]}
            for m in ("b", "a")
        ],
    }
    grid = paper_grid({"cells": cells, "extra": {"paper_layout": layout}})
    assert grid["corner"] == "PP/EP"
    assert grid["groups"] == [{"label": "b", "span": 2}, {"label": "a", "span": 2}]
    assert grid["columns"] == ["fwd", "bwd", "fwd", "bwd"]
    assert [row["label"] for row in grid["rows"]] == ["2", "1"]
    assert [c["paper_printed"] for c in grid["rows"][0]["cells"]] == [
        "2bfwd",
        "2bbwd",
        "2afwd",
        "2abwd",
    ]
    assert grid["outside"] == 1  # the claim is not in the paper's table
    # a layout is shown however many columns it has (the default grid stops at 8)
    wide = {
        "corner": "",
        "rows": ["1"],
        "groups": [
            {"label": "g", "columns": [{"label": str(i), "column": str(i)} for i in range(12)]}
        ],
    }
    assert (
        len(
            paper_grid(
                {
                    "cells": [{"row": "1", "column": str(i)} for i in range(12)],
                    "extra": {"paper_layout": wide},
                }
            )["columns"]
        )
        == 12
    )


def test_paper_grid_can_transpose_our_rows_into_the_papers_columns():
    from moe_repro.reports.html import paper_grid

    # ours: one row per model, one column per component; the paper: one row per component
    cells = [
        {"row": model, "column": comp, "ours": f"{model}/{comp}"}
        for model in ("small", "big")
        for comp in ("weights", "logits", "other")
    ]
    layout = {
        "corner": "component",
        "groups": [{"label": "ours", "columns": [{"label": "small"}, {"label": "big"}]}],
        "rows": [
            {"label": "Logits O(NV/P)", "keys": [["small", "logits"], ["big", "logits"]]},
            {"label": "Weights", "keys": [["small", "weights"], None]},
        ],
    }
    grid = paper_grid({"cells": cells, "extra": {"paper_layout": layout}})
    assert grid["columns"] == ["small", "big"]
    assert [[c and c["ours"] for c in row["cells"]] for row in grid["rows"]] == [
        ["small/logits", "big/logits"],
        ["small/weights", None],
    ]
    assert grid["outside"] == 3  # big/weights and both "other" cells


def test_mop_table1_page_has_the_papers_table():
    from moe_repro.reports.html import paper_grid
    from moe_repro.reproductions import all_reproductions
    from moe_repro.reproductions.spec import record_of

    repro = all_reproductions()["mop-table1"]
    grid = paper_grid(record_of(repro, repro.run(), {}, ["repro"]).model_dump())
    # MoP Table 1's seven components, in its order, one column per model size
    assert [row["label"].split(" · ")[0] for row in grid["rows"]] == [
        "Dense weights Θ_dns",
        "Attention activations",
        "Expert weights Θ_exp",
        "MoE activations",
        "Vocabulary weights Θ_voc",
        "Vocabulary logits",
        "Optimizer state {m, v, master}",
    ]
    assert grid["columns"] == ["120B (16 GPUs)", "600B (64 GPUs)", "1T (96 GPUs)"]
    assert all(c is not None for row in grid["rows"] for c in row["cells"])


def test_feplb_table2_page_shows_table_2_as_printed(monkeypatch):
    from types import SimpleNamespace

    from moe_repro.reports.html import render_reproduction
    from moe_repro.reproductions import _feplb_traces as ft
    from moe_repro.reproductions import all_reproductions
    from moe_repro.reproductions.spec import record_of

    # the layout does not depend on the modelled makespans: skip the traces (minutes on CPU)
    monkeypatch.setattr(
        ft,
        "evaluate",
        lambda params, ep, **kw: {
            m: SimpleNamespace(gemm_makespan_s=1e-3) for m in ("Before LB", "FasterMoE", "FEPLB")
        },
    )
    repro = all_reproductions()["feplb-table2"]
    payload = record_of(repro, repro.run(), {}, ["repro", "run", "feplb-table2"]).model_dump()
    page = render_reproduction(payload)
    grid = page[page.index("In the paper's layout") : page.index("Paper vs ours")]
    assert '<th rowspan="2">PP/EP</th>' in grid
    for method in ("Before LB", "FasterMoE", "Triton Dist.", "Tutel", "FEPLB"):
        assert f'<th colspan="2">{method}</th>' in grid
    assert grid.count("<th>fwd</th><th>bwd</th>") == 5
    # Table 2's first row, forward / backward per method, in the paper's order
    shown = r'title="(?:not-reproduced|not-comparable)">([\d.]+)<br>'
    assert [float(v) for v in re.findall(shown, grid)[:10]] == [
        8.2,
        14.9,
        7.9,
        14.0,
        13.1,
        22.8,
        8.0,
        17.1,
        7.9,
        14.4,
    ]
    assert "The 8 cells outside the paper's table" in grid  # 6 savings, -13%, the claim


def test_pages_not_run_yet_say_what_a_run_needs(results_dir, tmp_path):
    from moe_repro import catalog

    _console("site", "build", "--out", str(tmp_path / "site"))
    for entry in catalog.REPRODUCTIONS.values():
        if not entry.implemented:
            continue
        assert entry.needs, f"{entry.id}: no hardware stated"
        page = (tmp_path / "site" / "repro" / f"{entry.id}.html").read_text()
        assert "not yet run" in page and str(escape(entry.needs)) in page
        assert f"<pre>repro run {entry.id}</pre>" in page
        if entry.minutes is None:
            assert "not measured yet" in page
        else:
            assert "about " in page and "2-core CPU machine" in page
    for entry in catalog.SUITES.values():
        page = (tmp_path / "site" / "suites" / f"{entry.name}.html").read_text()
        assert str(escape(entry.needs)) in page and f"<pre>repro bench {entry.name}</pre>" in page
    index = (tmp_path / "site" / "index.html").read_text()
    assert index.count("not yet run") >= len(
        [e for e in catalog.REPRODUCTIONS.values() if e.implemented]
    )


def test_analytic_and_simulated_reproductions_state_their_expected_minutes():
    from moe_repro import catalog

    for entry in catalog.REPRODUCTIONS.values():
        if entry.implemented and entry.how_letters <= {"A", "S"}:
            assert entry.minutes is not None and entry.minutes > 0, entry.id
