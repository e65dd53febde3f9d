"""Capacity-padded MoE layer: the GShard / DeepSpeed-MoE pipeline X-MoE replaces (App. A, Fig. 2/16).

    gate -> dispatch_mask [S, E, C] (cumsum positions) -> einsum "sec,sh->ech" into [E, C, H]
         -> even all-to-all -> batched expert MLP on [E_local, W*C, H] -> even all-to-all back
         -> einsum "sec,ech->sh" with the combine tensor [S, E, C]

Capacity C = ceil(capacity_factor * S * k / E). Positions inside an expert's buffer follow
GShard's priority: all first choices in token order, then all second choices, ...; a pair whose
position is >= C is dropped. (X-MoE's PFT drops by combine weight instead, App. B.2; the two
agree whenever nothing is dropped.) Empty slots stay zero and travel through both all-to-alls
and the expert GEMMs: that is the padding whose cost X-MoE Fig. 11 and Table 4 measure.

Memory: dispatch_mask and combine tensor S*E*C elements each; buffers E*C*H each way.
Bytes on the wire per rank and direction: E*C*H*itemsize*(W-1)/W, whatever the routing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from moe_repro.components.alltoall.flat import all_to_all_v
from moe_repro.components.moe.gating import GateOutput
from moe_repro.components.moe.moe_layer import MoELayer, expert_capacity


def capacity_positions(top_experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Slot of each (token, choice) pair in its expert's buffer, GShard priority order -> [S, k].

    The one-hot [k*S, E] is cumsum-ed over choice-major rows, as DeepSpeed's top2gating does for
    k = 2 (locations2 = cumsum(mask2) - 1 + sum(mask1)).
    """
    num_tokens, top_k = top_experts.shape
    one_hot = torch.nn.functional.one_hot(top_experts.t().reshape(-1), num_experts)  # [k*S, E]
    positions = (torch.cumsum(one_hot, dim=0) - 1) * one_hot
    return positions.sum(dim=1).view(top_k, num_tokens).t()


def dispatch_and_combine_masks(
    gate_out: GateOutput, num_experts: int, capacity: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """dispatch_mask [S, E, C] (0/1) and combine tensor [S, E, C] (weights), dense, as DeepSpeed."""
    experts, weights = gate_out.top_experts, gate_out.combine_weights
    positions = capacity_positions(experts, num_experts)
    kept = positions < capacity
    slot = torch.nn.functional.one_hot(positions.clamp(max=capacity - 1), capacity)  # [S, k, C]
    expert = torch.nn.functional.one_hot(experts, num_experts)  # [S, k, E]
    pair = (expert * kept.unsqueeze(-1)).to(weights.dtype)
    dispatch_mask = torch.einsum("ske,skc->sec", pair, slot.to(weights.dtype))
    combine = torch.einsum("ske,skc->sec", pair * weights.unsqueeze(-1), slot.to(weights.dtype))
    return dispatch_mask, combine


class PaddedMoELayer(MoELayer):
    """Same parameters as :class:`MoELayer` (state dicts are interchangeable), padded pipeline."""

    def __init__(self, *args, capacity_factor: float = 1.25, **kwargs):
        super().__init__(*args, capacity_factor=capacity_factor, **kwargs)
        if not self.placement.is_contiguous:
            raise ValueError("the padded layer's even all-to-all needs a contiguous placement")
        if len({len(e) for e in self.placement.experts_of_rank}) != 1:
            raise ValueError("the padded layer needs the same number of experts on every rank")

    def capacity(self, num_tokens: int) -> int:
        """C from this rank's S; under EP the max over ranks, so every all-to-all chunk is equal
        (DeepSpeed-MoE all-reduces the capacity the same way when ranks' S differ)."""
        if self.capacity_factor is None:
            raise ValueError("the padded layer needs a capacity_factor")
        cap = expert_capacity(num_tokens, self.num_experts, self.top_k, self.capacity_factor)
        if self.expert_parallel:
            t = torch.tensor([cap], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ep_group)
            cap = int(t.item())
        return cap

    def make_masks(self, gate_out: GateOutput) -> tuple[torch.Tensor, torch.Tensor]:
        return dispatch_and_combine_masks(
            gate_out, self.num_experts, self.capacity(gate_out.top_experts.shape[0])
        )

    def buffer_dispatch_padded(self, x: torch.Tensor, dispatch_mask: torch.Tensor) -> torch.Tensor:
        return torch.einsum("sec,sh->ech", dispatch_mask.to(x.dtype), x)

    def dispatch_alltoall_padded(self, buffers: torch.Tensor) -> torch.Tensor:
        """[E, C, H] -> [E_local, W*C, H]: every rank sends E_local*C rows to every rank."""
        if not self.expert_parallel:
            return buffers
        world, (experts, cap, hidden) = self.placement.world_size, buffers.shape
        local = experts // world
        rows = [local * cap] * world
        received = all_to_all_v(
            buffers.reshape(experts * cap, hidden), rows, rows, group=self.ep_group
        )
        # received: [W(source), E_local, C, H] -> expert-major [E_local, W*C, H]
        return (
            received.view(world, local, cap, hidden)
            .transpose(0, 1)
            .reshape(local, world * cap, hidden)
        )

    def expert_compute_padded(self, expert_in: torch.Tensor) -> torch.Tensor:
        return self.experts.forward_padded(expert_in)

    def combine_alltoall_padded(self, expert_out: torch.Tensor, capacity: int) -> torch.Tensor:
        if not self.expert_parallel:
            return expert_out
        world = self.placement.world_size
        local, _, hidden = expert_out.shape
        source_major = (
            expert_out.view(local, world, capacity, hidden).transpose(0, 1).reshape(-1, hidden)
        )
        rows = [local * capacity] * world
        back = all_to_all_v(source_major, rows, rows, group=self.ep_group)
        return back.view(self.num_experts, capacity, hidden)

    def buffer_combine_padded(
        self, combine_in: torch.Tensor, combine: torch.Tensor
    ) -> torch.Tensor:
        return torch.einsum("sec,ech->sh", combine.to(combine_in.dtype), combine_in)

    def routed(self, x: torch.Tensor, gate_out: GateOutput) -> torch.Tensor:
        dispatch_mask, combine = self.make_masks(gate_out)
        expert_in = self.dispatch_alltoall_padded(self.buffer_dispatch_padded(x, dispatch_mask))
        expert_out = self.expert_compute_padded(expert_in)
        return self.buffer_combine_padded(
            self.combine_alltoall_padded(expert_out, dispatch_mask.shape[2]), combine
        )
