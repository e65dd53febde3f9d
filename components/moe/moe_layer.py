"""Padding-free MoE layer (X-MoE Sec. 4.1.1, Listing 1 lines 60-72, App. B.3).

    gate -> build_pft -> dispatch (gather + uneven all-to-all) -> grouped expert MLP
         -> combine (uneven all-to-all back + weighted sum per token) (+ shared experts)

Every stage is a method so the suites can time them one by one (X-MoE Fig. 11); ``forward``
just chains them. Nothing is padded: with N = retained (token, expert) pairs, the buffers are
[N, H] and each all-to-all moves exactly N rows in total.

Expert parallelism (EP): ranks of ``ep_group`` each own the experts an :class:`ExpertPlacement`
gives them. The layer holds one dispatcher (``all_to_all``: any registered algorithm,
components/alltoall: flat by default, Piper's HALO or X-MoE's RBD on the EP group; all deliver
the same rows in the same order), as Megatron-core's layer holds its token dispatcher. Dispatch
is the dispatcher's (differentiable), plus one all_gather of E int64 (App. B.3: "we first
exchange the tokens_per_expert ERI-array") to regroup the received rows (source-major) into
expert-major order for the grouped GEMM, and one all-to-all of the combine weights (a scalar per
row) so that each row is weighted on its expert's rank and the gate gets its gradient; combine
is the dispatcher's way back.
Zero-token experts and zero-token ranks take the same path (empty chunks), so every rank makes
the same collective calls in forward and backward; a rank with S = 0 still joins them.
``overlap`` (auto by default) pipelines dispatch and combine in chunks with the expert GEMMs
(components/moe/overlap.py); ``gemm`` (auto by default) is components/moe/kernel_choice.py's.

Bytes on the wire per rank and direction (flat): sum over remote destinations of rows * H * itemsize,
versus E * C * H * itemsize * (W - 1) / W for the capacity-padded layer (padded_moe.py).
"""

from __future__ import annotations

import math
from fractions import Fraction
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from moe_repro.components.alltoall import algorithm_names, get_algorithm
from moe_repro.components.moe.expert_mlp import ExpertMLP
from moe_repro.components.moe.gating import GateOutput, TopKGate
from moe_repro.components.moe.overlap import chunks_for, parse_overlap, pipelined_routed
from moe_repro.components.moe.pft import (
    COMBINE_ACCUMULATE,
    DROP_POLICIES,
    PFT,
    build_pft,
    gather_tokens,
    inverse_permutation,
    scatter_combine,
)


@dataclass(frozen=True)
class ExpertPlacement:
    """Which global experts each EP rank holds; each rank's list is kept sorted ascending."""

    experts_of_rank: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        flat = sorted(e for experts in self.experts_of_rank for e in experts)
        if flat != list(range(len(flat))):
            raise ValueError("a placement must give every expert 0..E-1 to exactly one rank")
        object.__setattr__(
            self,
            "experts_of_rank",
            tuple(tuple(sorted(experts)) for experts in self.experts_of_rank),
        )

    @classmethod
    def contiguous(cls, num_experts: int, world_size: int) -> "ExpertPlacement":
        """Rank r holds experts [r*E/W, (r+1)*E/W) (the DeepSpeed/Megatron default)."""
        if world_size <= 0 or num_experts % world_size:
            raise ValueError(f"{num_experts} experts do not divide over {world_size} ranks")
        per = num_experts // world_size
        return cls(tuple(tuple(range(r * per, (r + 1) * per)) for r in range(world_size)))

    @classmethod
    def from_ranks(cls, rank_of_expert: list[int], world_size: int) -> "ExpertPlacement":
        return cls(
            tuple(
                tuple(e for e, r in enumerate(rank_of_expert) if r == rank)
                for rank in range(world_size)
            )
        )

    @property
    def num_experts(self) -> int:
        return sum(len(e) for e in self.experts_of_rank)

    @property
    def world_size(self) -> int:
        return len(self.experts_of_rank)

    def rank_of_expert(self) -> torch.Tensor:
        out = torch.empty(self.num_experts, dtype=torch.int64)
        for rank, experts in enumerate(self.experts_of_rank):
            out[list(experts)] = rank
        return out

    @property
    def is_contiguous(self) -> bool:
        """True when sorting rows by expert already groups them by rank (no extra permute)."""
        return list(self.rank_of_expert()) == sorted(self.rank_of_expert().tolist())


@dataclass
class DispatchPlan:
    """What expert compute and combine need from one dispatch."""

    tokens_per_local_expert: torch.Tensor  # int64 [E_local]
    expert_order: torch.Tensor | None = None  # received rows -> expert-major rows (None: local)
    weights: torch.Tensor | None = None  # combine weight of each received row (EP only)

    @property
    def expert_parallel(self) -> bool:
        return self.expert_order is not None


def expert_capacity(
    num_tokens: int, num_experts: int, top_k: int, capacity_factor: float, min_capacity: int = 1
) -> int:
    """C = ceil(capacity_factor * S * k / E) (GShard; X-MoE Sec. 5.1 uses c = 1.25), exactly.

    The factor is read as the decimal the user wrote (``Fraction(str(1.1)) == 11/10``) and the
    ceiling is taken in integers. Float arithmetic, as in DeepSpeed's ``_capacity`` and
    Megatron's ``get_capacity`` (``ceil(S / E * c)``), lands one above the exact value when the
    product rounds up past an integer: S=400, E=8, k=1, c=1.1 gives 55.000000000000007 -> 56,
    the exact value is 55. :func:`float_expert_capacity` keeps the peers' arithmetic for
    comparisons with them.
    """
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be positive, got {capacity_factor}")
    if num_tokens < 0 or num_experts < 1 or top_k < 1:
        raise ValueError(
            f"need tokens >= 0, experts >= 1, top_k >= 1; got S={num_tokens}, "
            f"E={num_experts}, k={top_k}"
        )
    factor = Fraction(str(capacity_factor))
    numerator = factor.numerator * num_tokens * top_k
    denominator = factor.denominator * num_experts
    return max(min_capacity, -(-numerator // denominator))


def float_expert_capacity(
    num_tokens: int, num_experts: int, top_k: int, capacity_factor: float, min_capacity: int = 1
) -> int:
    """``ceil(S * k / E * c)`` in floating point, as DeepSpeed (``_capacity``, where the factor
    passed is c*k) and Megatron (``get_capacity`` with S*k tokens) compute it; may exceed
    :func:`expert_capacity` by one. Used only to feed peers the capacity they would compute."""
    return max(min_capacity, math.ceil((num_tokens * top_k / num_experts) * capacity_factor))


@dataclass(frozen=True)
class MoEConfig:
    """Every option of one MoE layer in one object (``MoELayer.from_config``); the defaults are
    MoELayer's. Process groups and placements are the run's, not the layer's: passed apart."""

    d_model: int
    d_ffn: int
    num_experts: int
    top_k: int
    score: str = "softmax"
    normalize: bool | None = None
    num_shared: int = 0
    activation: str = "swiglu"
    gemm: str = "auto"
    capacity_factor: float | None = None
    drop_policy: str = "probs"
    renormalize_after_drop: bool = False
    combine_accumulate: str = "float32"
    all_to_all: str = "flat"  # the dispatcher the layer holds under expert parallelism
    overlap: str = "auto"  # dispatch/combine chunks pipelined with the GEMMs (overlap.py)
    dtype: torch.dtype = torch.float32

    def replace(self, **changes) -> "MoEConfig":
        from dataclasses import replace

        return replace(self, **changes)


class MoELayer(nn.Module):
    """Padding-free MoE layer; see the module docstring. ``capacity_factor`` None: drop nothing.

    Gating semantics, defaults first (each option names the peer it reproduces):
    ``drop_policy`` "probs" | "position" | "slot" | "random" (pft.DROP_POLICIES);
    ``renormalize_after_drop`` False | True (DeepSpeed top2/topk gating);
    ``combine_accumulate`` "float32" | "input" (fp32 sums for bf16/fp16, as Megatron/DeepSpeed).
    """

    def __init__(
        self,
        d_model: int,
        d_ffn: int,
        num_experts: int,
        top_k: int,
        *,
        score: str = "softmax",
        normalize: bool | None = None,
        num_shared: int = 0,
        activation: str = "swiglu",
        gemm: str = "auto",
        capacity_factor: float | None = None,
        drop_policy: str = "probs",
        renormalize_after_drop: bool = False,
        combine_accumulate: str = "float32",
        expert_parallel: bool = False,
        ep_group=None,
        placement: ExpertPlacement | None = None,
        all_to_all: str = "flat",
        overlap: str | int = "auto",
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        parse_overlap(overlap)  # ValueError for anything but auto, off or a chunk count
        self.overlap = overlap
        self.d_model, self.d_ffn, self.num_experts, self.top_k = d_model, d_ffn, num_experts, top_k
        # Gating semantics (defaults: X-MoE's; see pft.DROP_POLICIES for the peers each names).
        if drop_policy not in DROP_POLICIES:
            raise ValueError(
                f"drop_policy must be one of {', '.join(DROP_POLICIES)}, got {drop_policy!r}"
            )
        if combine_accumulate not in COMBINE_ACCUMULATE:
            raise ValueError(
                f"combine_accumulate must be one of {COMBINE_ACCUMULATE}, "
                f"got {combine_accumulate!r}"
            )
        self.capacity_factor, self.drop_policy = capacity_factor, drop_policy
        self.renormalize_after_drop, self.combine_accumulate = (
            renormalize_after_drop,
            combine_accumulate,
        )
        self.expert_parallel, self.ep_group = expert_parallel, ep_group
        if all_to_all not in algorithm_names():  # every registered dispatcher trains
            raise ValueError(
                f"all_to_all must be one of {', '.join(algorithm_names())}, got {all_to_all!r}"
            )
        self.all_to_all = all_to_all
        if expert_parallel:
            world, self.ep_rank = dist.get_world_size(ep_group), dist.get_rank(ep_group)
            self.placement = placement or ExpertPlacement.contiguous(num_experts, world)
            if self.placement.world_size != world:
                raise ValueError(
                    f"placement is for {self.placement.world_size} ranks, the EP group has {world}"
                )
        else:
            self.ep_rank = 0
            self.placement = placement or ExpertPlacement.contiguous(num_experts, 1)
            if self.placement.world_size != 1:
                raise ValueError("a multi-rank placement needs expert_parallel=True")
        if self.placement.num_experts != num_experts:
            raise ValueError(
                f"placement covers {self.placement.num_experts} experts, layer has {num_experts}"
            )
        self.local_experts = list(self.placement.experts_of_rank[self.ep_rank])
        self.dispatcher = self._make_dispatcher()
        self.gate = TopKGate(
            d_model, num_experts, top_k, score, normalize, dtype=dtype, device=device
        )
        self.experts = ExpertMLP(
            len(self.local_experts), d_model, d_ffn, activation, gemm, dtype=dtype, device=device
        )
        # DeepSeek-MoE shared experts: always active, so one dense FFN num_shared * d_ffn wide.
        self.shared = (
            ExpertMLP(
                1, d_model, num_shared * d_ffn, activation, "sequential", dtype=dtype, device=device
            )
            if num_shared
            else None
        )

    def _make_dispatcher(self):
        """The one dispatch path: the registered algorithm's dispatcher on the EP group for the
        current placement (components/alltoall); a fixed generator for RBD's pilots leaves the
        global RNG alone. None on one rank."""
        if not self.expert_parallel:
            return None
        return get_algorithm(self.all_to_all).group_dispatcher(
            self.placement.rank_of_expert().tolist(),
            self.ep_group,
            generator=torch.Generator().manual_seed(self.ep_rank),
        )

    def set_placement(self, placement: ExpertPlacement) -> None:
        """Adopt a new expert placement (after expert migration moved the weights): the local
        experts and the dispatcher, whose routes depend on where each expert lives, follow it."""
        self.placement = placement
        self.local_experts = list(placement.experts_of_rank[self.ep_rank])
        self.experts.num_experts = len(self.local_experts)
        self.dispatcher = self._make_dispatcher()

    @classmethod
    def from_config(
        cls,
        config: MoEConfig,
        *,
        expert_parallel: bool = False,
        ep_group=None,
        placement: ExpertPlacement | None = None,
        device=None,
    ) -> "MoELayer":
        from dataclasses import asdict

        options = asdict(config)
        dims = [options.pop(k) for k in ("d_model", "d_ffn", "num_experts", "top_k")]
        return cls(
            *dims,
            **options,
            expert_parallel=expert_parallel,
            ep_group=ep_group,
            placement=placement,
            device=device,
        )

    # --- stages (X-MoE Fig. 11 names) ---------------------------------------------------------
    def route(self, x: torch.Tensor) -> GateOutput:
        """Gating: logits, scores, top-k."""
        return self.gate(x)

    def make_pft(self, gate_out: GateOutput) -> PFT:
        capacity = (
            None
            if self.capacity_factor is None
            else expert_capacity(
                gate_out.top_experts.shape[0], self.num_experts, self.top_k, self.capacity_factor
            )
        )
        return build_pft(
            gate_out.top_experts,
            gate_out.combine_weights,
            self.num_experts,
            capacity,
            drop_policy=self.drop_policy,
            renormalize=self.renormalize_after_drop,
        )

    def buffer_dispatch(self, x: torch.Tensor, pft: PFT) -> torch.Tensor:
        return gather_tokens(x, pft)

    def dispatch(self, x: torch.Tensor, pft: PFT) -> tuple[torch.Tensor, DispatchPlan]:
        """Each expert's rows on its rank, grouped by local expert (the grouped GEMM's input).

        One rank: the PFT gather. Expert parallel: the dispatcher's dispatch (the same code the
        alltoall and dispatch-stages suites time), differentiable; its rows come source-major,
        each source's rows expert-ascending, and are regrouped by expert here."""
        if self.dispatcher is None:
            return self.buffer_dispatch(x, pft), DispatchPlan(
                tokens_per_local_expert=pft.tokens_per_expert
            )
        received = self.dispatcher.dispatch(x, pft)
        weights = self.dispatcher.received_weights(pft.combine_weights)
        counts = self.dispatcher.expert_counts_from_each_rank(pft.tokens_per_expert)  # [W][E]
        from_source = torch.tensor(counts, dtype=torch.int64)[:, self.local_experts]  # [W, E_local]
        local_expert_of_row = torch.repeat_interleave(
            torch.arange(len(self.local_experts)).repeat(from_source.shape[0]),
            from_source.reshape(-1),
        )
        expert_order = torch.argsort(local_expert_of_row, stable=True).to(received.device)
        return received.index_select(0, expert_order), DispatchPlan(
            tokens_per_local_expert=from_source.sum(0), expert_order=expert_order, weights=weights
        )

    def expert_compute(self, expert_in: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
        return self.experts(expert_in, plan.tokens_per_local_expert)

    def combine(self, expert_out: torch.Tensor, plan: DispatchPlan, pft: PFT) -> torch.Tensor:
        """Expert outputs (dispatch's grouping) -> [S, H]: each token the combine-weighted sum of
        its experts' outputs. Expert parallel: the rows are weighted on the expert's rank and
        summed on the way back by the dispatcher's combine."""
        if plan.expert_order is None:  # not expert parallel
            return self.buffer_combine(expert_out, pft)
        source_major = expert_out.index_select(0, inverse_permutation(plan.expert_order))
        return self.dispatcher.combine(source_major, pft.num_tokens, weights=plan.weights)

    def buffer_combine(self, combine_in: torch.Tensor, pft: PFT) -> torch.Tensor:
        return scatter_combine(combine_in, pft, self.combine_accumulate)

    # --- the layer ----------------------------------------------------------------------------
    def overlap_chunks(self) -> int:
        """Chunks the routed path pipelines dispatch and combine into (1: not pipelined; the
        rule for ``auto``: overlap.chunks_for)."""
        fewest = min(len(e) for e in self.placement.experts_of_rank)
        device_type = self.gate.weight.device.type
        return chunks_for(
            self.overlap, self.dispatcher is not None, self.all_to_all, fewest, device_type
        )

    def routed(self, x: torch.Tensor, gate_out: GateOutput) -> torch.Tensor:
        pft = self.make_pft(gate_out)
        chunks = self.overlap_chunks()
        if chunks > 1:
            return pipelined_routed(self, x, pft, chunks)
        expert_in, plan = self.dispatch(x, pft)
        return self.combine(self.expert_compute(expert_in, plan), plan, pft)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [S, H] -> [S, H]."""
        if x.dim() != 2 or x.shape[1] != self.d_model:
            raise ValueError(f"x must be [S, {self.d_model}], got shape {tuple(x.shape)}")
        out = self.routed(x, self.route(x))
        if self.shared is not None:
            out = out + self.shared(x, torch.tensor([x.shape[0]]))
        return out
