"""Replica plans in the style of DeepSeek's EPLB: replicate the heaviest experts, pack the
replicas onto GPUs, with two fixes where that algorithm is known to be weak. Two policies, as in
EPLB's ``rebalance_experts``: "global" and "hierarchical".

A replica plan says how many copies each expert has and which GPU slots hold them; it is not an
ExpertPlacement (one home rank per expert), which is what "placement" means elsewhere.

Global: 1. replication (EPLB's ``replicate_experts``: each extra slot to the expert with the
largest load per replica, ties to the lower id, ``max_replicas`` caps); 2. packing (EPLB's
``balanced_packing``), but two replicas of one expert never share a GPU; 3. against a previous
plan, GPU labels are matched to keep replicas in place, and the bytes moved are counted
(weights, plus optimizer state if training, Piper Sec. VI-A).
Hierarchical (EPLB's ``rebalance_experts_hierarchical``): expert groups are packed onto nodes,
then replicated and packed within each node, so every replica sits on its group's node and a
group-limited router (DeepSeek-V3 Sec. 2.1.2) reaches at most M nodes.

As a registered balancer ("EPLB") it plans with the global policy only, from the previous
micro-batch's counts, with ``redundant_slots`` per device; ``dispatch_traffic`` counts the bytes
one dispatch puts across nodes under a plan.

Why: replication evens the load of hot experts that moving whole experts cannot. The steps, the
policies and every place where ours differs from EPLB's source: see docs/balancers.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_repro.components.balance.registry import register_balancer
from moe_repro.components.balance.base import Balancer, BalanceStep, DeviceWork


POLICIES = ("global", "hierarchical")


@dataclass
class ReplicaPlan:
    experts_of_gpu: list[list[int]]  # expert id per slot
    replicas: list[int]  # per expert
    gpu_loads: list[float]
    moved_replicas: int = 0
    moved_bytes: int = 0
    node_of_group: list[int] | None = None  # hierarchical policy: the node each group is packed on


def replicate(loads: list[float], total_slots: int, max_replicas: int | None = None) -> list[int]:
    """Replicas per expert: one each, then every extra slot to the largest load per replica."""
    if total_slots < len(loads):
        raise ValueError(f"{total_slots} slots cannot hold {len(loads)} experts")
    if max_replicas is not None and total_slots > max_replicas * len(loads):
        raise ValueError(
            f"{total_slots} slots need more than {max_replicas} replicas of some expert"
        )
    replicas = [1] * len(loads)
    for _ in range(total_slots - len(loads)):
        below_cap = [
            i for i in range(len(loads)) if max_replicas is None or replicas[i] < max_replicas
        ]
        e = max(below_cap, key=lambda i: (loads[i] / replicas[i], -i))
        replicas[e] += 1
    return replicas


def balanced_packing(weights: list[float], packs: int) -> list[int]:
    """EPLB's ``balanced_packing``: len(weights) / packs items per pack, heaviest item first to
    the lightest pack with room (ties: the lower item id, the lower pack). Returns each item's pack."""
    if packs <= 0 or len(weights) % packs:
        raise ValueError(f"{len(weights)} items do not pack evenly into {packs} packs")
    per_pack = len(weights) // packs
    pack_of_item = [-1] * len(weights)
    pack_weight, pack_items = [0.0] * packs, [0] * packs
    for item in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        pack = min(
            (k for k in range(packs) if pack_items[k] < per_pack), key=lambda k: (pack_weight[k], k)
        )
        pack_of_item[item] = pack
        pack_weight[pack] += weights[item]
        pack_items[pack] += 1
    return pack_of_item


def plan_replicas(
    loads,
    gpus: int,
    slots_per_gpu: int,
    previous: list[list[int]] | None = None,
    expert_bytes: int = 0,
    max_replicas: int | None = None,
    *,
    policy: str = "global",
    num_groups: int | None = None,
    gpus_per_node: int | None = None,
) -> ReplicaPlan:
    """Replicate and pack ``loads`` onto ``gpus`` x ``slots_per_gpu`` slots (docs/balancers.md).
    ``previous``: the experts_of_gpu of the plan in force, to keep replicas in place.
    ``max_replicas``: cap the replicas per expert (at most the GPUs its replicas may use: ``gpus``,
    or ``gpus_per_node`` for the hierarchical policy); without it, a plan needing more replicas
    of one expert than there are such GPUs is refused.
    ``policy``: "global" (any replica on any GPU) or "hierarchical" (DeepSeek EPLB's
    ``rebalance_experts_hierarchical``: groups packed onto nodes, replicas kept on their group's
    node), which needs ``num_groups`` and ``gpus_per_node`` (only it reads them)."""
    loads = [float(x) for x in loads]
    if gpus <= 0 or slots_per_gpu <= 0:
        raise ValueError("gpus and slots_per_gpu must be positive")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "hierarchical":
        plan = _plan_hierarchical(
            loads, gpus, slots_per_gpu, max_replicas, num_groups, gpus_per_node
        )
        if previous is not None:
            _match_previous(plan, previous, expert_bytes, gpus_per_node)
        return plan
    if max_replicas is not None and not 1 <= max_replicas <= gpus:
        raise ValueError(
            f"max_replicas must be in 1..{gpus} (one replica per GPU), got {max_replicas}"
        )
    replicas = replicate(loads, gpus * slots_per_gpu, max_replicas)
    if max(replicas) > gpus:
        raise ValueError(
            f"an expert needs {max(replicas)} replicas but there are only {gpus} GPUs "
            "(replicas of one expert must sit on different GPUs)"
        )
    bins, bin_load = _pack_replicas(loads, replicas, gpus, slots_per_gpu)
    plan = ReplicaPlan(bins, replicas, bin_load)
    if previous is not None:
        _match_previous(plan, previous, expert_bytes)
    return plan


def _plan_hierarchical(
    loads: list[float],
    gpus: int,
    slots_per_gpu: int,
    max_replicas: int | None,
    num_groups: int | None,
    gpus_per_node: int | None,
) -> ReplicaPlan:
    """Steps a.-c. of the hierarchical policy (docs/balancers.md) (EPLB's ``rebalance_experts_hierarchical``)."""
    experts = len(loads)
    if num_groups is None or gpus_per_node is None:
        raise ValueError("the hierarchical policy needs num_groups and gpus_per_node")
    if gpus_per_node <= 0 or gpus % gpus_per_node:
        raise ValueError(
            f"gpus_per_node={gpus_per_node} does not divide the {gpus} GPUs into nodes"
        )
    nodes = gpus // gpus_per_node
    if num_groups <= 0 or experts % num_groups:
        raise ValueError(f"{num_groups} expert groups do not divide the {experts} experts")
    if num_groups % nodes:
        raise ValueError(
            f"{nodes} nodes do not divide the {num_groups} expert groups (use the global policy)"
        )
    experts_per_node, slots_per_node = experts // nodes, gpus_per_node * slots_per_gpu
    if slots_per_node < experts_per_node:
        raise ValueError(
            f"{slots_per_node} slots per node cannot hold the {experts_per_node} "
            "experts of a node's groups"
        )
    if max_replicas is not None and not 1 <= max_replicas <= gpus_per_node:
        raise ValueError(
            f"max_replicas must be in 1..{gpus_per_node} (one replica per GPU of "
            f"its node), got {max_replicas}"
        )
    if slots_per_node > (max_replicas or gpus_per_node) * experts_per_node:
        raise ValueError(
            f"{slots_per_node} slots per node need more than {max_replicas or gpus_per_node} "
            f"replicas of one of its {experts_per_node} experts (at most one per GPU "
            "of its node, or max_replicas)"
        )
    group_size = experts // num_groups

    # a. groups onto nodes, the same number per node, by summed load (EPLB step 1)
    group_loads = [sum(loads[g * group_size : (g + 1) * group_size]) for g in range(num_groups)]
    node_of_group = balanced_packing(group_loads, nodes)

    experts_of_gpu: list[list[int]] = []
    gpu_loads: list[float] = []
    replicas = [0] * experts
    for node in range(nodes):
        # b. replicate the node's experts into the node's slots (EPLB step 2)
        node_experts = [
            e
            for g in range(num_groups)
            if node_of_group[g] == node
            for e in range(g * group_size, (g + 1) * group_size)
        ]
        node_loads = [loads[e] for e in node_experts]
        node_replicas = replicate(node_loads, slots_per_node, max_replicas)
        if max(node_replicas) > gpus_per_node:
            raise ValueError(
                f"an expert needs {max(node_replicas)} replicas but its node has only "
                f"{gpus_per_node} GPUs (replicas of one expert must sit on different GPUs)"
            )
        # c. the node's replicas onto the node's GPUs (EPLB step 3), local ids -> expert ids
        bins, bin_load = _pack_replicas(node_loads, node_replicas, gpus_per_node, slots_per_gpu)
        experts_of_gpu += [[node_experts[i] for i in b] for b in bins]
        gpu_loads += bin_load
        for i, e in enumerate(node_experts):
            replicas[e] = node_replicas[i]
    return ReplicaPlan(experts_of_gpu, replicas, gpu_loads, node_of_group=node_of_group)


def _pack_replicas(
    loads: list[float], replicas: list[int], gpus: int, slots_per_gpu: int
) -> tuple[list[list[int]], list[float]]:
    """Step 2 of the global policy (docs/balancers.md): every replica, heaviest first (load_e / replicas_e, ties
    to the lower id), onto the lightest GPU with a free slot that lacks its expert."""
    per_replica = [loads[e] / replicas[e] for e in range(len(loads))]
    items = sorted(
        ((per_replica[e], e) for e in range(len(loads)) for _ in range(replicas[e])),
        key=lambda t: (-t[0], t[1]),
    )
    bins: list[list[int]] = [[] for _ in range(gpus)]
    bin_load = [0.0] * gpus
    for load, e in items:
        open_bins = [g for g in range(gpus) if len(bins[g]) < slots_per_gpu and e not in bins[g]]
        if open_bins:
            g = min(open_bins, key=lambda b: (bin_load[b], b))
        else:
            g = _swap_to_free_a_bin(e, bins, bin_load, per_replica, slots_per_gpu)
        bins[g].append(e)
        bin_load[g] += load
    return bins, bin_load


def _swap_to_free_a_bin(
    e: int,
    bins: list[list[int]],
    bin_load: list[float],
    per_replica: list[float],
    slots_per_gpu: int,
) -> int:
    """Every GPU with a free slot holds ``e``: move a replica x from a full GPU that lacks ``e``
    to the lightest GPU with a free slot (which lacks x), and return the full GPU, now with a
    free slot and still lacking ``e``. Such a pair exists: at most replicas_e - 1 <= gpus - 1
    GPUs hold ``e`` so far, so some full GPU lacks it; and the free GPU holds fewer experts than
    that full one, so the full one has an x the free one lacks (x != e). The lightest x is
    moved (ties: lower id), from the lightest such full GPU (ties: lower GPU)."""
    gpus = range(len(bins))
    free = min((g for g in gpus if len(bins[g]) < slots_per_gpu), key=lambda g: (bin_load[g], g))
    full = min(
        (g for g in gpus if len(bins[g]) == slots_per_gpu and e not in bins[g]),
        key=lambda g: (bin_load[g], g),
    )
    x = min((x for x in bins[full] if x not in bins[free]), key=lambda x: (per_replica[x], x))
    bins[full].remove(x)
    bin_load[full] -= per_replica[x]
    bins[free].append(x)
    bin_load[free] += per_replica[x]
    return full


def _greedy_assignment(overlap: list[list[int]]) -> dict[int, int]:
    """Rows onto columns of a square overlap matrix, largest overlap first (ties: lower row,
    then lower column): greedy maximum overlap."""
    size = len(overlap)
    pairs = sorted(
        ((overlap[n][o], n, o) for n in range(size) for o in range(size)),
        key=lambda t: (-t[0], t[1], t[2]),
    )
    column_of_row, used_rows, used_columns = {}, set(), set()
    for _, n, o in pairs:
        if n not in used_rows and o not in used_columns:
            column_of_row[n] = o
            used_rows.add(n)
            used_columns.add(o)
    return column_of_row


def _match_previous(
    p: ReplicaPlan, previous: list[list[int]], expert_bytes: int, gpus_per_node: int | None = None
) -> None:
    """Relabel the new bins onto physical GPUs to keep the most replicas in place. With
    ``gpus_per_node`` (hierarchical plans) nodes are relabelled as wholes, then GPUs inside each
    node, so every group stays on one node."""
    gpus = len(p.experts_of_gpu)
    if len(previous) != gpus:
        raise ValueError(f"previous plan has {len(previous)} GPUs, new one {gpus}")
    if gpus_per_node is None:
        overlap = [[len(set(new) & set(old)) for old in previous] for new in p.experts_of_gpu]
        gpu_of_bin = _greedy_assignment(overlap)
        node_of_node = None
    else:
        nodes = gpus // gpus_per_node

        def experts_on_node(layout, node):
            return set().union(*layout[node * gpus_per_node : (node + 1) * gpus_per_node])

        node_overlap = [
            [
                len(experts_on_node(p.experts_of_gpu, n) & experts_on_node(previous, o))
                for o in range(nodes)
            ]
            for n in range(nodes)
        ]
        node_of_node = _greedy_assignment(node_overlap)
        gpu_of_bin = {}
        for n, o in node_of_node.items():
            new_gpus = range(n * gpus_per_node, (n + 1) * gpus_per_node)
            old_gpus = range(o * gpus_per_node, (o + 1) * gpus_per_node)
            overlap = [
                [len(set(p.experts_of_gpu[a]) & set(previous[b])) for b in old_gpus]
                for a in new_gpus
            ]
            for i, j in _greedy_assignment(overlap).items():
                gpu_of_bin[new_gpus[i]] = old_gpus[j]
    placed: list[list[int] | None] = [None] * gpus
    loads = [0.0] * gpus
    for n, o in gpu_of_bin.items():
        placed[o], loads[o] = p.experts_of_gpu[n], p.gpu_loads[n]
    bins = [b for b in placed if b is not None]
    if len(bins) != gpus:
        raise RuntimeError("the relabelling left a GPU without a bin")

    def moved(layout):
        return sum(1 for g in range(gpus) for e in set(layout[g]) if e not in previous[g])

    # Greedy matching is not optimal in every case: never do worse than keeping the labels.
    if moved(bins) <= moved(p.experts_of_gpu):
        p.experts_of_gpu, p.gpu_loads = bins, loads
        if node_of_node is not None:
            if p.node_of_group is None:
                raise ValueError("a hierarchical plan needs the node of each group")
            p.node_of_group = [node_of_node[n] for n in p.node_of_group]
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


def max_over_mean(loads) -> float:
    """Balance cost: the busiest GPU's load over the mean GPU load (1.0 is perfectly even, and
    also what no load at all gives)."""
    loads = [float(x) for x in loads]
    if not loads:
        raise ValueError("need at least one GPU")
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean > 0 else 1.0


@dataclass
class DispatchTraffic:
    """One dispatch of one MoE layer under a replica plan (``dispatch_traffic``)."""

    inter_node_bytes: int  # dispatch bytes that cross nodes (the combine sends as many back)
    inter_node_rows: int  # token rows sent to another node: one per (token, remote node)
    tokens: int
    gpu_rows: list[int]  # (token, expert) rows each GPU computes

    @property
    def max_over_mean_load(self) -> float:
        return max_over_mean(self.gpu_rows)

    @property
    def remote_nodes_per_token(self) -> float:
        return self.inter_node_rows / self.tokens if self.tokens else 0.0


def dispatch_traffic(
    plan: ReplicaPlan, top_experts, source_gpus, gpus_per_node: int, row_bytes: int
) -> DispatchTraffic:
    """Bytes that cross nodes when tokens are dispatched to the replicas of ``plan``.

    ``top_experts``: [tokens, k] chosen experts per token; ``source_gpus``: the GPU each token
    starts on; GPUs g and h share a node when g // gpus_per_node == h // gpus_per_node;
    ``row_bytes``: one token row (hidden * itemsize).

    Counting rule:
    - replica: each (token, expert) picks one replica, independently of the token's other
      experts (as a dispatcher that maps an expert to a replica does): among the expert's
      replicas on the token's own node if it has any there, else among all its replicas, the one
      with the fewest rows assigned so far (ties: the lower GPU), tokens taken in order. Every
      replica of an expert is on a different GPU, so a replica is named by its GPU.
    - bytes: a token crosses nodes once per distinct node other than its own among its chosen
      replicas' GPUs, ``row_bytes`` each: DeepSeek-V3 (Sec. 3.2.2) and DeepEP send a token over
      IB once per destination node and forward it to that node's GPUs over NVLink, so several
      experts on one remote node cost one row. The combine returns the same bytes; not counted.
    - balance: the (token, expert) rows each GPU computes under this choice (``gpu_rows``).
    """
    gpus = len(plan.experts_of_gpu)
    if gpus_per_node <= 0 or gpus % gpus_per_node:
        raise ValueError(f"gpus_per_node={gpus_per_node} does not divide the plan's {gpus} GPUs")
    if row_bytes < 0:
        raise ValueError(f"row_bytes must be >= 0, got {row_bytes}")
    chosen = [
        [int(e) for e in row]
        for row in (top_experts.tolist() if hasattr(top_experts, "tolist") else top_experts)
    ]
    sources = [
        int(g) for g in (source_gpus.tolist() if hasattr(source_gpus, "tolist") else source_gpus)
    ]
    if len(sources) != len(chosen):
        raise ValueError(f"{len(sources)} source GPUs for {len(chosen)} tokens")
    if any(not 0 <= g < gpus for g in sources):
        raise ValueError(f"a source GPU is outside 0..{gpus - 1}")
    experts = len(plan.replicas)
    gpus_of_expert: list[list[int]] = [[] for _ in range(experts)]
    for g, held in enumerate(plan.experts_of_gpu):
        for e in held:
            gpus_of_expert[e].append(g)
    nodes = gpus // gpus_per_node
    # candidates[node][e]: the replicas a token on ``node`` may use for expert e
    candidates = []
    for node in range(nodes):
        per_expert = []
        for e in range(experts):
            local = [g for g in gpus_of_expert[e] if g // gpus_per_node == node]
            per_expert.append(local or gpus_of_expert[e])
        candidates.append(per_expert)
    assigned = [dict.fromkeys(gpus_of_expert[e], 0) for e in range(experts)]  # rows per replica
    gpu_rows = [0] * gpus
    inter_node_rows = 0
    for source, token_experts in zip(sources, chosen):
        node = source // gpus_per_node
        destination_nodes = set()
        for e in token_experts:
            if not 0 <= e < experts or not gpus_of_expert[e]:
                raise ValueError(f"expert {e} has no replica in the plan")
            options = candidates[node][e]
            g = options[0] if len(options) == 1 else min(options, key=lambda h: (assigned[e][h], h))
            assigned[e][g] += 1
            gpu_rows[g] += 1
            destination_nodes.add(g // gpus_per_node)
        destination_nodes.discard(node)
        inter_node_rows += len(destination_nodes)
    return DispatchTraffic(inter_node_rows * row_bytes, inter_node_rows, len(chosen), gpu_rows)


def _replay_plan(step: BalanceStep, knobs: dict) -> DeviceWork:
    """A replica plan from the previous micro-batch's counts, the actual rows split over it;
    ``decision`` is the ReplicaPlan."""
    world, experts = step.placement.world_size, step.placement.num_experts
    if experts % world:
        raise ValueError(
            f"EPLB needs the same number of experts per device: {experts} over {world}"
        )
    slots_per_device = experts // world + knobs["redundant_slots"]
    if step.previous_counts is None:
        raise ValueError("EPLB plans from the previous micro-batch's counts: the step has none")
    plan = plan_replicas(step.previous_counts.tolist(), world, slots_per_device, max_replicas=world)
    groups = split_rows(step.counts.tolist(), plan)
    return DeviceWork([sum(g) for g in groups], groups, decision=plan)


register_balancer(
    Balancer(
        name="EPLB",
        paper="DeepSeek EPLB (replicate_experts, balanced_packing), as in this module",
        description="heaviest experts (from the previous micro-batch) replicated into spare slots, "
        "replicas packed onto the lightest devices",
        needs_history=True,
        knobs={"redundant_slots": 1},
        plan=_replay_plan,
    )
)
