"""Headless Chromium clicks through the built site: index -> a reproduction -> its raw data; and
looks at what a reader sees: the style applied, the figures loaded, the answer first on each
reproduction page (claims and evidence, then figures, then graded cells), nothing wider than a
phone's screen, and screenshots of the index and five pages at 1280 px and 375 px kept in
$MOE_REPRO_ARTIFACTS.

Needs Debian's chromium and the playwright package (the `browser` extra); skipped without them,
except where MOE_REPRO_REQUIRE_BROWSER=1 (CI), where their absence fails the test.
"""

import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from linkcheck import broken_links
from moe_repro.cli import cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Flags for a closed network, as root, without a GPU (see the machine notes).
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _require_browser():
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "the playwright package"
    else:
        missing = None if CHROMIUM else "a chromium binary"
    if missing:
        if os.environ.get("MOE_REPRO_REQUIRE_BROWSER"):
            pytest.fail(f"browser test required but {missing} is not installed")
        pytest.skip(f"needs {missing} (pip install -e '.[browser]'; apt-get install chromium)")


# One reproduction of each paper (fast analytic or simulated ones), and the suite pages opened.
PAGES = ["piper-table4", "piper-fig8", "xmoe-table3", "feplb-fig6", "mop-table1"]
# The pages a reader is shown first, screenshotted at both widths (with the index): figures in
# the paper's form (bars, OOM), a sampled table, and a table whose throughput reads in words.
SHOWN = ["piper-fig8", "piper-fig12", "xmoe-fig11", "feplb-table3", "mop-table2"]
FIGURES = {"piper-fig8", "piper-fig12", "xmoe-fig11"}  # the paper's element is a figure
SUITES_SHOWN = ["suite-gemm"]  # a suite page: its figures, table and history by commit
# a number in scientific notation as the page shows it (3e-05, 1.2e+07)
SCI = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?e[+-]\d+)(?![\w.])")
WIDTHS = (1280, 375)
# Run smaller than their defaults, which take minutes: the page's layout (what this test looks
# at) is the same cells, rows and columns at any size. xmoe-fig11 measures real ranks: a small
# layer; feplb-table3 replays 5 seeds' traces (synthetic and real-count) at 3 EP sizes: short
# ones (256 tokens per rank, 2 layers; its defaults, 4096 and 18, took 76-300 s here).
SMALL = {
    "xmoe-fig11": [
        "--param",
        "ranks=2",
        "--param",
        "tokens=32",
        "--param",
        "d_model=16",
        "--param",
        "d_ffn=8",
        "--param",
        "experts=4",
        "--param",
        "top_k=2",
        "--param",
        "repeats=1",
    ],
    "feplb-table3": ["--param", "tokens=256", "--param", "layers=2"],
}


@pytest.fixture
def site(tmp_path, results_dir):
    runner = CliRunner()
    fast = [p for p in dict.fromkeys(PAGES + SHOWN) if p not in SMALL]
    assert runner.invoke(cli, ["run", *fast, "--quiet"]).exit_code == 0
    for rid, params in SMALL.items():
        assert runner.invoke(cli, ["run", rid, "--quiet", *params]).exit_code == 0
    assert runner.invoke(cli, ["bench", "gemm", "--n", "32", "--repeats", "2"]).exit_code == 0
    assert runner.invoke(cli, ["bench", "alltoall", "--quick", "--repeats", "2"]).exit_code == 0
    out = tmp_path / "site"
    assert runner.invoke(cli, ["site", "build", "--out", str(out)]).exit_code == 0
    return out


def test_click_through_index_reproduction_raw_data(site, tmp_path):
    _require_browser()
    from playwright.sync_api import sync_playwright

    assert broken_links(site) == []
    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = browser.new_page()
        page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))

        page.goto((site / "index.html").as_uri())
        assert "moe-repro results" in page.title() + page.content()
        # the stylesheet applies (an escaped one leaves the browser's default serif font)
        font = page.evaluate("getComputedStyle(document.body).fontFamily")
        assert "sans-serif" in font and "system-ui" in font, font
        page.click("td >> a:text-is('piper-table4')")  # its row in the paper's table
        page.wait_for_load_state()
        assert page.url.endswith("repro/piper-table4.html")
        assert page.locator("tr.deviates").count() > 0 and page.locator("tr.match").count() > 0
        shot = Path(os.environ.get("MOE_REPRO_ARTIFACTS", tmp_path)) / "site-piper-table4.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)

        page.click("text=piper-table4.json")
        page.wait_for_load_state()
        assert page.url.endswith("repro/piper-table4.json")
        assert '"id": "piper-table4"' in page.inner_text("body")

        page.goto((site / "suites" / "gemm.html").as_uri())
        assert page.locator("img").count() >= 1  # the history graph
        # every figure on the page actually loaded (a broken image has no natural width)
        widths = page.evaluate("[...document.images].map(i => i.complete ? i.naturalWidth : 0)")
        assert widths and all(w > 0 for w in widths), widths

        # every paper's page and a suite page: styled, figures loaded, a screenshot kept (CI
        # keeps MOE_REPRO_ARTIFACTS as build artefacts)
        shots = [shot]
        targets = [
            ("index", site / "index.html"),
            ("suite-alltoall", site / "suites" / "alltoall.html"),
        ]
        targets += [(rid, site / "repro" / f"{rid}.html") for rid in PAGES[1:]]
        for name, path in targets:
            page.goto(path.as_uri())
            font = page.evaluate("getComputedStyle(document.body).fontFamily")
            assert "sans-serif" in font, (name, font)
            widths = page.evaluate("[...document.images].map(i => i.complete ? i.naturalWidth : 0)")
            assert all(w > 0 for w in widths), (name, widths)
            if name not in ("index", "mop-table1", "xmoe-table3"):  # tables only
                assert widths, f"{name}: no figure"
            shots.append(shot.parent / f"site-{name}.png")
            page.screenshot(path=str(shots[-1]), full_page=True)
        browser.close()
        shots += look_as_a_reader(p, site, shot.parent)
    assert problems == []
    assert all(s.stat().st_size > 10_000 for s in shots)


def look_as_a_reader(p, site: Path, artifacts: Path) -> list[Path]:
    """The index and the SHOWN pages at each of WIDTHS: styled, every image loaded, nothing wider
    than the screen (tables scroll in their own box), on a reproduction page the claims and
    evidence before the figures before the graded cells, and the ungraded cells folded. Returns
    the screenshots written (site-<page>-<width>.png)."""
    shots = []
    browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
    for width in WIDTHS:
        page = browser.new_page(viewport={"width": width, "height": 900})
        for name in ["index", *SHOWN, *SUITES_SHOWN]:
            path = (
                site / "index.html"
                if name == "index"
                else site / "suites" / f"{name[len('suite-') :]}.html"
                if name in SUITES_SHOWN
                else site / "repro" / f"{name}.html"
            )
            page.goto(path.as_uri())
            where = f"{name} at {width} px"
            assert "sans-serif" in page.evaluate("getComputedStyle(document.body).fontFamily"), (
                where
            )
            widths = page.evaluate("[...document.images].map(i => i.complete ? i.naturalWidth : 0)")
            assert all(w > 0 for w in widths), (where, widths)
            # nothing runs off the side: wide tables scroll inside their own box
            assert page.evaluate("document.documentElement.scrollWidth") <= width, where
            # numbers as people read them: no scientific notation for a value in [1e-4, 1e6)
            text = page.inner_text("body")
            sci = [m for m in SCI.findall(text) if 1e-4 <= abs(float(m)) < 1e6]
            assert sci == [], (where, sci[:5])
            if name == "index":
                # the change grid comes first: a tile with its sparkline per result with a
                # history, then one line linking those with runs at one commit only
                tiles = page.locator("ul.watch li.tile").count()
                assert page.locator("ul.watch svg.spark").count() == tiles, where
                assert tiles + page.locator("#changes p.single a").count() >= 3, where
                top = page.evaluate(
                    "document.querySelector('#changes').getBoundingClientRect().top"
                )
                assert top < 900, (where, top)  # on the first screen
                # the reproduction and suite listings fit the screen: their counts and grades
                # are read without scrolling a table's box sideways
                wide = page.evaluate(
                    "Math.max(...[...document.querySelectorAll('table.listing')]"
                    ".map(t => t.getBoundingClientRect().right))"
                )
                assert wide <= width, (where, wide)
            if name in SUITES_SHOWN:
                # history by commit: an inline chart whose points link to the stored runs
                assert page.locator("svg.history a circle").count() >= 1, where
                assert page.locator("svg.history").first.bounding_box()["width"] <= width, where
                # its labels stay readable when the chart shrinks to a phone's width
                label = page.evaluate(
                    "document.querySelector('svg.history text').getBoundingClientRect().height"
                )
                assert label >= 8, (where, label)
                shots.append(artifacts / f"site-{name}-{width}.png")
                page.screenshot(path=str(shots[-1]), full_page=True)
                continue  # the rest is a reproduction page's
            if name != "index":
                # the answer columns of the per-cell table (paper, ours, grade) are on screen
                # without scrolling the table's box sideways, at 375 px too
                right = page.evaluate("""() => {
                    const th = [...document.querySelectorAll('#graded ~ div table.cells th')]
                        .find(t => t.textContent.trim() === 'grade');
                    return th ? th.getBoundingClientRect().right : null;
                }""")
                assert right is not None and right <= width, (where, right)
                order = page.evaluate("""() => {
                    const top = el => el ? el.getBoundingClientRect().top + window.scrollY : null;
                    return {answer: top(document.querySelector('#answer')),
                            figure: top(document.querySelector('figure img')),
                            graded: top(document.querySelector('#graded'))};
                }""")
                assert order["answer"] is not None and order["graded"] is not None, (where, order)
                assert order["answer"] < order["graded"], (where, order)
                if name in FIGURES:
                    assert order["figure"] is not None, f"{where}: no figure"
                    assert order["answer"] < order["figure"] < order["graded"], (where, order)
                # ungraded cells are folded: what a reader sees first is the graded ones
                folded = page.locator("details.ungraded")
                if folded.count():
                    assert not folded.first.evaluate("d => d.open"), where
                    assert folded.first.locator(
                        "tr.no-paper-value, tr.echo, tr.not-comparable, tr.not-reproduced"
                    ).first.is_hidden(), where
            shots.append(artifacts / f"site-{name}-{width}.png")
            page.screenshot(path=str(shots[-1]), full_page=True)
            if name == "piper-fig8" and width == 375:
                # its 34 ungraded rows once made the page 13,000 px tall on a phone
                height = page.evaluate("document.documentElement.scrollHeight")
                assert height < 8000, height
        page.close()
    browser.close()
    return shots
