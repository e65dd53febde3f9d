"""The inlined stylesheet reaches the page as CSS, not HTML-escaped text (issue 16)."""

from __future__ import annotations

import re
from importlib import resources

from moe_repro.reports import html


def test_the_stylesheet_is_inlined_verbatim():
    source = resources.files("moe_repro.reports").joinpath("templates", "style.css").read_text()
    page = html.render_index([], [])
    style = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    assert style.strip() == source.strip()
    assert "&#34;" not in style and '"Segoe UI"' in style


def test_link_check_allows_paper_links_but_not_network_loads(tmp_path):
    from linkcheck import broken_links

    (tmp_path / "a.html").write_text(
        '<a href="https://arxiv.org/abs/1">paper</a>'
        '<img src="https://example.com/x.png"><a href="missing.html">m</a>'
    )
    found = broken_links(tmp_path)
    assert len(found) == 2
    assert any("loads https://example.com/x.png" in f for f in found)
    assert any(f.endswith("missing.html") for f in found)
