"""Replica plans in the style of DeepSeek's EPLB: replicate the heaviest experts, pack the
replicas onto GPUs, with two fixes where that algorithm is known to be weak.

A replica plan says how many copies each expert has and which GPU slots hold them; it is not an
ExpertPlacement (one home rank per expert), which is what "placement" means elsewhere.

1. Replication (as EPLB's ``replicate_experts``): with S = G * slots_per_gpu >= E slots, start
   from one replica per expert and give each extra slot to the expert with the largest load per
   replica (load_e / replicas_e), ties to the lower id. With ``max_replicas``, an expert at that
   many replicas gets no more slots.
2. Packing (EPLB's ``balanced_packing``: heaviest item first to the lightest bin with room),
   but a replica never lands on a GPU that already holds a replica of the same expert (EPLB can
   co-locate them, which wastes a slot: two replicas on one GPU balance nothing). Each replica
   carries load_e / replicas_e.
3. Against a previous plan, GPU labels are then matched to the previous GPUs to keep as many
   (GPU, expert) replicas where they already are (greedy maximum overlap, largest first), and
   the bytes moved are counted: a replica whose expert was not on that GPU before moves
   ``expert_bytes`` (weights, plus optimizer state if training, Piper Sec. VI-A).

As a registered balancer ("EPLB"): the plan is made from the previous micro-batch's counts with
``redundant_slots`` extra slots per device (at most one replica of an expert per device), and
each expert's actual rows are split evenly over its replicas, as step 2 assumes.
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_repro.components.balance import register_balancer
from moe_repro.components.balance.base import Balancer, BalanceStep, DeviceWork


@dataclass
class ReplicaPlan:
    experts_of_gpu: list[list[int]]      # expert id per slot
    replicas: list[int]                  # per expert
    gpu_loads: list[float]
    moved_replicas: int = 0
    moved_bytes: int = 0


def replicate(loads: list[float], total_slots: int, max_replicas: int | None = None) -> list[int]:
    """Replicas per expert: one each, then every extra slot to the largest load per replica."""
    if total_slots < len(loads):
        raise ValueError(f"{total_slots} slots cannot hold {len(loads)} experts")
    if max_replicas is not None and total_slots > max_replicas * len(loads):
        raise ValueError(f"{total_slots} slots need more than {max_replicas} replicas of some expert")
    replicas = [1] * len(loads)
    for _ in range(total_slots - len(loads)):
        below_cap = [i for i in range(len(loads)) if max_replicas is None or replicas[i] < max_replicas]
        e = max(below_cap, key=lambda i: (loads[i] / replicas[i], -i))
        replicas[e] += 1
    return replicas


def plan_replicas(loads, gpus: int, slots_per_gpu: int, previous: list[list[int]] | None = None,
                  expert_bytes: int = 0, max_replicas: int | None = None) -> ReplicaPlan:
    """Replicate and pack ``loads`` onto ``gpus`` x ``slots_per_gpu`` slots (module docstring).
    ``previous``: the experts_of_gpu of the plan in force, to keep replicas in place.
    ``max_replicas``: cap the replicas per expert (at most ``gpus``); without it, a plan needing
    more replicas of one expert than there are GPUs is refused."""
    loads = [float(x) for x in loads]
    if gpus <= 0 or slots_per_gpu <= 0:
        raise ValueError("gpus and slots_per_gpu must be positive")
    if max_replicas is not None and not 1 <= max_replicas <= gpus:
        raise ValueError(f"max_replicas must be in 1..{gpus} (one replica per GPU), got {max_replicas}")
    replicas = replicate(loads, gpus * slots_per_gpu, max_replicas)
    if max(replicas) > gpus:
        raise ValueError(f"an expert needs {max(replicas)} replicas but there are only {gpus} GPUs "
                         "(replicas of one expert must sit on different GPUs)")
    items = sorted(((loads[e] / replicas[e], e) for e in range(len(loads)) for _ in range(replicas[e])),
                   key=lambda t: (-t[0], t[1]))
    bins: list[list[int]] = [[] for _ in range(gpus)]
    bin_load = [0.0] * gpus
    for load, e in items:
        open_bins = [g for g in range(gpus) if len(bins[g]) < slots_per_gpu and e not in bins[g]]
        if not open_bins:   # only reachable when the slots left all hold e: swap with another bin
            raise ValueError("packing failed: no GPU with a free slot lacks this expert")
        g = min(open_bins, key=lambda b: (bin_load[b], b))
        bins[g].append(e)
        bin_load[g] += load
    plan = ReplicaPlan(bins, replicas, bin_load)
    if previous is not None:
        _match_previous(plan, previous, expert_bytes)
    return plan


def _match_previous(p: ReplicaPlan, previous: list[list[int]], expert_bytes: int) -> None:
    """Relabel the new bins onto physical GPUs to keep the most replicas in place."""
    gpus = len(p.experts_of_gpu)
    if len(previous) != gpus:
        raise ValueError(f"previous plan has {len(previous)} GPUs, new one {gpus}")
    overlap = [[len(set(new) & set(old)) for old in previous] for new in p.experts_of_gpu]
    pairs = sorted(((overlap[n][o], n, o) for n in range(gpus) for o in range(gpus)),
                   key=lambda t: (-t[0], t[1], t[2]))
    gpu_of_bin, used_bins, used_gpus = {}, set(), set()
    for _, n, o in pairs:
        if n not in used_bins and o not in used_gpus:
            gpu_of_bin[n] = o
            used_bins.add(n)
            used_gpus.add(o)
    bins, loads = [None] * gpus, [0.0] * gpus
    for n, o in gpu_of_bin.items():
        bins[o], loads[o] = p.experts_of_gpu[n], p.gpu_loads[n]

    def moved(layout):
        return sum(1 for g in range(gpus) for e in set(layout[g]) if e not in previous[g])

    # Greedy matching is not optimal in every case: never do worse than keeping the labels.
    if moved(bins) <= moved(p.experts_of_gpu):
        p.experts_of_gpu, p.gpu_loads = bins, loads
    p.moved_replicas = moved(p.experts_of_gpu)
    p.moved_bytes = p.moved_replicas * expert_bytes


def split_rows(counts: list[int], plan: ReplicaPlan) -> list[list[int]]:
    """Rows of each slot when every expert's rows are split evenly over its replicas: c // r
    each, and the first c % r replicas (in GPU order) one more."""
    seen = [0] * len(counts)
    out = []
    for experts in plan.experts_of_gpu:
        rows = []
        for e in experts:
            r = plan.replicas[e]
            rows.append(counts[e] // r + (1 if seen[e] < counts[e] % r else 0))
            seen[e] += 1
        out.append(rows)
    return out


def _replay_plan(step: BalanceStep, knobs: dict) -> DeviceWork:
    """A replica plan from the previous micro-batch's counts, the actual rows split over it;
    ``decision`` is the ReplicaPlan."""
    world, experts = step.placement.world_size, step.placement.num_experts
    if experts % world:
        raise ValueError(f"EPLB needs the same number of experts per device: {experts} over {world}")
    slots_per_device = experts // world + knobs["redundant_slots"]
    plan = plan_replicas(step.previous_counts.tolist(), world, slots_per_device, max_replicas=world)
    groups = split_rows(step.counts.tolist(), plan)
    return DeviceWork([sum(g) for g in groups], groups, decision=plan)


register_balancer(Balancer(
    name="EPLB",
    paper="DeepSeek EPLB (replicate_experts, balanced_packing), as in this module",
    description="heaviest experts (from the previous micro-batch) replicated into spare slots, "
                "replicas packed onto the lightest devices",
    needs_history=True,
    knobs={"redundant_slots": 1},
    plan=_replay_plan,
))
