"""Headless Chromium clicks through the built site: index -> a reproduction -> its raw data.

Needs Debian's chromium and the playwright package (the `browser` extra); skipped without them,
except where MOE_REPRO_REQUIRE_BROWSER=1 (CI), where their absence fails the test.
"""

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from linkcheck import broken_links
from moe_repro.cli import cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Flags for a closed network, as root, without a GPU (see the machine notes).
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


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


@pytest.fixture
def site(tmp_path, results_dir):
    runner = CliRunner()
    assert runner.invoke(cli, ["run", *PAGES, "--quiet"]).exit_code == 0
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
        page.click("text=piper-table4")
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
        targets = [("index", site / "index.html"), ("suite-alltoall", site / "suites" / "alltoall.html")]
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
    assert problems == []
    assert all(s.stat().st_size > 10_000 for s in shots)
