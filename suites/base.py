"""How a parameterized benchmark suite is declared.

A suite is a grid of parameters, a ``setup(params, ctx)`` that builds the inputs for one grid
point, the measured call ``run(state)``, metrics derived from each timed sample, and an optional
``check(state)`` that counts wrong output elements (nccl-tests' ``#wrong``: 0 means correct).
``time_s`` is always measured: the wall time of one ``run`` call. Every other metric is derived
per sample by ``derive(params, state, time_s)``, so its median and spread come from the same
repeats.

``cpu_time_s`` is measured beside it: the CPU time (``time.process_time``, every thread of the
process) of one call on each rank, the slowest rank's in a world; it counts no time spent waiting
for the CPU, so it moves far less than wall time when other work shares the machine.

Every suite also takes ``slowdown`` (``--param slowdown=0.1``, default 0, not a grid axis of
the record's key): each timed sample makes that fraction more of its calls (a fraction of a
call by spinning the CPU for it), so wall and CPU time both grow by it, as they would for a
change that does that much more work. It injects a known regression for measuring the gate's
error rate (README, "The gate's error rate"); the record keeps the value.

Distributed suites name their ``world_params`` (for example ``ranks``, ``backend``); the runner
starts one real world per distinct combination and runs that world's grid points inside it.
"""

from __future__ import annotations

import itertools
import math
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
CPU_TIME = Metric(
    "cpu_time_s",
    "s",
    "lower",
    description="CPU time (time.process_time, all threads) of one measured call; a world's is "
    "its slowest rank's",
)
# The injected-regression knob every suite takes (the module docstring says what it does).
SLOWDOWN_PARAM = "slowdown"


@dataclass(frozen=True)
class Param:
    """What one parameter of a suite may be: checked in the parent for every grid point before
    any rank starts, so a bad value is one line (exit 2), never a failure inside a rank.

    ``kind`` int, float, str or bool; numbers take ``min``/``max`` (inclusive; ``why_max`` says
    where the upper bound comes from) and ``multiple_of``; NaN and infinity are never a value.
    Strings take ``choices`` or, when their values are open-ended (a file, ``kill:RANK``),
    ``check`` (raises ValueError) with ``bad`` naming values it must refuse.
    """

    kind: type
    min: float | None = None
    max: float | None = None
    multiple_of: int | None = None
    choices: tuple = ()
    check: Callable[[Any], None] | None = None
    bad: tuple = ()
    why_max: str = ""

    def validate(self, key: str, value: Any) -> None:
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be true or false, got {value!r}")
            return
        if self.kind in (int, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{key} must be a number, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{key} must be a finite number, got {value!r}")
            if self.kind is int and value != int(value):
                raise ValueError(f"{key} must be a whole number, got {value!r}")
            if self.min is not None and value < self.min:
                raise ValueError(f"{key} must be >= {_number(self.min)}, got {_number(value)}")
            if self.max is not None and value > self.max:
                why = f" ({self.why_max})" if self.why_max else ""
                raise ValueError(f"{key} must be <= {_number(self.max)}{why}, got {_number(value)}")
            if self.multiple_of and int(value) % self.multiple_of:
                raise ValueError(
                    f"{key} must be a multiple of {self.multiple_of}, got {_number(value)}"
                )
            return
        if isinstance(value, int) and not isinstance(value, bool) and self.check is not None:
            value = str(value)  # an open-ended value ("auto" or a count) given as a number by code
        if not isinstance(value, str):
            raise ValueError(f"{key} must be text, got {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(_not_one_of(key, value, self.choices))
        if self.check is not None:
            self.check(value)

    def describe(self) -> str:
        """What the declaration allows, for --show-params: 'whole number in [1, 1048576]'."""
        if self.kind is bool:
            return "true or false"
        if self.kind in (int, float):
            what = "whole number" if self.kind is int else "finite number"
            low = "-inf" if self.min is None else _number(self.min)
            high = "inf" if self.max is None else _number(self.max)
            return f"{what} in [{low}, {high}]" + (
                f", a multiple of {self.multiple_of}" if self.multiple_of else ""
            )
        return (
            f"one of {', '.join(map(str, self.choices))}" if self.choices else "checked when given"
        )

    def bad_values(self) -> list[str]:
        """Command-line values this declaration refuses (the fuzz test tries each)."""
        out = ["", "nan", "inf", "-inf", "1e400", "x" * 300] if self.kind is not str else [""]
        if self.kind is bool:
            return [*out, "maybe", "2"]
        if self.kind in (int, float):
            if self.kind is int:
                out += ["2.5", "abc", "1e3"]
            if self.min is not None:
                out.append(
                    _number(self.min - (1 if self.kind is int else max(abs(self.min), 1) * 0.5))
                )
            if self.max is not None:
                out += [_number(self.max + 1 if self.kind is int else self.max * 2 + 1), "9" * 30]
            if self.multiple_of:
                out.append(str(max(int(self.min or 1), 1) * self.multiple_of + 1))
            return out
        if self.choices:
            out += ["nosuch", str(self.choices[0]).upper() + "x"]
        return [*out, *self.bad]


def _number(value: float) -> str:
    """A bound or value as the command line writes it: whole numbers in full, others as repr."""
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(frozen=True)
class Rule:
    """A rule across parameters (top_k <= experts, ranks dividing experts, a size that fits in
    memory): ``holds(point)`` is False for a point that cannot run, ``message`` (a format string
    over the point) says why, ``example`` gives command-line values that break it (the fuzz
    test's case). Checked after ``derived_params``, so a rule may read derived keys (ranks)."""

    holds: Callable[[dict], bool]
    message: str
    example: dict[str, str]


def fits_in_memory(
    bytes_needed: Callable[[dict], float],
    example: dict[str, str],
    what: str = "its buffers",
    simulated_too: bool = False,
) -> Rule:
    """A point whose buffers (``bytes_needed``, summed over the local ranks) exceed the memory
    this machine has available is refused before it allocates; simulated points need none
    unless ``simulated_too`` (a suite whose simulation computes at the point's size)."""

    def holds(p: dict) -> bool:
        if p.get("simulated") and not simulated_too:
            return True
        return bytes_needed(p) <= available_memory_bytes()

    def message_of(p: dict) -> str:
        return (
            f"this point needs about {bytes_needed(p) / 2**30:.3g} GiB for {what}, more than "
            f"the {available_memory_bytes() / 2**30:.3g} GiB of memory available here"
        )

    return Rule(holds, _Message(message_of), example)


class _Message(str):
    """A rule message computed from the point (fits_in_memory's numbers)."""

    def __new__(cls, fn):
        obj = super().__new__(cls, "")
        obj.fn = fn
        return obj

    def format(self, **point) -> str:  # type: ignore[override]
        return self.fn(point)


def available_memory_bytes() -> float:
    from moe_repro.runtime.launch import available_memory_bytes as available

    return available()


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
    # Lines printed under the terminal table, from the run's records (e.g. the alltoall suite's
    # side-by-side ratios of points measured in the same run); None: nothing more.
    summary: Callable[[list[dict]], list[str]] | None = None
    # A suite that must measure its grid its own way (the all-to-all validation interleaves its
    # fit runs with the scored cells in the same worlds): (grid, config, progress, done) ->
    # records, or None to be measured the usual way.
    measure_grid: Callable[..., list[dict] | None] | None = None
    # The sample length where the user gives none (None: the runner's 0.01 s): a suite whose
    # calls stall now and then on a shared machine needs longer samples for a steady median.
    min_sample_s: float | None = None
    # Allowed values of enumerated params, checked when the grid is built, before any rank
    # starts (a bad one is a one-line error with close matches, exit 2).
    choices: dict[str, tuple] = field(default_factory=dict)
    # One declaration of what every parameter may be (types, ranges, divisibility, choices) and
    # the rules across them; checked by ``grid`` in the parent, before any rank starts.
    schema: dict[str, Param] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    # Seconds one grid point takes on a 2-core CPU machine, for the estimate printed before a
    # long run; None: the catalog's minutes at the defaults, spread over the default grid.
    point_seconds: Callable[[dict], float] | None = None

    @property
    def description(self) -> str:
        return catalog.suite(self.name).description

    @property
    def distributed(self) -> bool:
        return bool(self.world_params)

    @property
    def all_metrics(self) -> list[Metric]:
        return [TIME, *self.metrics, CPU_TIME]

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
        for key, declared in self.schema.items():
            for value in values.get(key, ()):
                declared.validate(key, value)
        for value in values.get(SLOWDOWN_PARAM, ()):
            SLOWDOWN.validate(SLOWDOWN_PARAM, value)
        keys = list(values)
        points = [dict(zip(keys, combo)) for combo in itertools.product(*(values[k] for k in keys))]
        for point in points:  # the rules that need no derived key, before derived_params runs
            self.check_rules(point, partial=True)
        if self.derived_params is not None:
            points = [{**p, **self.derived_params(p)} for p in points]
        for point in points:
            self.check_rules(point)
        if self.distributed:
            check_local_ranks(points)
            self.check_launched_world(points, overrides or {})
        return points

    def estimated_seconds(self, points: list[dict]) -> tuple[float, str] | None:
        """(seconds these points should take, what the estimate rests on), or None where
        neither the suite declares a cost per point nor the catalog holds a timing."""
        if self.point_seconds is not None:
            return (
                sum(self.point_seconds(p) for p in points),
                "the suite's cost per point on a 2-core CPU machine",
            )
        minutes = catalog.suite(self.name).minutes
        if not minutes:
            return None
        # the default grid's size, counted without building it: deriving its points could load
        # what these points do not need (torch, for a simulated world)
        default = math.prod(len(values) for values in self.params.values())
        return (
            minutes * 60 * len(points) / max(default, 1),
            "the catalog's time of its default grid on a 2-core CPU machine",
        )

    def check_launched_world(self, points: list[dict], overrides: dict[str, list]) -> None:
        """Under torchrun/mpiexec/srun: the backends the user named and the world sizes of the
        grid must fit the launched world (runtime.launch.check_launched_world), before work.
        A suite whose grid names ``ranks`` takes the launcher's size unless the user gave one."""
        from moe_repro.runtime.launch import check_launched_world

        real = [p for p in points if not p.get("simulated")]
        backends = {str(v) for v in overrides.get("backend", ())}
        if "ranks" in self.params:
            ranks = {int(v) for v in overrides.get("ranks", ())}
        else:
            ranks = {int(p["ranks"]) for p in real if "ranks" in p}
        check_launched_world(backends, ranks)

    def check_rules(self, point: dict, partial: bool = False) -> None:
        """Raise ValueError for the first rule ``point`` breaks; ``partial``: skip the rules that
        read a key the point does not have yet (derived ones)."""
        for rule in self.rules:
            try:
                holds = rule.holds(point)
            except KeyError:
                if partial:
                    continue
                raise
            if not holds:
                raise ValueError(rule.message.format(**point))

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
            if key == SLOWDOWN_PARAM and key not in self.params:
                try:
                    out[key] = [_convert(float, item.strip()) for item in raw.split(",")]
                except ValueError:
                    raise ValueError(f"parameter {key}: cannot read {raw!r} as float") from None
                continue
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
                if kind is float and _non_finite(raw):
                    raise ValueError(
                        f"parameter {key} must be a finite number, got {raw!r}"
                    ) from None
                raise ValueError(
                    f"parameter {key}: cannot read {raw!r} as {kind.__name__}"
                ) from None
        return out


def check_local_ranks(points: list[dict]) -> None:
    """Refuse a real local world larger than this machine holds (runtime.launch's limit: cores,
    memory per rank, open files), before any rank starts; simulated points and worlds a
    launcher started are not local."""
    from moe_repro.runtime.launch import launched_world_size, local_rank_limit

    if launched_world_size():
        return
    real = [int(p["ranks"]) for p in points if "ranks" in p and not p.get("simulated")]
    if not real:
        return
    limit, why = local_rank_limit()
    if max(real) > limit:
        raise ValueError(
            f"{max(real)} local ranks requested; this machine runs at most {limit} "
            f"({why}); start a larger world with torchrun, mpiexec or srun"
        )


def _not_one_of(key: str, value, allowed) -> str:
    close = catalog.close_matches(value, allowed, n=2)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"{key} must be one of {', '.join(map(str, allowed))}, got {value!r}{hint}"


def check_device(device: str) -> None:
    """A ``device`` param names a device this machine has (the rule: runtime/device.py)."""
    from moe_repro.runtime.device import check_device as check

    check(device)


_SUFFIX = {"K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """``4096``, ``4K``, ``64M``, ``1G`` -> bytes (binary multiples, as nccl-tests)."""
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in _SUFFIX:
        number = float(text[:-1])
        if not math.isfinite(number):  # "infK": int() would raise OverflowError
            raise ValueError(text)
        return int(number * _SUFFIX[text[-1]])
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


def _non_finite(raw: str) -> bool:
    try:
        return any(not math.isfinite(float(item)) for item in raw.split(","))
    except ValueError:
        return False


def _convert(kind: type, text: str) -> Any:
    if kind is bool:
        if text.lower() in ("1", "true", "yes"):
            return True
        if text.lower() in ("0", "false", "no"):
            return False
        raise ValueError(text)
    if kind is int:
        return parse_size(text)
    if kind is float:
        value = float(text)
        if not math.isfinite(value):  # "nan", "inf", "1e400": never a parameter's value
            raise ValueError(text)
        return value
    return kind(text)


# Declarations shared by the suites' schemas.
def whole(min: int = 1, max: int = 2**20, **kw) -> Param:
    """An integer parameter in [min, max]."""
    return Param(int, min, max, **kw)


def one_of(*choices: str) -> Param:
    return Param(str, choices=tuple(choices))


def registered(what: str, names: Callable[[], Any]) -> Param:
    """A name from a registry that may grow while the process runs (all-to-all algorithms,
    grouped-GEMM kernels): ``names()`` is asked at each check, not when the suite is declared."""

    def check(value: str) -> None:
        known = list(names())
        if value not in known:
            raise ValueError(_not_one_of(what, value, known))

    return Param(str, check=check, bad=("nosuch",))


def top_k_within_experts(top_k: str = "top_k", experts: str = "experts") -> Rule:
    return Rule(
        lambda p: int(p[top_k]) <= int(p[experts]),
        f"{top_k}={{{top_k}}} exceeds {experts}={{{experts}}}",
        {top_k: "9", experts: "8"},
    )


def divides(divisor: str, dividend: str, example: dict[str, str]) -> Rule:
    return Rule(
        lambda p: int(p[dividend]) % int(p[divisor]) == 0,
        f"{divisor}={{{divisor}}} must divide {dividend}={{{dividend}}}",
        example,
    )


SEED = Param(int, 0, 2**32 - 1)
SLOWDOWN = Param(float, 0, 10, why_max="ten times the call's own time")
THREADS = Param(int, 0, 4096)
DEVICE = Param(str, check=check_device, bad=("tpu", "cuda:x", "cpu:0"))
