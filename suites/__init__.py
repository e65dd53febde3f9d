"""Benchmark suites: one module per suite, each defining ``SUITE`` (see :mod:`.base`).

A suite's name and one-line description are in :mod:`moe_repro.catalog`, so listing the suites
imports none of these modules."""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from moe_repro.suites.base import Suite

_NOT_SUITES = {"base", "stats", "runner"}


def get_suite(name: str) -> Suite:
    """The suite called ``name``, importing only its module when the module is named after it
    (``moe-dispatch`` -> ``moe_dispatch``), so one command loads one suite; KeyError otherwise."""
    module = name.replace("-", "_")
    if not module.startswith("_") and module not in _NOT_SUITES:
        try:
            suite = getattr(importlib.import_module(f"{__name__}.{module}"), "SUITE", None)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{module}":
                raise
            suite = None
        if suite is not None and suite.name == name:
            return suite
    return all_suites()[name]


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
