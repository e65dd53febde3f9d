"""Reproductions: one module per paper table or figure, each defining ``REPRODUCTION``.

Modules are discovered by name, so adding a reproduction is adding one file here and its entry
in :mod:`moe_repro.catalog` (which also lists the planned ids that have no module yet, and
says ``implemented`` for those that have one).
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from moe_repro.reproductions.spec import Reproduction

_NOT_SPECS = {"spec"}


@lru_cache(maxsize=1)
def all_reproductions() -> dict[str, Reproduction]:
    found: dict[str, Reproduction] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in _NOT_SPECS:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for repro in getattr(module, "REPRODUCTIONS", [getattr(module, "REPRODUCTION", None)]):
            if repro is None:
                continue
            if repro.id in found:
                raise RuntimeError(f"reproduction id {repro.id!r} defined twice")
            found[repro.id] = repro
    return dict(sorted(found.items()))
