"""What every all-to-all algorithm provides, and the registry that names them.

An algorithm is one :class:`AllToAll` object, registered once by its own module with
:func:`register`. Callers choose it by name (``get_algorithm("halo")``) and ask its
:class:`AllToAllFacts` what it can do instead of checking names:

- over real ranks: :meth:`AllToAll.dispatcher` (on topology.Communicators) and
  :meth:`AllToAll.group_dispatcher` (on any EP process group) build a :class:`Dispatcher`: MoE
  dispatch of a PFT's rows to their experts' ranks, in the flat all-to-all's output layout, and
  the reverse combine, differentiable when grad is enabled. It is the one dispatch path: the
  MoE layer, the trainer, the alltoall and dispatch-stages suites all run it;
- as data, for the network simulator: :meth:`AllToAll.routed_schedule` (the messages one
  dispatch sends for every rank's routing), :meth:`AllToAll.counts_schedule` (the same from a
  counts matrix alone, where ``facts.schedule_from_counts``: what the aggregated simulation of
  expected routing replays) and ``phase_dependencies`` (which phase waits for which);
- :meth:`AllToAll.link_bytes`: the bytes one dispatch puts on each link class.

A message is ``(phase, src, dst, nbytes)``; self-messages are local copies and travel on no link.
This module imports no algorithm: the package ``__init__`` imports them, which registers them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from functools import cache
from typing import TYPE_CHECKING, ClassVar

from moe_repro.runtime.timing import instant
from moe_repro.components.lazy_import import lazy_module
from moe_repro.components.network.comm import alltoallv_autograd
from moe_repro.components.network.topology import Topology, bytes_by_link_class

if TYPE_CHECKING:  # annotations only: numpy and torch are imported where they are used
    import numpy as np
    import torch
else:
    torch = lazy_module("torch", globals())  # the simulator reads this registry without tensors

Message = tuple[str, int, int, int]  # (phase, src rank, dst rank, bytes)


@dataclass
class RoutedPairs:
    """One rank's routed (token, expert) pairs in PFT order (expert ascending, then token), as
    numpy arrays: what a routed schedule reads of a PFT, without a tensor (a simulated rank's
    routing, drawn by components/torch_cpu_random.py)."""

    token_ids: "np.ndarray"  # int64 [pairs]
    expert_ids: "np.ndarray"  # int64 [pairs], ascending
    num_experts: int

    @property
    def num_rows(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class AllToAllFacts:
    """What callers may rely on, so that none of them has to branch on a name."""

    name: str  # the registry key users type (--algo, --alltoall, all_to_all=)
    label: str  # how reports and error messages call it, e.g. "HALO"
    paper_section: str  # where the algorithm comes from, e.g. "Piper Sec. V, Alg. 1"
    description: str  # one line
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

    Why: a fresh multi-MiB tensor is page-faulted in on first touch, which on a CPU costs a
    sizeable part of the exchange itself. Collective libraries keep their buffers for the same
    reason (HALO's persistent buffers, Piper Alg. 1 lines 2-4)."""

    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, rows: int, like: torch.Tensor) -> torch.Tensor:
        """``rows`` rows shaped and typed like ``like``'s, overwriting what ``name`` held."""
        b = self._buffers.get(name)
        if (
            b is None
            or b.dtype != like.dtype
            or b.device != like.device
            or b.shape[1:] != like.shape[1:]
            or b.shape[0] < rows
        ):
            b = like.new_empty((max(rows, 1), *like.shape[1:]))
            self._buffers[name] = b
        return b[:rows]


@dataclass
class FlatLayout:
    """Where one dispatch's rows go, in the flat all-to-all's terms (every algorithm delivers
    this layout): ``send_rows[j]`` is the PFT row sent j-th (PFT order grouped stably by
    destination rank), ``send_counts[d]`` rows go to rank d, ``recv_counts[s]`` rows arrive
    from rank s."""

    send_rows: "torch.Tensor"
    send_counts: list[int]
    recv_counts: list[int]


class Dispatcher(ABC):
    """One rank's MoE dispatch and combine over real ranks, for one expert -> rank placement.

    ``dispatch`` returns this rank's expert inputs in the flat all-to-all's layout: by source
    rank, then in the source's send order (PFT order grouped stably by destination rank), so the
    same expert computation runs whatever the algorithm. ``combine`` reverses the last dispatch:
    every token gets the combine-weighted sum of its experts' outputs.

    Each algorithm implements three parts: :meth:`plan` (the layout of one PFT and every
    metadata exchange: counts, RBD's pilots), :meth:`send_rows` (the rows' way out: gather and
    exchange) and :meth:`return_rows` (their way back, summed into tokens). ``dispatch`` is
    plan + send_rows and ``combine`` is return_rows, so the benchmarks and the MoE layer run the
    same code.

    Autograd form (what the layer and the trainer use): when grad is enabled and the input
    requires it, ``dispatch`` and ``combine`` are differentiable. The backward of dispatch is the
    way back without weights (each token gets the sum of its rows' gradients); the backward of
    combine is the way out of the gradient (every row gets its token's gradient), through the
    same algorithm, with the layout saved by that call (several micro-batches may be in flight).
    Combine weights that need a gradient (the gate's) are passed as ``weights``: one per
    received row (:meth:`received_weights`), applied on the expert's rank before the way back.

    Without grad the rows ``dispatch`` returns live in a buffer the next dispatch overwrites (no
    fresh allocation per call: the measured path); with grad they are a fresh copy.

    Set ``timings`` to a dict and ``dispatch`` adds each of the algorithm's ``facts.stages``
    seconds to it (a stage includes waiting for peers); None (default) costs no clock reads.
    """

    timings: dict[str, float] | None = None
    # The device the stages' work runs on: on CUDA each stamp first waits for its queued work
    # (runtime/timing.instant), so a stage's seconds include its kernels and transfers.
    timing_device = None
    state = None  # the last dispatch's plan (what combine reverses)

    def _clock(self) -> float:
        return instant(self.timing_device) if self.timings is not None else 0.0

    def _lap(self, stage: str, since: float) -> float:
        """Add the time since ``since`` to ``stage``; returns now (the next stage's start)."""
        if self.timings is None:
            return since
        now = instant(self.timing_device)
        self.timings[stage] = self.timings.get(stage, 0.0) + now - since
        return now

    # --- what each algorithm implements -------------------------------------------------------
    @abstractmethod
    def plan(self, pft):
        """The layout of one dispatch of ``pft`` (exchanging whatever metadata it needs); an
        object with a ``layout`` (:class:`FlatLayout`) that send_rows and return_rows read."""

    @abstractmethod
    def send_rows(self, x: torch.Tensor, state) -> torch.Tensor:
        """x [tokens, H] -> expert input rows on this rank (flat layout), no autograd."""

    @abstractmethod
    def return_rows(self, y: torch.Tensor, state, num_tokens: int, weighted: bool) -> torch.Tensor:
        """Expert outputs (flat layout) -> [num_tokens, H], no autograd: each token the sum of
        its rows, each row scaled by its PFT combine weight when ``weighted``."""

    @abstractmethod
    def comm(self):
        """The EP group's communicator (flat.Comm): the combine weights travel on it."""

    # --- dispatch and combine -----------------------------------------------------------------
    def dispatch(self, x: torch.Tensor, pft) -> torch.Tensor:
        """x [tokens, H] and its PFT -> expert input rows on this rank."""
        if x.dim() != 2 or x.shape[0] != pft.num_tokens:
            raise ValueError(f"x must be [{pft.num_tokens}, H], got {tuple(x.shape)}")
        self.state = self.plan(pft)
        return self._send(x, self.state)

    def _send(self, x: torch.Tensor, state) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return _autograd_functions()[0].apply(x, self, state)
        return self.send_rows(x, state)

    def combine(
        self, y: torch.Tensor, num_tokens: int, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Expert outputs (the last dispatch's rows) -> [num_tokens, H]. ``weights`` None: the
        PFT's combine weights (no gradient to them); else one weight per row of ``y``
        (differentiable, see :meth:`received_weights`)."""
        state = self.state
        if state is None:
            raise RuntimeError("combine called before dispatch")
        total = sum(state.layout.recv_counts)
        if y.dim() != 2 or y.shape[0] != total:
            raise ValueError(f"y has {y.shape[0]} rows, dispatch delivered {total}")
        if weights is not None:
            y = y * weights.to(y.dtype).unsqueeze(1)
        if torch.is_grad_enabled() and y.requires_grad:
            if weights is None:
                raise ValueError(
                    "a differentiable combine needs its weights passed "
                    "(Dispatcher.received_weights)"
                )
            return _autograd_functions()[1].apply(y, self, state, num_tokens)
        return self.return_rows(y, state, num_tokens, weighted=weights is None)

    def received_weights(self, combine_weights: torch.Tensor) -> torch.Tensor:
        """The last dispatch's PFT combine weights, one per row it delivered here (flat layout),
        by one all-to-all-v of a scalar per row (4 bytes per fp32 row, 1/H of the rows' bytes);
        differentiable, its backward the reverse exchange (so the gate gets its gradient)."""
        if self.state is None:
            raise RuntimeError("received_weights called before dispatch")
        layout = self.state.layout
        w = combine_weights.index_select(0, layout.send_rows).reshape(-1, 1)
        return alltoallv_autograd(
            self.comm(), w, layout.send_counts, layout.recv_counts, "weights"
        ).reshape(-1)

    def expert_counts_from_each_rank(self, tokens_per_expert: torch.Tensor) -> list[list[int]]:
        """Every rank's tokens_per_expert ([W][E] ints) by one all-gather of E int64 (X-MoE
        App. B.3 exchanges this ERI-array): the layer groups the received rows by expert."""
        return self.comm().allgather_ints([int(c) for c in tokens_per_expert.tolist()])


@cache
def _autograd_functions():
    """(dispatch, combine) autograd Functions, defined on first use (torch is imported
    on first use: the simulator reads this registry without tensors)."""

    class DispatchRows(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, dispatcher, state):
            ctx.dispatcher, ctx.state, ctx.num_tokens = dispatcher, state, x.shape[0]
            return dispatcher.send_rows(x.detach(), state).clone()  # the buffer is reused

        @staticmethod
        def backward(ctx, grad):
            # d(rows)/dx is a gather: the gradient of each token is the sum of its rows'.
            dx = ctx.dispatcher.return_rows(
                grad.contiguous(), ctx.state, ctx.num_tokens, weighted=False
            )
            return dx, None, None

    class CombineRows(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y, dispatcher, state, num_tokens):
            ctx.dispatcher, ctx.state = dispatcher, state
            return dispatcher.return_rows(y.detach(), state, num_tokens, weighted=False)

        @staticmethod
        def backward(ctx, grad):
            # The sum over a token's rows: every row gets its token's gradient (the way out).
            return ctx.dispatcher.send_rows(grad.contiguous(), ctx.state).clone(), None, None, None

    return DispatchRows, CombineRows


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
    def dispatcher(
        self, comms, expert_to_rank, generator: torch.Generator | None = None
    ) -> Dispatcher:
        """This rank's dispatcher over ``comms`` (topology.Communicators: ``world`` is the EP
        group). ``generator`` feeds algorithms that make random choices (RBD's pilots)."""

    @abstractmethod
    def routed_schedule(
        self,
        pfts: list,
        expert_to_rank,
        topo: Topology,
        row_bytes: int,
        generators: list | None = None,
        with_counts: bool = True,
    ) -> list[Message]:
        """The messages one dispatch sends when rank r routes ``pfts[r]`` (generators seeded as
        the ranks' were). ``with_counts`` False leaves out the count/metadata-size exchange.
        Algorithms simulated per message (``facts.schedule_from_counts`` False) also take
        :class:`RoutedPairs` with torch_cpu_random.TorchCPUGenerator twins of the generators:
        what the simulator passes, so that a simulated grid needs no torch."""

    def counts_schedule(
        self, counts_matrix, topo: Topology, row_bytes: int, with_counts: bool = True, ranks=None
    ) -> list[Message]:
        """The messages when rank s sends ``counts_matrix[s][d]`` rows to rank d; ``ranks``
        limits the source ranks. Only where ``facts.schedule_from_counts``."""
        raise ValueError(
            f"{self.facts.name} cannot be built from a counts matrix: it needs every "
            f"rank's routing (routed_schedule)"
        )

    @abstractmethod
    def group_dispatcher(
        self,
        expert_to_rank,
        group=None,
        topo: Topology | None = None,
        generator: torch.Generator | None = None,
    ) -> Dispatcher:
        """This rank's dispatcher over the torch.distributed process group ``group`` (None =
        world; e.g. one pipeline stage's EP group), ``expert_to_rank`` in group ranks, nodes
        from ``topo`` (default: the launcher's emulated layout) restricted to the group. Not
        collective (no process group is created: stage-local EP groups would deadlock). What
        the MoE layer and the trainer hold."""

    def check_group(self, group_ranks: list[int], topo: Topology) -> None:
        """Raise ValueError when this algorithm cannot run on the process group of these global
        ranks of ``topo``; algorithms with ``facts.equal_ranks_per_node`` override it."""

    def link_bytes(
        self,
        pfts: list,
        expert_to_rank,
        topo: Topology,
        row_bytes: int,
        generators: list | None = None,
        with_counts: bool = True,
    ) -> dict[str, int]:
        """Bytes one dispatch puts on each link class (topology.bytes_by_link_class of
        :meth:`routed_schedule`), ``inter_node`` included."""
        return bytes_by_link_class(
            self.routed_schedule(pfts, expert_to_rank, topo, row_bytes, generators, with_counts),
            topo,
        )


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
        raise ValueError(
            f"{facts.name}: phase_dependencies must map each phase to the phases it waits for"
        )
    promised = {"schedule_from_counts": "counts_schedule", "equal_ranks_per_node": "check_group"}
    for fact, method in promised.items():
        if getattr(facts, fact) and getattr(cls, method) is getattr(AllToAll, method):
            raise ValueError(
                f"{facts.name}: {fact} is set but {cls.__name__} does not implement {method}"
            )
    ALGORITHMS[facts.name] = algorithm
    return algorithm


def get_algorithm(name: str) -> AllToAll:
    """The registered algorithm called ``name``; ValueError naming the known ones otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown all-to-all {name!r}; known: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def algorithm_names(**facts) -> list[str]:
    """Names of the registered algorithms, in registration order, whose facts equal every
    keyword given, e.g. ``algorithm_names(equal_ranks_per_node=False)``."""
    known = {f.name for f in fields(AllToAllFacts)}
    unknown = sorted(set(facts) - known)
    if unknown:
        raise ValueError(
            f"unknown all-to-all fact {unknown[0]!r}; known: {', '.join(sorted(known))}"
        )
    return [
        name
        for name, algo in ALGORITHMS.items()
        if all(getattr(algo.facts, k) == v for k, v in facts.items())
    ]
