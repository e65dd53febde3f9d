"""The catalog: what this project reproduces and benchmarks, as plain data.

It is the one place that says which papers there are (:data:`PAPERS`), which of their tables
and figures we reproduce and how (:data:`REPRODUCTIONS`, implemented or planned), and which
benchmark suites exist (:data:`SUITES`). Specs, suites, the CLI and the reports all read their
names, titles and descriptions from here. The package imports only the standard library, so
listing what exists (`repro list`) needs neither torch nor any spec or suite module.
"""

from __future__ import annotations

import difflib

from moe_repro.catalog.papers import PAPERS, Paper
from moe_repro.catalog.reproductions import HOW, HOW_MEANING, REPRODUCTIONS, ReproductionEntry
from moe_repro.catalog.suites import SUITES, SuiteEntry

__all__ = [
    "HOW",
    "HOW_MEANING",
    "LONG_RUN_S",
    "PAPERS",
    "REPRODUCTIONS",
    "SUITES",
    "Paper",
    "ReproductionEntry",
    "SuiteEntry",
    "close_matches",
    "long_run_line",
    "paper",
    "reproduction",
    "reproductions_of",
    "suite",
]

# A run expected to last longer than this says so on stderr before it starts.
LONG_RUN_S = 300.0


def long_run_line(what: str, seconds: float | None, basis: str) -> str | None:
    """``repro: <what>, expected to take about 1 h 5 min (<basis>)`` for a run whose estimate
    exceeds LONG_RUN_S; None for a shorter one or one with no estimate."""
    if seconds is None or seconds <= LONG_RUN_S:
        return None
    minutes = round(seconds / 60)
    took = f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"
    return f"repro: {what}, expected to take about {took} ({basis}); Ctrl-C keeps what finished"


def close_matches(name, known, n: int = 3) -> list[str]:
    """The known names closest to a mistyped ``name`` (difflib ratio >= 0.5), best first: the
    "did you mean" of every error about an unknown name."""
    return difflib.get_close_matches(str(name), [str(k) for k in known], n=n, cutoff=0.5)


def _unknown(kind: str, name: str, known) -> ValueError:
    close = close_matches(name, known)
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(known)}"
    return ValueError(f"unknown {kind} {name!r}; {hint}")


def paper(key: str) -> Paper:
    """The paper with this key (piper, xmoe, feplb, mop)."""
    if key not in PAPERS:
        raise _unknown("paper", key, PAPERS)
    return PAPERS[key]


def reproduction(rid: str) -> ReproductionEntry:
    """The catalog entry of reproduction ``rid``, implemented or planned."""
    if rid not in REPRODUCTIONS:
        raise _unknown("reproduction", rid, REPRODUCTIONS)
    return REPRODUCTIONS[rid]


def reproductions_of(key: str) -> list[ReproductionEntry]:
    """The entries of one paper, in catalog order; an unknown paper key is a ValueError."""
    paper(key)
    return [r for r in REPRODUCTIONS.values() if r.paper == key]


def suite(name: str) -> SuiteEntry:
    """The catalog entry of suite ``name``."""
    if name not in SUITES:
        raise _unknown("suite", name, SUITES)
    return SUITES[name]
