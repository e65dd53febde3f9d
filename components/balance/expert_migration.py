"""Piper's expert migration (Piper Sec. VI-A): Alg. 2 hill-climbing swaps, a threshold-triggered
scheduler, its cost from components/balance/migration_cost.py, and a swap applied to a live MoE layer.

Alg. 2 (Hill-Climbing Swap-Based Minimal Rebalancing), as printed: repeat at most T = 100 times:
take the most and least loaded groups k+ and k- (loads s_k = sum of their experts' loads),
delta = s_{k+} - s_{k-}; among all pairs (expert of k+, expert of k-) pick the swap that reduces
|s_{k+}' - s_{k-}'| the most (strictly below delta); apply it, or stop when none exists.

Why the max-min gap never grows: a swap keeps s_{k+} + s_{k-} and makes |s_{k+}' - s_{k-}'| <
delta, so both new sums lie strictly inside (s_{k-}, s_{k+}); no other group changes, so the
global max cannot rise and the global min cannot fall. Why it terminates even without T: the
sum of squared group loads drops by 2 n (delta - n) > 0 with n = n1 - n2 at each swap (see
tests/test_expert_migration.py, which checks both properties with hypothesis).

A swap on a live layer moves the two experts' weights *and* their optimizer state and permutes
the router's view (the gate's output columns), so the layer computes the same function, and its
gradients and optimizer state are the same up to that permutation (:func:`swap_expert_slots`).

As a registered balancer ("Piper migration"): Alg. 2 on the previous micro-batch's counts,
starting from the home placement at every micro-batch (no threshold, no carried state, moves not
charged); the experts then compute whole where the swaps put them. The threshold-triggered
scheduler with its cost is :class:`MigrationScheduler`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from moe_repro.components.balance.registry import register_balancer
from moe_repro.components.balance.base import Balancer, BalanceStep, DeviceWork, work_of_placement
from moe_repro.components.balance.migration_cost import moves_send_bytes_per_gpu


@dataclass(frozen=True)
class Swap:
    expert_a: int  # leaves group_a (the most loaded) for group_b
    group_a: int
    expert_b: int  # leaves group_b (the least loaded) for group_a
    group_b: int


def hill_climb_swaps(
    groups: list[list[int]], loads, max_iters: int = 100
) -> tuple[list[list[int]], list[Swap]]:
    """Piper Alg. 2. ``groups[k]``: expert ids on GPU k; ``loads[e]``: tokens of expert e.

    Returns the rebalanced groups (new lists, same position for a swapped-in expert) and the
    swaps applied in order (c = len(swaps)). Ties pick the lowest index (argmax/argmin first).
    """
    if max_iters < 0:
        raise ValueError(f"max_iters must be >= 0, got {max_iters}")
    load = [float(v) for v in torch.as_tensor(loads, dtype=torch.float64).tolist()]
    seen = sorted(e for g in groups for e in g)
    if len(seen) != len(set(seen)) or any(not 0 <= e < len(load) for e in seen):
        raise ValueError("groups must hold distinct expert ids that index loads")
    groups = [list(g) for g in groups]
    swaps: list[Swap] = []
    if len(groups) < 2:
        return groups, swaps
    for _ in range(max_iters):  # line 2
        sums = [sum(load[e] for e in g) for g in groups]  # line 3
        k_max = max(range(len(sums)), key=lambda k: (sums[k], -k))  # line 4
        k_min = min(range(len(sums)), key=lambda k: (sums[k], k))  # line 5
        delta = sums[k_max] - sums[k_min]  # line 6
        best, best_gain = None, 0.0  # line 7
        for i, e1 in enumerate(groups[k_max]):  # line 8
            for j, e2 in enumerate(groups[k_min]):  # line 9
                n1, n2 = load[e1], load[e2]
                new_delta = abs((sums[k_max] - n1 + n2) - (sums[k_min] - n2 + n1))  # line 10
                if new_delta < delta and delta - new_delta > best_gain:  # line 11
                    best, best_gain = (i, j), delta - new_delta  # line 12
        if best is None:  # line 17-18
            break
        i, j = best  # line 14
        e1, e2 = groups[k_max][i], groups[k_min][j]
        groups[k_max][i], groups[k_min][j] = e2, e1  # line 15
        swaps.append(Swap(e1, k_max, e2, k_min))  # line 16
    return groups, swaps


def _replay_plan(step: BalanceStep, knobs: dict) -> DeviceWork:
    """Alg. 2 from the home placement on the previous micro-batch's counts; ``decision`` is the
    list of swaps."""
    groups, swaps = hill_climb_swaps(
        [list(ex) for ex in step.placement.experts_of_rank],
        step.previous_counts,
        knobs["max_swaps"],
    )
    work = work_of_placement(step.counts, groups)
    work.decision = swaps
    return work


register_balancer(
    Balancer(
        name="Piper migration",
        paper="Piper Sec. VI-A, Alg. 2",
        description="hill-climbing swaps of experts between the most and least loaded devices",
        needs_history=True,
        knobs={"max_swaps": 100},
        plan=_replay_plan,
    )
)


def swaps_to_moves(swaps: list[Swap]) -> list[tuple[int, int]]:
    """Each swap is two expert moves (source GPU, destination GPU)."""
    return [m for s in swaps for m in ((s.group_a, s.group_b), (s.group_b, s.group_a))]


@dataclass
class MigrationEvent:
    step: int
    gap_before: float
    gap_after: float
    imbalance_before: float
    swaps: list[Swap]
    send_bytes_per_gpu: list[int]
    latency_s: float


@dataclass
class MigrationScheduler:
    """Threshold-triggered migration (Piper Sec. VI-A: "an external scheduler ... inspects the
    growing load imbalance, and whenever it crosses a pre-determined threshold" runs Alg. 2).

    ``observe(expert_counts)`` accumulates counts since the last check; every ``check_every``
    steps it computes imbalance = (max - min) / mean of the per-GPU loads and, above
    ``threshold``, runs Alg. 2 on the accumulated loads, updates the placement and records the
    cost: bytes per GPU from migration_cost.moves_send_bytes_per_gpu (48 d_model d_ffn per
    expert), latency = busiest sender / bandwidth. Overhead is amortised over all observed steps.
    """

    groups: list[list[int]]
    d_model: int
    d_ffn: int
    threshold: float = 0.2
    check_every: int = 10
    bandwidth_bytes_per_s: float = 50e9
    max_iters: int = 100
    n_mat: int = 3
    steps: int = 0
    events: list[MigrationEvent] = field(default_factory=list)
    _window: torch.Tensor | None = None

    def rank_of_expert(self) -> list[int]:
        out = [0] * sum(len(g) for g in self.groups)
        for k, g in enumerate(self.groups):
            for e in g:
                out[e] = k
        return out

    def device_loads(self, expert_counts) -> list[float]:
        c = torch.as_tensor(expert_counts, dtype=torch.float64)
        return [float(c[g].sum()) for g in self.groups]

    def observe(self, expert_counts) -> MigrationEvent | None:
        c = torch.as_tensor(expert_counts, dtype=torch.float64)
        self._window = c.clone() if self._window is None else self._window + c
        self.steps += 1
        if self.steps % self.check_every:
            return None
        window, self._window = self._window, None
        loads = self.device_loads(window)
        mean = sum(loads) / len(loads)
        imbalance = (max(loads) - min(loads)) / mean if mean else 0.0
        if imbalance <= self.threshold:
            return None
        new_groups, swaps = hill_climb_swaps(self.groups, window, self.max_iters)
        if not swaps:
            return None
        sent = moves_send_bytes_per_gpu(
            swaps_to_moves(swaps), self.d_model, self.d_ffn, len(self.groups), self.n_mat
        )
        new_loads = self.device_loads_for(new_groups, window)
        event = MigrationEvent(
            self.steps,
            max(loads) - min(loads),
            max(new_loads) - min(new_loads),
            imbalance,
            swaps,
            sent,
            max(sent) / self.bandwidth_bytes_per_s,
        )
        self.groups = new_groups
        self.events.append(event)
        return event

    @staticmethod
    def device_loads_for(groups: list[list[int]], counts: torch.Tensor) -> list[float]:
        return [float(counts[g].sum()) for g in groups]

    def total_migration_s(self) -> float:
        return sum(e.latency_s for e in self.events)

    def amortised_overhead(self, step_time_s: float) -> float:
        """Migration time as a fraction of training time over the observed steps."""
        if step_time_s <= 0 or self.steps == 0:
            raise ValueError("need a positive step time and at least one observed step")
        return self.total_migration_s() / (self.steps * step_time_s)


# --- a swap on a live layer ---------------------------------------------------------------------


def _swap_rows(t: torch.Tensor, a: int, b: int, dim: int) -> None:
    idx = torch.tensor([a, b], device=t.device)
    t.index_copy_(dim, idx, t.index_select(dim, idx.flip(0)))


def expert_slot_tensors(layer) -> list[tuple[torch.nn.Parameter, int]]:
    """(parameter, expert dim) of everything indexed by expert slot in a components MoELayer:
    the stacked expert weights (dim 0) and the router's output columns (gate.weight [H, E])."""
    out = [
        (p, 0)
        for p in (layer.experts.w_in, layer.experts.w_gate, layer.experts.w_out)
        if p is not None
    ]
    out.append((layer.gate.weight, 1))
    return out


@torch.no_grad()
def swap_expert_slots(layer, optimizer: torch.optim.Optimizer | None, a: int, b: int) -> None:
    """Exchange the experts in slots a and b of a single-process MoELayer, with their optimizer
    state (every per-parameter state tensor shaped like the parameter, e.g. Adam's exp_avg and
    exp_avg_sq) and the router's columns, so that logical expert identity follows the weights.
    Gradients present in ``.grad`` are permuted too."""
    if layer.expert_parallel:
        raise ValueError(
            "swap_expert_slots is for a single-process layer; across EP ranks the "
            "same tensors travel with an all-to-all (Piper Sec. VI-A)"
        )
    n = layer.experts.num_experts
    if not (0 <= a < n and 0 <= b < n):
        raise ValueError(f"slots {a}, {b} outside 0..{n - 1}")
    if a == b:
        return
    for p, dim in expert_slot_tensors(layer):
        _swap_rows(p.data, a, b, dim)
        if p.grad is not None:
            _swap_rows(p.grad, a, b, dim)
        if optimizer is not None:
            for value in optimizer.state.get(p, {}).values():
                if torch.is_tensor(value) and value.shape == p.shape:
                    _swap_rows(value, a, b, dim)


@torch.no_grad()
def migrate_ep_layer(layer, optimizer: torch.optim.Optimizer | None, new_placement) -> int:
    """Move experts between the EP ranks of a components MoELayer to ``new_placement``.

    Every expert whose owner changes travels as one row per tensor (its weights, and every
    optimizer state tensor shaped like its parameter, e.g. Adam's exp_avg and exp_avg_sq) in one
    all-to-all-v over the layer's EP group; the same Parameter objects get the new local stacks
    (sorted by expert id), so the optimizer keeps tracking them. The router is replicated and
    indexes logical experts, so its "view" is the placement (logical expert -> rank), which is
    replaced. Returns the bytes this rank sent (Piper Sec. VI-A: weights + training state).
    """
    import torch.distributed as dist

    from moe_repro.components.network.comm import TorchComm

    if not layer.expert_parallel:
        raise ValueError("migrate_ep_layer needs an expert-parallel layer")
    if (
        new_placement.world_size != layer.placement.world_size
        or new_placement.num_experts != layer.placement.num_experts
    ):
        raise ValueError("the new placement must cover the same experts and ranks")
    world, me = layer.placement.world_size, layer.ep_rank
    old_local = list(layer.local_experts)
    new_rank = new_placement.rank_of_expert().tolist()
    new_local = list(new_placement.experts_of_rank[me])
    order = sorted(range(len(old_local)), key=lambda i: (new_rank[old_local[i]], old_local[i]))
    send_counts = [sum(1 for e in old_local if new_rank[e] == d) for d in range(world)]
    old_rank = layer.placement.rank_of_expert().tolist()
    recv_counts = [sum(1 for e in new_local if old_rank[e] == s) for s in range(world)]
    # Received rows are source-major, each source's rows by expert id: where they go locally.
    arrived = [e for s in range(world) for e in sorted(new_local) if old_rank[e] == s]
    place = torch.tensor([arrived.index(e) for e in new_local], dtype=torch.int64)
    idx = torch.tensor(order, dtype=torch.int64)
    comm = TorchComm.of_group(layer.ep_group)
    sent_bytes = 0
    for p, _ in expert_slot_tensors(layer)[:-1]:  # the stacked expert weights only
        tensors = [p.data]
        state = optimizer.state.get(p, {}) if optimizer is not None else {}
        keys = [k for k, v in state.items() if torch.is_tensor(v) and v.shape == p.shape]
        tensors += [state[k] for k in keys]
        moved = []
        for t in tensors:
            rows = t.index_select(0, idx.to(t.device)).reshape(len(order), -1).contiguous()
            got = comm.alltoallv(rows, send_counts, recv_counts, "migration")
            moved.append(
                got.index_select(0, place.to(t.device)).reshape(len(new_local), *t.shape[1:])
            )
            sent_bytes += (
                sum(c for d, c in enumerate(send_counts) if d != me)
                * rows.shape[1]
                * t.element_size()
            )
        p.data = moved[0]
        for k, t in zip(keys, moved[1:]):
            state[k] = t
    layer.set_placement(new_placement)  # its dispatcher routes to where the experts now live
    dist.barrier(group=layer.ep_group)
    return sent_bytes
