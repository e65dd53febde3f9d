"""How a number was produced, recorded by the code that produced it, never typed by hand.

The functions that make numbers other than by closed-form arithmetic say so when they run:

- ``measured``: timing a kernel or a collective on this machine (suites/runner.py), reading a
  peak-memory counter (training/activation_memory.py), training for real (balance/routing_record.py);
- ``simulated``: the flow-level network simulator (network/simulator.py ``run_flows``) and
  replaying a balancer on a routing trace (balance/load_balance_eval.py);
- ``monte-carlo``: estimating an expectation from seeded random samples
  (alltoall/rbd.py ``sampled_redundancy_rate``).

A number computed while none of them ran is ``analytic``. A reproduction opens a
:func:`tracking` scope around the work behind a cell (reproductions/spec.py) and labels the cell
with what ran inside it, so a label cannot claim a measurement that never happened or hide a
simulation that did.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Hashable, Iterator

KINDS = ("analytic", "monte-carlo", "measured", "simulated")
LETTER = {"analytic": "A", "monte-carlo": "M", "measured": "R", "simulated": "S"}

_scopes: ContextVar[tuple[set, ...]] = ContextVar("moe_repro_provenance", default=())


def produced(kind: str) -> None:
    """Called by a producer when it runs: every open :func:`tracking` scope notes ``kind``."""
    if kind not in KINDS or kind == "analytic":
        raise ValueError(f"kind must be one of measured, simulated, monte-carlo; got {kind!r}")
    for scope in _scopes.get():
        scope.add(kind)


@contextmanager
def tracking() -> Iterator[set]:
    """Collect the kinds produced inside the block (nested scopes all see them)."""
    scope: set = set()
    token = _scopes.set(_scopes.get() + (scope,))
    try:
        yield scope
    finally:
        _scopes.reset(token)


def current() -> set | None:
    """The innermost open scope (what has run in it so far), or None outside every scope."""
    scopes = _scopes.get()
    return scopes[-1] if scopes else None


def _made(compute: Callable[[], Any]) -> tuple[Any, frozenset]:
    """(value, the kinds produced computing it): what a cache keeps."""
    with tracking() as made:
        value = compute()
    return value, frozenset(made)


def _replayed(entry: tuple[Any, frozenset]) -> Any:
    """A cached value, its kinds announced again as if it had just been produced."""
    value, made = entry
    for kind in made:
        produced(kind)
    return value


def remembering(maxsize: int | None = None):
    """``functools.lru_cache`` that also remembers how each value was produced and says so again
    on every hit: a cached simulation still labels the cells that use it as simulated."""

    def wrap(fn: Callable) -> Callable:
        @functools.lru_cache(maxsize)
        def produce(*args, **kwargs):
            return _made(lambda: fn(*args, **kwargs))

        @functools.wraps(fn)
        def cached(*args, **kwargs):
            return _replayed(produce(*args, **kwargs))

        # functools.wraps' result takes the attribute at run time; mypy types it without one
        cached.cache_clear = produce.cache_clear  # type: ignore[attr-defined]
        return cached

    return wrap


def cached_in(cache: dict, key: Hashable, compute: Callable[[], Any]) -> Any:
    """``cache[key]``, computing it on a miss, with the same memory as :func:`remembering` for
    module-level dict caches."""
    if key not in cache:
        cache[key] = _made(compute)
    return _replayed(cache[key])


def letters(kinds: set | frozenset) -> str:
    """{"simulated", "measured"} -> "R+S"; nothing produced -> "A" (closed-form arithmetic)."""
    named = [LETTER[k] for k in KINDS if k in kinds] or ["A"]
    return "+".join(named)
