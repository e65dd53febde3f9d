"""How a parameterized benchmark suite is declared.

A suite is a grid of parameters, a ``setup(params, ctx)`` that builds the inputs for one grid
point, the measured call ``run(state)``, metrics derived from each timed sample, and an optional
``check(state)`` that counts wrong output elements (nccl-tests' ``#wrong``: 0 means correct).
``time_s`` is always measured: the wall time of one ``run`` call. Every other metric is derived
per sample by ``derive(params, state, time_s)``, so its median and spread come from the same
repeats.

Distributed suites name their ``world_params`` (for example ``ranks``, ``backend``); the runner
starts one real world per distinct combination and runs that world's grid points inside it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from moe_repro import catalog

BETTER = ("higher", "lower", "none")
KINDS = ("measured", "analytic", "simulated")


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    better: str  # "higher" | "lower" | "none"
    kind: str = "measured"  # measured (noisy, repeats) | analytic | simulated (exact)
    description: str = ""

    def __post_init__(self):
        if self.better not in BETTER:
            raise ValueError(f"metric {self.name}: better must be one of {BETTER}")
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name}: kind must be one of {KINDS}")


TIME = Metric("time_s", "s", "lower", description="wall time of one measured call")


@dataclass
class Suite:
    name: str  # its one-line description is the catalog's (moe_repro.catalog), looked up by name
    params: dict[str, list]  # the default grid
    setup: Callable[[dict, Any], Any]  # (params, ctx) -> state; ctx is None for local suites
    run: Callable[[Any], Any]  # the measured call
    metrics: list[Metric] = field(default_factory=list)  # besides time_s
    derive: Callable[[dict, Any, float], dict] | None = None
    check: Callable[[Any], int] | None = None  # -> number of wrong elements
    world_params: tuple[str, ...] = ()  # params that define a world of ranks
    param_help: dict[str, str] = field(default_factory=dict)
    quick: dict[str, list] = field(default_factory=dict)  # a smaller grid for CI / --quick
    # Params computed from each grid point (e.g. ranks = nodes * gpus_per_node); they join the
    # point (and its record) but are not grid axes. May raise ValueError for a bad point.
    derived_params: Callable[[dict], dict] | None = None
    # Grid points whose derived params say ``simulated: True`` are not run: ``simulate(params)``
    # returns their metrics (a model's prediction, e.g. the topology simulator), and the runner
    # records them with ``simulated: true`` and no spread.
    simulate: Callable[[dict], dict] | None = None
    # The terminal table: record keys shown first (default: every grid param) and the metrics
    # shown by median (default: the first three). Records always hold everything.
    # () -> grid defaults taken from a launcher's world ({} when not launched); what the user
    # gives still wins
    launched_defaults: Callable[[], dict[str, list]] | None = None
    table_keys: tuple[str, ...] = ()
    table_metrics: tuple[str, ...] = ()
    # Allowed values of enumerated params, checked when the grid is built, before any rank
    # starts (a bad one is a one-line error with close matches, exit 2).
    choices: dict[str, tuple] = field(default_factory=dict)

    @property
    def description(self) -> str:
        return catalog.suite(self.name).description

    @property
    def distributed(self) -> bool:
        return bool(self.world_params)

    @property
    def all_metrics(self) -> list[Metric]:
        return [TIME, *self.metrics]

    def grid(self, overrides: dict[str, list] | None = None, quick: bool = False) -> list[dict]:
        base = {**self.params, **(self.quick if quick else {})}
        if self.launched_defaults is not None:
            # under torchrun/mpirun/srun, defaults read from the world the launcher started
            base.update(self.launched_defaults())
        values = {**base, **(overrides or {})}
        for key, allowed in self.choices.items():
            for value in values.get(key, ()):
                if value not in allowed:
                    raise ValueError(_not_one_of(key, value, allowed))
        for device in values.get("device", ()):
            check_device(str(device))
        keys = list(values)
        points = [dict(zip(keys, combo)) for combo in itertools.product(*(values[k] for k in keys))]
        if self.derived_params is not None:
            points = [{**p, **self.derived_params(p)} for p in points]
        return points

    def parse_overrides(self, pairs: list[str]) -> dict[str, list]:
        """Parse ``k=v1,v2`` strings; values take the type of the default grid's values.

        Integer parameters also take binary size suffixes and doubling ranges, as nccl-tests'
        ``-b 1K -e 64M -f 2``: ``sizes=1K:64M`` is 1024, 2048, ..., 64 Mi.
        """
        out: dict[str, list] = {}
        for pair in pairs:
            key, sep, raw = pair.partition("=")
            key = key.strip()
            if not sep or not key or not raw:
                raise ValueError(f"--param expects key=value[,value...], got {pair!r}")
            if key not in self.params:
                known = ", ".join(self.params)
                raise ValueError(f"suite {self.name} has no parameter {key!r}; known: {known}")
            kind = type(self.params[key][0])
            try:
                values = []
                for item in raw.split(","):
                    item = item.strip()
                    if kind is int and ":" in item:
                        values += doubling_range(item)
                    else:
                        values.append(_convert(kind, item))
                out[key] = values
            except ValueError:
                raise ValueError(f"parameter {key}: cannot read {raw!r} as {kind.__name__}") from None
        return out


def _not_one_of(key: str, value, allowed) -> str:
    close = catalog.close_matches(value, allowed, n=2)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"{key} must be one of {', '.join(map(str, allowed))}, got {value!r}{hint}"


def check_device(device: str) -> None:
    """A ``device`` param names a device this machine has (the rule: runtime/device.py)."""
    from moe_repro.runtime.device import check_device as check

    check(device)


_SUFFIX = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}


def parse_size(text: str) -> int:
    """``4096``, ``4K``, ``64M``, ``1G`` -> bytes (binary multiples, as nccl-tests)."""
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in _SUFFIX:
        return int(float(text[:-1]) * _SUFFIX[text[-1]])
    return int(text)


def doubling_range(text: str) -> list[int]:
    """``1K:64M`` -> [1024, 2048, ..., 67108864]: every power-of-two step from start to end."""
    start_text, _, end_text = text.partition(":")
    start, end = parse_size(start_text), parse_size(end_text)
    if start <= 0 or end < start:
        raise ValueError(text)
    values = []
    while start <= end:
        values.append(start)
        start *= 2
    return values


def _convert(kind: type, text: str) -> Any:
    if kind is bool:
        if text.lower() in ("1", "true", "yes"):
            return True
        if text.lower() in ("0", "false", "no"):
            return False
        raise ValueError(text)
    if kind is int:
        return parse_size(text)
    return kind(text)
