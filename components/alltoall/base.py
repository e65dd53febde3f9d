"""What every all-to-all algorithm provides, and the registry that names them.

An algorithm is one :class:`AllToAll` object, registered once by its own module with
:func:`register`. Callers choose it by name (``get_algorithm("halo")``) and ask its
:class:`AllToAllFacts` what it can do instead of checking names:

- over real ranks: :meth:`AllToAll.dispatcher` builds a :class:`Dispatcher` (MoE dispatch of a
  PFT's rows to their experts' ranks, in the flat all-to-all's output layout, and the reverse
  combine); where ``facts.layer_form``, :meth:`AllToAll.all_to_all_v` is a differentiable
  all-to-all-v on any EP process group, usable inside the MoE layer and the trainer;
- as data, for the network simulator: :meth:`AllToAll.routed_schedule` (the messages one
  dispatch sends for every rank's routing), :meth:`AllToAll.counts_schedule` (the same from a
  counts matrix alone, where ``facts.schedule_from_counts``: what the aggregated simulation of
  expected routing replays) and ``phase_dependencies`` (which phase waits for which);
- :meth:`AllToAll.link_bytes`: the bytes one dispatch puts on each link class.

A message is ``(phase, src, dst, nbytes)``; self-messages are local copies and travel on no link.
This module imports no algorithm: the package ``__init__`` imports them, which registers them.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import ClassVar

from moe_repro.components.lazy_import import lazy_module
from moe_repro.components.network.topology import Topology, bytes_by_link_class

torch = lazy_module("torch", globals())  # the simulator reads this registry without tensors

Message = tuple[str, int, int, int]  # (phase, src rank, dst rank, bytes)


@dataclass(frozen=True)
class AllToAllFacts:
    """What callers may rely on, so that none of them has to branch on a name."""

    name: str  # the registry key users type (--algo, --alltoall, all_to_all=)
    label: str  # how reports and error messages call it, e.g. "HALO"
    paper_section: str  # where the algorithm comes from, e.g. "Piper Sec. V, Alg. 1"
    description: str  # one line
    # A differentiable all-to-all-v on any EP process group (all_to_all_v), with the flat
    # all-to-all-v's contract: usable inside MoELayer and the PP x EP trainer.
    layer_form: bool
    # Needs the same number of ranks on every node, its ranks node by node (check_group says
    # whether a group qualifies).
    equal_ranks_per_node: bool
    # The simulator can build its messages from a counts matrix alone (counts_schedule);
    # False: it needs every rank's routing, token by token (routed_schedule).
    schedule_from_counts: bool
    # The named stages its dispatcher times when asked (Dispatcher.timings), in call order:
    # what X-MoE Fig. 12 breaks a dispatch into. Empty: it does not time its stages.
    stages: tuple[str, ...] = ()


class ReusedBuffers:
    """Named buffers kept from one call to the next, grown when a call needs more rows.

    Why: a fresh multi-MiB tensor is page-faulted in on first touch, which on a CPU costs about
    as much as the exchange itself (16 MiB per rank over gloo, 4 ranks: the collective into a
    fresh buffer 17.5 ms, into a reused one 12.1 ms). Collective libraries keep their buffers
    for the same reason (HALO's persistent buffers, Piper Alg. 1 lines 2-4)."""

    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, rows: int, like: torch.Tensor) -> torch.Tensor:
        """``rows`` rows shaped and typed like ``like``'s, overwriting what ``name`` held."""
        b = self._buffers.get(name)
        if b is None or b.dtype != like.dtype or b.device != like.device \
                or b.shape[1:] != like.shape[1:] or b.shape[0] < rows:
            b = like.new_empty((max(rows, 1), *like.shape[1:]))
            self._buffers[name] = b
        return b[:rows]


class Dispatcher(ABC):
    """One rank's MoE dispatch and combine over real ranks, for one expert -> rank placement.

    ``dispatch`` returns this rank's expert inputs in the flat all-to-all's layout: by source
    rank, then in the source's send order (PFT order grouped stably by destination rank), so the
    same expert computation runs whatever the algorithm. ``combine`` reverses the last dispatch:
    every token gets the combine-weighted sum of its experts' outputs. The rows ``dispatch``
    returns live in a buffer the next dispatch overwrites (no fresh allocation per call); a
    dispatcher is the measured, no-autograd path (the layer uses ``AllToAll.all_to_all_v``).

    Set ``timings`` to a dict and ``dispatch`` adds each of the algorithm's ``facts.stages``
    seconds to it (a stage includes waiting for peers); None (default) costs no clock reads.
    """

    timings: dict[str, float] | None = None

    def _clock(self) -> float:
        return time.perf_counter() if self.timings is not None else 0.0

    def _lap(self, stage: str, since: float) -> float:
        """Add the time since ``since`` to ``stage``; returns now (the next stage's start)."""
        if self.timings is None:
            return since
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + now - since
        return now

    @abstractmethod
    def dispatch(self, x: torch.Tensor, pft) -> torch.Tensor:
        """x [tokens, H] and its PFT -> expert input rows on this rank."""

    @abstractmethod
    def combine(self, y: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """Expert outputs (the last dispatch's rows) -> [num_tokens, H]."""


class AllToAll(ABC):
    """One all-to-all algorithm (see the module docstring). Subclasses set ``facts`` and
    ``phase_dependencies`` and implement what their facts promise."""

    facts: ClassVar[AllToAllFacts]
    phase_dependencies: ClassVar[dict[str, list[str]]]  # phase -> phases it waits for

    @property
    def dispatcher_dependencies(self) -> dict[str, list[str]]:
        """The phase order this package's dispatcher imposes on one rank: its blocking calls run
        one after another, so a phase the algorithm could overlap may wait for an earlier call.
        Default: the algorithm's own dependencies (the dispatcher overlaps what they allow)."""
        return self.phase_dependencies

    @abstractmethod
    def dispatcher(self, comms, expert_to_rank, generator: torch.Generator | None = None) -> Dispatcher:
        """This rank's dispatcher over ``comms`` (topology.Communicators: ``world`` is the EP
        group). ``generator`` feeds algorithms that make random choices (RBD's pilots)."""

    @abstractmethod
    def routed_schedule(self, pfts: list, expert_to_rank, topo: Topology, row_bytes: int,
                        generators: list | None = None, with_counts: bool = True) -> list[Message]:
        """The messages one dispatch sends when rank r routes ``pfts[r]`` (generators seeded as
        the ranks' were). ``with_counts`` False leaves out the count/metadata-size exchange."""

    def counts_schedule(self, counts_matrix, topo: Topology, row_bytes: int, with_counts: bool = True,
                        ranks=None) -> list[Message]:
        """The messages when rank s sends ``counts_matrix[s][d]`` rows to rank d; ``ranks``
        limits the source ranks. Only where ``facts.schedule_from_counts``."""
        raise ValueError(f"{self.facts.name} cannot be built from a counts matrix: it needs every "
                         f"rank's routing (routed_schedule)")

    def all_to_all_v(self, x: torch.Tensor, send_counts: list[int], recv_counts: list[int] | None = None,
                     group=None) -> torch.Tensor:
        """Differentiable all-to-all-v over ``group`` (flat.all_to_all_v's contract). Only where
        ``facts.layer_form``."""
        raise ValueError(f"{self.facts.name} has no differentiable EP-group form")

    def check_group(self, group_ranks: list[int], topo: Topology) -> None:
        """Raise ValueError when this algorithm cannot run on the process group of these global
        ranks of ``topo``; algorithms with ``facts.equal_ranks_per_node`` override it."""

    def link_bytes(self, pfts: list, expert_to_rank, topo: Topology, row_bytes: int,
                   generators: list | None = None, with_counts: bool = True) -> dict[str, int]:
        """Bytes one dispatch puts on each link class (topology.bytes_by_link_class of
        :meth:`routed_schedule`), ``inter_node`` included."""
        return bytes_by_link_class(self.routed_schedule(pfts, expert_to_rank, topo, row_bytes,
                                                        generators, with_counts), topo)


# --- the registry -----------------------------------------------------------------------------

ALGORITHMS: dict[str, AllToAll] = {}  # name -> algorithm, in registration order


def register(algorithm: AllToAll) -> AllToAll:
    """Add ``algorithm`` under ``algorithm.facts.name`` after checking that it keeps what its
    facts promise; returns it."""
    facts, cls = getattr(algorithm, "facts", None), type(algorithm)
    if not isinstance(algorithm, AllToAll) or not isinstance(facts, AllToAllFacts):
        raise ValueError(f"{cls.__name__} must be an AllToAll with AllToAllFacts")
    if facts.name in ALGORITHMS:
        raise ValueError(f"all-to-all {facts.name!r} is already registered")
    if not isinstance(getattr(algorithm, "phase_dependencies", None), dict):
        raise ValueError(f"{facts.name}: phase_dependencies must map each phase to the phases it waits for")
    promised = {"layer_form": "all_to_all_v", "schedule_from_counts": "counts_schedule",
                "equal_ranks_per_node": "check_group"}
    for fact, method in promised.items():
        if getattr(facts, fact) and getattr(cls, method) is getattr(AllToAll, method):
            raise ValueError(f"{facts.name}: {fact} is set but {cls.__name__} does not implement {method}")
    ALGORITHMS[facts.name] = algorithm
    return algorithm


def get_algorithm(name: str) -> AllToAll:
    """The registered algorithm called ``name``; ValueError naming the known ones otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown all-to-all {name!r}; known: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def algorithm_names(**facts) -> list[str]:
    """Names of the registered algorithms, in registration order, whose facts equal every
    keyword given, e.g. ``algorithm_names(layer_form=True)``."""
    known = {f.name for f in fields(AllToAllFacts)}
    unknown = sorted(set(facts) - known)
    if unknown:
        raise ValueError(f"unknown all-to-all fact {unknown[0]!r}; known: {', '.join(sorted(known))}")
    return [name for name, algo in ALGORITHMS.items()
            if all(getattr(algo.facts, k) == v for k, v in facts.items())]
