"""Rendering: terminal tables, jinja2 HTML pages, matplotlib figures, the static site."""
