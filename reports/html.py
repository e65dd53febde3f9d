"""jinja2 HTML pages (autoescaped; no external assets: the stylesheet is inlined)."""

from __future__ import annotations

from functools import lru_cache

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup


@lru_cache(maxsize=1)
def environment() -> Environment:
    env = Environment(loader=PackageLoader("moe_repro.reports", "templates"),
                      autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = _num
    env.filters["pct"] = lambda x: "" if x is None else f"{x:+.2%}"
    return env


def _num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.4g}" if abs(x) < 1e6 else f"{x:.4e}"
    return str(x)


def css() -> Markup:
    """The stylesheet, marked safe: it is our own file, and autoescaping it turns its quotes into
    &#34; inside <style>, which breaks every rule after the first quoted font name."""
    return Markup(environment().loader.get_source(environment(), "style.css")[0])


def render_reproduction(payload: dict, raw_json: str | None = None, figures: list[dict] | None = None,
                        home: str | None = None, raw_csv: str | None = None) -> str:
    return environment().get_template("reproduction.html").render(
        p=payload, raw_json=raw_json, raw_csv=raw_csv, figures=figures or [], home=home, css=css())


def render_index(papers: list[dict], suites: list[dict]) -> str:
    return environment().get_template("index.html").render(papers=papers, suites=suites, css=css())


def render_suite(name: str, payload: dict | None, raw_json: str | None, history: list[dict],
                 home: str, graphs: list[dict] | None = None) -> str:
    return environment().get_template("suite.html").render(
        name=name, p=payload, raw_json=raw_json, history=history, home=home, graphs=graphs or [],
        css=css())
