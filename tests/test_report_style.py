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
