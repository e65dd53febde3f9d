"""The catalog against the code: specs, suites and the catalog name the same things."""

import json
import subprocess
import sys

import pytest

from moe_repro import catalog
from moe_repro.catalog import HOW, PAPERS, REPRODUCTIONS, SUITES
from moe_repro.reproductions import all_reproductions
from moe_repro.reproductions.spec import Reproduction
from moe_repro.suites import all_suites


def test_every_spec_has_an_entry_marked_implemented_and_back():
    specs = all_reproductions()
    implemented = {rid for rid, entry in REPRODUCTIONS.items() if entry.implemented}
    assert set(specs) - set(REPRODUCTIONS) == set(), "spec without a catalog entry"
    assert set(specs) == implemented, "catalog 'implemented' disagrees with the spec modules"


def test_every_suite_has_an_entry_and_back():
    suites = all_suites()
    assert set(suites) == set(SUITES)
    for name, suite in suites.items():
        # multi-process exactly when the suite starts worlds of ranks
        assert SUITES[name].distributed == bool(suite.world_params), name


def test_entries_are_well_formed():
    assert set(PAPERS) == {"piper", "xmoe", "feplb", "mop"}
    for rid, entry in REPRODUCTIONS.items():
        assert entry.id == rid and entry.paper in PAPERS and rid.startswith(entry.paper + "-")
        assert entry.how_letters and entry.how_letters <= set(HOW), rid
        for text in (entry.title, entry.what, entry.description, entry.element):
            assert text and "\n" not in text, rid
        if not entry.implemented:
            assert entry.issue is not None, f"{rid}: a planned entry names the issue that builds it"
    for name, entry in SUITES.items():
        assert entry.name == name and entry.description and "\n" not in entry.description


def test_the_design_inventory_is_complete():
    # DESIGN.md's inventory: 15 Piper, 11 X-MoE, 5 FEPLB, 4 MoP ids
    per_paper = {key: len(catalog.reproductions_of(key)) for key in PAPERS}
    assert per_paper == {"piper": 15, "xmoe": 11, "feplb": 5, "mop": 4}


def test_how_letters():
    assert catalog.reproduction("piper-fig5").how_letters == {"R", "S"}
    assert catalog.reproduction("xmoe-fig4").how_letters == {"A", "M"}
    assert catalog.reproduction("piper-fig11").how_letters == {"A"}  # every number is the model's
    assert catalog.reproduction("piper-table4").paper_element == "Piper Table IV"


@pytest.mark.parametrize(
    "lookup,name,needle",
    [
        (catalog.paper, "pipr", "did you mean piper?"),
        (catalog.reproduction, "piper-tabel4", "did you mean piper-table4"),
        (catalog.suite, "gemmm", "did you mean gemm"),
        (catalog.suite, "zzzzzz", "known: allreduce, alltoall"),
        (catalog.reproductions_of, "feplp", "unknown paper 'feplp'; did you mean feplb?"),
    ],
)
def test_unknown_names_are_value_errors_with_close_matches(lookup, name, needle):
    with pytest.raises(ValueError, match="unknown") as info:
        lookup(name)
    assert needle in str(info.value)


def test_bibtex_is_built_from_the_fields():
    # FEPLB's first page: title, three authors, "arXiv:2604.19654v1 [cs.DC] 21 Apr 2026"
    assert catalog.paper("feplb").bibtex == (
        "@misc{qi2026feplb,\n"
        "  author = {Shuyao Qi and Haoyuan Liu and Shizhen Zhao},\n"
        "  title = {{FEPLB: Exploiting Copy Engines for Nearly Free MoE Load Balancing in "
        "Distributed Training}},\n"
        "  year = {2026},\n"
        "  note = {preprint},\n"
        "  url = {https://arxiv.org/abs/2604.19654},\n"
        "}"
    )
    # MoP's text states no date and no arXiv number: neither is invented
    mop = catalog.paper("mop").bibtex
    assert mop.startswith("@misc{nguyenmop,\n") and "year" not in mop and "url" not in mop


def test_specs_and_suites_read_their_metadata_from_the_catalog():
    spec = all_reproductions()["piper-table4"]
    entry = catalog.reproduction("piper-table4")
    assert (spec.title, spec.paper, spec.element, spec.how, spec.description) == (
        entry.title,
        "piper",
        "Table IV",
        "A",
        entry.description,
    )
    assert all_suites()["gemm"].description == catalog.suite("gemm").description
    orphan = Reproduction(id="no-such-id", paper_values=[], compute=lambda r, p: None)
    with pytest.raises(ValueError, match="unknown reproduction 'no-such-id'"):
        orphan.title


def test_catalog_imports_only_the_standard_library():
    code = (
        "import sys, json; before = set(sys.modules); import moe_repro.catalog; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
    )
    outside = [
        m
        for m in loaded
        if m.split(".")[0] not in sys.stdlib_module_names
        and m != "moe_repro"
        and not m.startswith("moe_repro.catalog")
    ]
    assert outside == []


def test_site_index_shows_full_titles_and_every_entry(tmp_path):
    from moe_repro.records.store import ResultsStore
    from moe_repro.reports.site import build_site

    index = build_site(ResultsStore(tmp_path / "results"), tmp_path / "site").read_text()
    for paper in PAPERS.values():
        assert paper.title in index
    for rid in REPRODUCTIONS:
        assert f'href="repro/{rid}.html"' in index
    for name in SUITES:
        assert f'href="suites/{name}.html"' in index
