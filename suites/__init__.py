"""Benchmark suites: one module per suite, each defining ``SUITE`` (see :mod:`.base`).

A suite's name and one-line description are in :mod:`moe_repro.catalog`, so listing the suites
imports none of these modules."""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from moe_repro.suites.base import Suite

_NOT_SUITES = {"base", "stats", "runner"}


@lru_cache(maxsize=1)
def all_suites() -> dict[str, Suite]:
    found: dict[str, Suite] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in _NOT_SUITES:
            continue
        suite = getattr(importlib.import_module(f"{__name__}.{info.name}"), "SUITE", None)
        if suite is not None:
            if suite.name in found:
                raise RuntimeError(f"suite {suite.name!r} defined twice")
            found[suite.name] = suite
    return dict(sorted(found.items()))
