"""Import a heavy module (torch) on its first use rather than when the importing module loads.

Why: the all-to-all registry, its algorithms and the all-to-all suite are also what the network
simulator reads (each algorithm's facts and message schedule), and a simulated
``repro bench alltoall --nodes 1024`` needs no tensor. Importing torch costs 1-4 s on a small
machine, longer than the simulation itself (issue 15's "Scale" target: under 2 s in all).

Usage, at the top of a module, instead of ``import torch``::

    torch = lazy_module("torch", globals())

The first attribute read (``torch.tensor``) imports the module and rebinds the name in that
module's namespace, so every later read is the plain module: no cost on hot paths.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class LazyModule:
    """Stands in for module ``name`` under the name ``alias`` in ``namespace`` until first use."""

    def __init__(self, name: str, namespace: dict, alias: str):
        self._name, self._namespace, self._alias = name, namespace, alias

    def __getattr__(self, attr: str):
        module = importlib.import_module(self._name)
        self._namespace[self._alias] = module  # later reads in that module skip this proxy
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}, not imported yet>"


def lazy_module(name: str, namespace: dict, alias: str | None = None) -> LazyModule | ModuleType:
    """``name`` if it is already imported, else a stand-in that imports it on first use.
    ``alias`` defaults to the last part of the name (``torch.distributed`` -> ``distributed``);
    pass ``"dist"`` for ``import torch.distributed as dist``."""
    import sys

    alias = alias or name.rsplit(".", 1)[-1]
    if name in sys.modules:
        return sys.modules[name]
    return LazyModule(name, namespace, alias)
