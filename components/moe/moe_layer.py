"""Padding-free MoE layer (X-MoE Sec. 4.1.1, Listing 1 lines 60-72, App. B.3).

    gate -> build_pft -> gather (buffer dispatch) -> [uneven all-to-all] -> grouped expert MLP
         -> [uneven all-to-all back] -> weighted scatter (buffer combine) (+ shared experts)

Every stage is a method so the suites can time them one by one (X-MoE Fig. 11); ``forward``
just chains them. Nothing is padded: with N = retained (token, expert) pairs, the buffers are
[N, H] and each all-to-all moves exactly N rows in total.

Expert parallelism (EP): ranks of ``ep_group`` each own the experts an :class:`ExpertPlacement`
gives them. Dispatch learns every rank's tokens_per_expert with one all_gather of E int64
(App. B.3: "we first exchange the tokens_per_expert ERI-array"), sends each rank the rows of its
experts with an all-to-all-v (``all_to_all``: any registered algorithm with a differentiable
EP-group form, components/alltoall; flat by default, or Piper's HALO on the EP group; all give
the same rows in the same order), and regroups the received rows
(source-major) into expert-major order for the grouped GEMM; combine reverses both steps.
Zero-token experts and zero-token ranks take the same path (empty chunks), so every rank makes
the same collective calls in forward and backward; a rank with S = 0 still joins them.

Bytes on the wire per rank and direction: sum over remote destinations of rows * H * itemsize,
versus E * C * H * itemsize * (W - 1) / W for the capacity-padded layer (padded_moe.py).
"""

from __future__ import annotations

import math
from fractions import Fraction
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from moe_repro.components.alltoall import algorithm_names, get_algorithm
from moe_repro.components.moe.expert_mlp import ExpertMLP
from moe_repro.components.moe.gating import GateOutput, TopKGate
from moe_repro.components.moe.pft import (COMBINE_ACCUMULATE, DROP_POLICIES, PFT, build_pft, gather_tokens,
                                          inverse_permutation, scatter_combine)


@dataclass(frozen=True)
class ExpertPlacement:
    """Which global experts each EP rank holds; each rank's list is kept sorted ascending."""

    experts_of_rank: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        flat = sorted(e for experts in self.experts_of_rank for e in experts)
        if flat != list(range(len(flat))):
            raise ValueError("a placement must give every expert 0..E-1 to exactly one rank")
        object.__setattr__(self, "experts_of_rank",
                           tuple(tuple(sorted(experts)) for experts in self.experts_of_rank))

    @classmethod
    def contiguous(cls, num_experts: int, world_size: int) -> "ExpertPlacement":
        """Rank r holds experts [r*E/W, (r+1)*E/W) (the DeepSpeed/Megatron default)."""
        if world_size <= 0 or num_experts % world_size:
            raise ValueError(f"{num_experts} experts do not divide over {world_size} ranks")
        per = num_experts // world_size
        return cls(tuple(tuple(range(r * per, (r + 1) * per)) for r in range(world_size)))

    @classmethod
    def from_ranks(cls, rank_of_expert: list[int], world_size: int) -> "ExpertPlacement":
        return cls(tuple(tuple(e for e, r in enumerate(rank_of_expert) if r == rank)
                         for rank in range(world_size)))

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
    """What the combine stage needs to undo dispatch (all host-side counts are Python ints)."""

    tokens_per_local_expert: torch.Tensor        # int64 [E_local]
    send_counts: list[int] = field(default_factory=list)
    recv_counts: list[int] = field(default_factory=list)
    send_order: torch.Tensor | None = None       # PFT rows -> rank-major rows (None: identity)
    expert_order: torch.Tensor | None = None     # received rows -> expert-major rows

    @property
    def expert_parallel(self) -> bool:
        return bool(self.send_counts)


def expert_capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: float,
                    min_capacity: int = 1) -> int:
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
        raise ValueError(f"need tokens >= 0, experts >= 1, top_k >= 1; got S={num_tokens}, "
                         f"E={num_experts}, k={top_k}")
    factor = Fraction(str(capacity_factor))
    numerator = factor.numerator * num_tokens * top_k
    denominator = factor.denominator * num_experts
    return max(min_capacity, -(-numerator // denominator))


def float_expert_capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: float,
                          min_capacity: int = 1) -> int:
    """``ceil(S * k / E * c)`` in floating point, as DeepSpeed (``_capacity``, where the factor
    passed is c*k) and Megatron (``get_capacity`` with S*k tokens) compute it; may exceed
    :func:`expert_capacity` by one. Used only to feed peers the capacity they would compute."""
    return max(min_capacity, math.ceil((num_tokens * top_k / num_experts) * capacity_factor))


class MoELayer(nn.Module):
    """Padding-free MoE layer; see the module docstring. ``capacity_factor`` None: drop nothing.

    Gating semantics, defaults first (each option names the peer it reproduces):
    ``drop_policy`` "probs" | "position" | "slot" | "random" (pft.DROP_POLICIES);
    ``renormalize_after_drop`` False | True (DeepSpeed top2/topk gating);
    ``combine_accumulate`` "float32" | "input" (fp32 sums for bf16/fp16, as Megatron/DeepSpeed).
    """

    def __init__(self, d_model: int, d_ffn: int, num_experts: int, top_k: int, *,
                 score: str = "softmax", normalize: bool | None = None, num_shared: int = 0,
                 activation: str = "swiglu", gemm: str = "sequential",
                 capacity_factor: float | None = None, drop_policy: str = "probs",
                 renormalize_after_drop: bool = False, combine_accumulate: str = "float32",
                 expert_parallel: bool = False,
                 ep_group=None, placement: ExpertPlacement | None = None,
                 all_to_all: str = "flat", dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__()
        self.d_model, self.d_ffn, self.num_experts, self.top_k = d_model, d_ffn, num_experts, top_k
        # Gating semantics (defaults: X-MoE's; see pft.DROP_POLICIES for the peers each names).
        if drop_policy not in DROP_POLICIES:
            raise ValueError(f"drop_policy must be one of {', '.join(DROP_POLICIES)}, got {drop_policy!r}")
        if combine_accumulate not in COMBINE_ACCUMULATE:
            raise ValueError(f"combine_accumulate must be one of {COMBINE_ACCUMULATE}, "
                             f"got {combine_accumulate!r}")
        self.capacity_factor, self.drop_policy = capacity_factor, drop_policy
        self.renormalize_after_drop, self.combine_accumulate = renormalize_after_drop, combine_accumulate
        self.expert_parallel, self.ep_group = expert_parallel, ep_group
        layer_forms = algorithm_names(layer_form=True)  # the registry's differentiable forms
        if all_to_all not in layer_forms:
            raise ValueError(f"all_to_all must be one of {', '.join(layer_forms)}, got {all_to_all!r}")
        self.all_to_all = all_to_all
        if expert_parallel:
            world, self.ep_rank = dist.get_world_size(ep_group), dist.get_rank(ep_group)
            self.placement = placement or ExpertPlacement.contiguous(num_experts, world)
            if self.placement.world_size != world:
                raise ValueError(f"placement is for {self.placement.world_size} ranks, "
                                 f"the EP group has {world}")
        else:
            self.ep_rank = 0
            self.placement = placement or ExpertPlacement.contiguous(num_experts, 1)
            if self.placement.world_size != 1:
                raise ValueError("a multi-rank placement needs expert_parallel=True")
        if self.placement.num_experts != num_experts:
            raise ValueError(f"placement covers {self.placement.num_experts} experts, layer has {num_experts}")
        self.local_experts = list(self.placement.experts_of_rank[self.ep_rank])
        kw = {"dtype": dtype, "device": device}
        self.gate = TopKGate(d_model, num_experts, top_k, score, normalize, **kw)
        self.experts = ExpertMLP(len(self.local_experts), d_model, d_ffn, activation, gemm, **kw)
        # DeepSeek-MoE shared experts: always active, so one dense FFN num_shared * d_ffn wide.
        self.shared = (ExpertMLP(1, d_model, num_shared * d_ffn, activation, "sequential", **kw)
                       if num_shared else None)

    # --- stages (X-MoE Fig. 11 names) ---------------------------------------------------------
    def route(self, x: torch.Tensor) -> GateOutput:
        """Gating: logits, scores, top-k."""
        return self.gate(x)

    def make_pft(self, gate_out: GateOutput) -> PFT:
        capacity = (None if self.capacity_factor is None else
                    expert_capacity(gate_out.top_experts.shape[0], self.num_experts, self.top_k,
                                    self.capacity_factor))
        return build_pft(gate_out.top_experts, gate_out.combine_weights, self.num_experts, capacity,
                         drop_policy=self.drop_policy, renormalize=self.renormalize_after_drop)

    def buffer_dispatch(self, x: torch.Tensor, pft: PFT) -> torch.Tensor:
        return gather_tokens(x, pft)

    def dispatch_alltoall(self, dispatch_in: torch.Tensor, pft: PFT) -> tuple[torch.Tensor, DispatchPlan]:
        """Send each rank the rows of its experts; return them grouped by local expert."""
        if not self.expert_parallel:
            return dispatch_in, DispatchPlan(tokens_per_local_expert=pft.tokens_per_expert)
        world = self.placement.world_size
        # One small collective: every rank's tokens_per_expert ([W, E] int64).
        counts = [torch.empty_like(pft.tokens_per_expert) for _ in range(world)]
        dist.all_gather(counts, pft.tokens_per_expert.contiguous(), group=self.ep_group)
        counts_all = torch.stack(counts).cpu()                          # [W, E]
        mine = pft.tokens_per_expert.cpu()
        send_counts = [int(mine[list(experts)].sum()) for experts in self.placement.experts_of_rank]
        local = self.local_experts
        from_source = counts_all[:, local]                              # [W, E_local]
        recv_counts = [int(c) for c in from_source.sum(1).tolist()]
        send_order = None
        if not self.placement.is_contiguous:  # PFT rows are expert-major; make them rank-major
            rank_of_row = self.placement.rank_of_expert().to(pft.expert_ids.device)[pft.expert_ids]
            send_order = torch.argsort(rank_of_row, stable=True)
            dispatch_in = dispatch_in.index_select(0, send_order)
        received = get_algorithm(self.all_to_all).all_to_all_v(dispatch_in, send_counts, recv_counts,
                                                               group=self.ep_group)
        # Received rows are source-major, each source's rows expert-major: regroup by expert.
        local_expert_of_row = torch.repeat_interleave(
            torch.arange(len(local)).repeat(world), from_source.reshape(-1)).to(received.device)
        expert_order = torch.argsort(local_expert_of_row, stable=True)
        plan = DispatchPlan(tokens_per_local_expert=from_source.sum(0), send_counts=send_counts,
                            recv_counts=recv_counts, send_order=send_order, expert_order=expert_order)
        return received.index_select(0, expert_order), plan

    def expert_compute(self, expert_in: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
        return self.experts(expert_in, plan.tokens_per_local_expert)

    def combine_alltoall(self, expert_out: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
        """Reverse of dispatch_alltoall: rows come back in PFT order."""
        if not plan.expert_parallel:
            return expert_out
        source_major = expert_out.index_select(0, inverse_permutation(plan.expert_order))
        back = get_algorithm(self.all_to_all).all_to_all_v(source_major, plan.recv_counts,
                                                           plan.send_counts, group=self.ep_group)
        if plan.send_order is not None:
            back = back.index_select(0, inverse_permutation(plan.send_order))
        return back

    def buffer_combine(self, combine_in: torch.Tensor, pft: PFT) -> torch.Tensor:
        return scatter_combine(combine_in, pft, self.combine_accumulate)

    # --- the layer ----------------------------------------------------------------------------
    def routed(self, x: torch.Tensor, gate_out: GateOutput) -> torch.Tensor:
        pft = self.make_pft(gate_out)
        expert_in, plan = self.dispatch_alltoall(self.buffer_dispatch(x, pft), pft)
        expert_out = self.expert_compute(expert_in, plan)
        return self.buffer_combine(self.combine_alltoall(expert_out, plan), pft)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [S, H] -> [S, H]."""
        if x.dim() != 2 or x.shape[1] != self.d_model:
            raise ValueError(f"x must be [S, {self.d_model}], got shape {tuple(x.shape)}")
        out = self.routed(x, self.route(x))
        if self.shared is not None:
            out = out + self.shared(x, torch.tensor([x.shape[0]]))
        return out
