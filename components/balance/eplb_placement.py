"""Replica placement in the style of DeepSeek's EPLB: replicate the heaviest experts, pack the
replicas onto GPUs, with two fixes where that algorithm is known to be weak.

1. Replication (as EPLB's ``replicate_experts``): with S = G * slots_per_gpu >= E slots, start
   from one replica per expert and give each extra slot to the expert with the largest load per
   replica (load_e / replicas_e), ties to the lower id.
2. Packing (EPLB's ``balanced_packing``: heaviest item first to the lightest bin with room),
   but a replica never lands on a GPU that already holds a replica of the same expert (EPLB can
   co-locate them, which wastes a slot: two replicas on one GPU balance nothing). Each replica
   carries load_e / replicas_e.
3. Against a previous placement, GPU labels are then matched to the previous GPUs to keep as
   many (GPU, expert) replicas where they already are (greedy maximum overlap, largest first),
   and the bytes moved are counted: a replica whose expert was not on that GPU before moves
   ``expert_bytes`` (weights, plus optimizer state if training, Piper Sec. VI-A).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReplicaPlacement:
    experts_of_gpu: list[list[int]]      # expert id per slot
    replicas: list[int]                  # per expert
    gpu_loads: list[float]
    moved_replicas: int = 0
    moved_bytes: int = 0


def replicate(loads: list[float], total_slots: int) -> list[int]:
    if total_slots < len(loads):
        raise ValueError(f"{total_slots} slots cannot hold {len(loads)} experts")
    replicas = [1] * len(loads)
    for _ in range(total_slots - len(loads)):
        e = max(range(len(loads)), key=lambda i: (loads[i] / replicas[i], -i))
        replicas[e] += 1
    return replicas


def place_replicas(loads, gpus: int, slots_per_gpu: int, previous: list[list[int]] | None = None,
                   expert_bytes: int = 0) -> ReplicaPlacement:
    loads = [float(x) for x in loads]
    if gpus <= 0 or slots_per_gpu <= 0:
        raise ValueError("gpus and slots_per_gpu must be positive")
    replicas = replicate(loads, gpus * slots_per_gpu)
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
    placement = ReplicaPlacement(bins, replicas, bin_load)
    if previous is not None:
        _match_previous(placement, previous, expert_bytes)
    return placement


def _match_previous(p: ReplicaPlacement, previous: list[list[int]], expert_bytes: int) -> None:
    """Relabel the new bins onto physical GPUs to keep the most replicas in place."""
    gpus = len(p.experts_of_gpu)
    if len(previous) != gpus:
        raise ValueError(f"previous placement has {len(previous)} GPUs, new one {gpus}")
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
