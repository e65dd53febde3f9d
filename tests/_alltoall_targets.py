"""Rank targets for tests/test_alltoall.py (imported by real rank processes).

One launched world runs many cases: each case draws fresh random, uneven inputs (zero-row
sends, ranks with no tokens, ranks with no experts), and every rank rebuilds every other rank's
inputs from the shared seed, so the reference is computed locally by loops, without any
communication. All values are small integers and weights multiples of 1/8, so sums are exact
in float64 whatever the order and results compare with torch.equal.
"""

from collections import Counter
from contextlib import contextmanager

import torch

from moe_repro.components.alltoall.flat import (
    TorchComm,
    all_to_all_v,
    flat_all_to_all_v,
    flat_schedule,
)
from moe_repro.components.alltoall.halo import HaloAllToAll, halo_schedule
from moe_repro.components.alltoall.rbd import RBDDispatcher, rbd_schedule
from moe_repro.components.moe.pft import build_pft
from moe_repro.components.network.comm import COLLECTIVE_CALLS
from moe_repro.components.network.topology import Topology, build_communicators


def _counts_matrix(seed, n):
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(0, 5, (n, n), generator=g)
    c[torch.rand(n, n, generator=g) < 0.3] = 0  # empty sends
    if seed % 3 == 0:
        c[seed % n, :] = 0  # a rank that sends nothing
    if seed % 3 == 1:
        c[:, (seed + 1) % n] = 0  # a rank that receives nothing
    return c.tolist()


def _rows(seed, src, count, width):
    """Rows rank ``src`` sends; row i of the chunk to d encodes (src, d, i) plus noise."""
    g = torch.Generator().manual_seed(seed * 1000 + src)
    return torch.randint(-50, 50, (count, width), generator=g).double()


def _routing(seed, rank, experts, top_k):
    g = torch.Generator().manual_seed(seed * 7717 + rank)
    tokens = int(torch.randint(0, 9, (1,), generator=g))
    if rank == seed % 3:
        tokens = 0  # a rank with no tokens at all
    top = torch.argsort(torch.rand(tokens, experts, generator=g), dim=1)[:, :top_k]
    weights = torch.randint(1, 9, (tokens, top_k), generator=g).double() / 8
    x = torch.randint(-50, 50, (tokens, 6), generator=g).double()
    return x, top, weights


def _placement(seed, experts, world):
    g = torch.Generator().manual_seed(seed + 99)
    if seed % 2:  # arbitrary map: experts anywhere, some ranks without any
        return torch.randint(0, world, (experts,), generator=g).tolist()
    return torch.randperm(experts, generator=g).remainder(world).tolist()  # scattered, all ranks


def _reference_dispatch(seed, placement, world, me, experts, top_k):
    """Rows rank ``me`` must receive: by source rank, expert ascending, token ascending."""
    rows = []
    for s in range(world):
        x, top, _ = _routing(seed, s, experts, top_k)
        for e in range(experts):
            if placement[e] != me:
                continue
            for t in range(x.shape[0]):
                if e in top[t].tolist():
                    rows.append(x[t])
    return torch.stack(rows) if rows else torch.zeros(0, 6, dtype=torch.float64)


def _send_layout(top, placement, world, experts):
    """Flat send buffer by a loop: (token of each row, rows per destination rank)."""
    tokens, counts = [], [0] * world
    for d in range(world):
        for e in range(experts):
            if placement[e] != d:
                continue
            for t in range(top.shape[0]):
                if e in top[t].tolist():
                    tokens.append(t)
                    counts[d] += 1
    return tokens, counts


def equivalence(ctx, layouts, seeds, experts=6, top_k=3, with_autograd=False):
    """For each emulated node layout (ranks per node) of this world: HALO == flat == loop
    reference; RBD dispatch == reference; RBD combine == loop reference; measured messages ==
    the schedules; RBD inter-node rows == unique (token, remote node) pairs."""
    out = [
        case for per_node in layouts for case in _equivalence(ctx, per_node, seeds, experts, top_k)
    ]
    if with_autograd:
        out.append({"seed": "autograd", "all_to_all_v_backward": autograd(ctx)})
    return out


@contextmanager
def _collective_calls(comms):
    """Counts the collectives issued on each communicator of ``comms`` inside the block (a
    blocking all-to-all is its async call and a wait), by name: {"world": 1, "intra": 1}."""
    calls = Counter()
    saved = [(name, c, m) for name, c in comms.by_name().items() for m in COLLECTIVE_CALLS]

    def counted(name, comm, method):
        real = getattr(comm, method)

        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return call

    for name, comm, method in saved:
        setattr(comm, method, counted(name, comm, method))
    try:
        yield calls
    finally:
        for _, comm, method in saved:
            delattr(comm, method)  # the class's method again


def _equivalence(ctx, ranks_per_node, seeds, experts, top_k):
    topo = Topology.from_context(ctx, ranks_per_node)
    comms = build_communicators(topo, ctx.rank, ctx.backend, ctx.comm)
    halo = HaloAllToAll(comms)
    n, me, R = ctx.world_size, ctx.rank, ranks_per_node
    out = []
    for seed in seeds:
        case = {"seed": seed, "layout": f"{n // R}x{R}"}
        # 1. Plain uneven all-to-all-v: flat and HALO against the loop reference.
        C = _counts_matrix(seed, n)
        x = _rows(seed, me, sum(C[me]), 5)
        expected = []
        for s in range(n):
            xs = _rows(seed, s, sum(C[s]), 5)
            start = sum(C[s][:me])
            expected += list(xs[start : start + C[s][me]])
        expected = torch.stack(expected) if expected else torch.zeros(0, 5, dtype=torch.float64)
        log = []
        comms.set_log(log)
        flat = flat_all_to_all_v(comms.world, x, C[me])
        with _collective_calls(comms) as calls:
            got_halo = halo(x, C[me]).clone()
        comms.set_log(None)
        if topo.nodes == 1:  # no remote node: the counts, then Phase I blocking, nothing else
            case["halo_one_node_issues_counts_and_phase_I_only"] = calls == {"world": 1, "intra": 1}
        case["flat_exact"] = torch.equal(flat, expected)
        case["halo_exact"] = torch.equal(got_halo, expected)
        sent = sorted(log)
        planned = flat_schedule(C, 40) + halo_schedule(C, topo, 40)
        case["halo_log_is_schedule"] = sent == sorted(m for m in planned if m[1] == me)

        # 2. MoE dispatch on a PFT with an arbitrary placement map: flat vs RBD.
        placement = _placement(seed, experts, n)
        xt, top, w = _routing(seed, me, experts, top_k)
        pft = build_pft(top, w, experts)
        tokens, counts = _send_layout(top, placement, n, experts)
        log = []
        comms.set_log(log)
        flat = flat_all_to_all_v(comms.world, xt[torch.tensor(tokens, dtype=torch.int64)], counts)
        flat_log = list(log)
        log.clear()
        rbd = RBDDispatcher(comms, placement)
        got_rbd = rbd.dispatch(xt, pft, torch.Generator().manual_seed(seed * 31 + me))
        rbd_log = list(log)
        y = rbd.combine(3 * got_rbd - 1, xt.shape[0])  # expert e computes 3x - 1
        comms.set_log(None)
        ref = _reference_dispatch(seed, placement, n, me, experts, top_k)
        case["flat_moe_exact"] = torch.equal(flat, ref)
        case["rbd_exact"] = torch.equal(got_rbd, ref)
        combined = torch.zeros_like(xt)
        for t in range(xt.shape[0]):
            for j in range(top_k):
                combined[t] += w[t, j] * (3 * xt[t] - 1)
        case["rbd_combine_exact"] = torch.equal(y, combined)

        row_bytes = 6 * 8
        node_of = [p // R for p in placement]
        remote_pairs = sum(
            1 for t in range(xt.shape[0]) for e in top[t].tolist() if node_of[e] != me // R
        )
        unique_remote = len(
            {
                (t, node_of[e])
                for t in range(xt.shape[0])
                for e in top[t].tolist()
                if node_of[e] != me // R
            }
        )
        inter = lambda msgs, phase: sum(
            m[3]
            for m in msgs
            if m[0] == phase  # noqa: E731
            and topo.is_inter_node(m[1], m[2])
        )
        case["flat_inter_rows"] = inter(flat_log, "a2a") // row_bytes
        case["rbd_inter_rows"] = inter(rbd_log, "pilot") // row_bytes
        case["remote_pairs"], case["unique_remote"] = remote_pairs, unique_remote
        case["rbd_other_phases_intra"] = all(
            not topo.is_inter_node(m[1], m[2])
            for m in rbd_log
            if m[0] in ("replica", "replica_meta")
        )
        pfts = [build_pft(*_routing(seed, r, experts, top_k)[1:], experts) for r in range(n)]
        gens = [torch.Generator().manual_seed(seed * 31 + r) for r in range(n)]
        sched = rbd_schedule(pfts, placement, topo, row_bytes, gens)
        case["rbd_log_is_schedule"] = sorted(rbd_log) == sorted(m for m in sched if m[1] == me)
        out.append(case)
    return out


def autograd(ctx):
    """all_to_all_v's backward is the reverse exchange: d/dx sum(y * c[src]) = c[dst]."""
    n, me = ctx.world_size, ctx.rank
    C = _counts_matrix(5, n)
    x = _rows(5, me, sum(C[me]), 3).requires_grad_(True)
    y = all_to_all_v(x, C[me])
    scale = (
        torch.cat(
            [
                torch.full((C[s][me], 3), float(me * 10 + s + 1), dtype=torch.float64)
                for s in range(n)
            ]
        )
        if sum(C[s][me] for s in range(n))
        else torch.zeros(0, 3)
    )
    (y * scale).sum().backward()
    grad_expected = (
        torch.cat(
            [
                torch.full((C[me][d], 3), float(d * 10 + me + 1), dtype=torch.float64)
                for d in range(n)
            ]
        )
        if sum(C[me])
        else torch.zeros(0, 3)
    )
    grad = x.grad if x.grad is not None else torch.zeros_like(x)
    return bool(torch.equal(grad, grad_expected.to(grad.dtype)))


def _received_rows(seed, C, me, width, salt=0):
    """Rows rank ``me`` of a group receives for counts matrix C, by a loop over sources."""
    rows = []
    for s in range(len(C)):
        xs = _rows(seed + salt, s, sum(C[s]), width)
        start = sum(C[s][:me])
        rows += list(xs[start : start + C[s][me]])
    return torch.stack(rows) if rows else torch.zeros(0, width, dtype=torch.float64)


def group_halo_vs_flat(ctx, seeds):
    """HALO's group dispatcher (differentiable) on the world and, on 4 ranks, on sub-groups of
    2 (same-node pairs {0,1},{2,3} and cross-node pairs {0,2},{1,3} of the emulated 2x2 world):
    one expert per group rank and each row its own token, so dispatch is the all-to-all-v of the
    rows with counts C; forward == flat == loop reference, backward == flat's backward == loop
    reference."""
    import torch.distributed as dist

    from moe_repro.components.alltoall import get_algorithm
    from moe_repro.components.moe.pft import PFT

    n, width = ctx.world_size, 5
    groups = [("world", None, list(range(n)))]
    if n == 4:
        for name, parts in (
            ("same-node pairs", [[0, 1], [2, 3]]),
            ("cross-node pairs", [[0, 2], [1, 3]]),
        ):
            made = [dist.new_group(p) for p in parts]  # collective: every rank makes every group
            groups += [(name, g, p) for p, g in zip(parts, made) if ctx.rank in p]
    out = []
    for name, group, ranks in groups:
        me, m = ranks.index(ctx.rank), len(ranks)
        dispatcher = get_algorithm("halo").group_dispatcher(list(range(m)), group)
        topo = dispatcher.halo.topo
        for seed in seeds:
            C = _counts_matrix(seed, m)
            x = _rows(seed, me, sum(C[me]), width).requires_grad_(True)
            # Upstream gradient of rank d's output: rows from the seed, so every rank knows all.
            g_out = _received_rows(seed, C, me, width, salt=500)
            flat = all_to_all_v(x, C[me], group=group)
            flat.backward(g_out)
            flat_grad, x.grad = x.grad.clone(), None
            rows = sum(C[me])
            pft = PFT(  # row j is token j, for expert (= group rank) d of its chunk
                token_ids=torch.arange(rows),
                expert_ids=torch.repeat_interleave(torch.arange(m), torch.tensor(C[me])),
                tokens_per_expert=torch.tensor(C[me]),
                combine_weights=torch.ones(rows, dtype=torch.float64),
                num_tokens=rows,
            )
            halo = dispatcher.dispatch(x, pft)
            halo.backward(g_out)
            # d/dx: the rows of x sent to d get d's upstream rows at the same positions.
            expected_grad = []
            for d in range(m):
                g_d = _received_rows(seed, C, d, width, salt=500)
                start = sum(C[s][d] for s in range(me))
                expected_grad += list(g_d[start : start + C[me][d]])
            expected_grad = (
                torch.stack(expected_grad)
                if expected_grad
                else torch.zeros(0, width, dtype=torch.float64)
            )
            out.append(
                {
                    "group": name,
                    "layout": f"{topo.nodes}x{topo.ranks_per_node}",
                    "seed": seed,
                    "rows_sent": sum(C[me]),
                    "rows_received": int(halo.shape[0]),
                    "forward": bool(
                        torch.equal(halo, flat)
                        and torch.equal(halo, _received_rows(seed, C, me, width))
                    ),
                    "backward": bool(
                        torch.equal(x.grad, flat_grad) and torch.equal(x.grad, expected_grad)
                    ),
                }
            )
    return out


def group_rbd_vs_flat(ctx, seeds, experts=6, top_k=3):
    """RBD (RBDDispatcher.for_group) on the world and on EP sub-groups of a 4-rank world on 2
    emulated nodes x 2: {0,1,2,3} (2x2), {0,2} and {1,3} (2x1), {0,1} (1x2). Placement, ranks
    and nodes are group-local. Dispatch == flat all-to-all over the group == loop reference,
    combine == loop reference, pilot rows across nodes == unique (token, remote node) pairs,
    measured messages == rbd_schedule in group ranks; group {0,1,2} is refused."""
    import torch.distributed as dist

    world_topo = Topology.from_context(ctx)
    parts = [[0, 1, 2, 3], [0, 2], [1, 3], [0, 1]]
    made = [dist.new_group(p) for p in parts]  # collective: every rank makes every group
    uneven = dist.new_group([0, 1, 2])
    groups = [("world", None, list(range(ctx.world_size)))]
    groups += [(str(p), g, p) for p, g in zip(parts, made) if ctx.rank in p]
    out = []
    for gi, (name, group, ranks) in enumerate(groups):
        m, me = len(ranks), ranks.index(ctx.rank)
        my_node = world_topo.node_of(ctx.rank)
        comm = TorchComm(group, ranks)
        for seed in seeds:
            gseed = seed * 10 + gi  # fresh inputs per group
            placement = _placement(gseed, experts, m)  # expert -> group rank
            xt, top, w = _routing(gseed, me, experts, top_k)
            pft = build_pft(top, w, experts)
            tokens, counts = _send_layout(top, placement, m, experts)
            flat_log = []
            comm.log = flat_log
            flat = flat_all_to_all_v(comm, xt[torch.tensor(tokens, dtype=torch.int64)], counts)
            comm.log = None
            rbd = RBDDispatcher.for_group(placement, group=group)
            rbd_log = []
            rbd.comms.set_log(rbd_log)
            got = rbd.dispatch(xt, pft, torch.Generator().manual_seed(gseed * 31 + me))
            rbd.comms.set_log(None)
            y = rbd.combine(3 * got - 1, xt.shape[0])  # expert e computes 3x - 1
            ref = _reference_dispatch(gseed, placement, m, me, experts, top_k)
            combined = torch.zeros_like(xt)
            for t in range(xt.shape[0]):
                for j in range(top_k):
                    combined[t] += w[t, j] * (3 * xt[t] - 1)

            # Inter-node rows from the world's emulated nodes of the global ranks (not from
            # the group topology RBD derived).
            row_bytes = 6 * 8
            node_of_expert = [world_topo.node_of(ranks[p]) for p in placement]
            remote = [
                (t, node_of_expert[e])
                for t in range(xt.shape[0])
                for e in top[t].tolist()
                if node_of_expert[e] != my_node
            ]
            inter = lambda msgs, phase: sum(
                x[3]
                for x in msgs
                if x[0] == phase  # noqa: E731
                and world_topo.is_inter_node(x[1], x[2])
            )
            pfts = [build_pft(*_routing(gseed, r, experts, top_k)[1:], experts) for r in range(m)]
            gens = [torch.Generator().manual_seed(gseed * 31 + r) for r in range(m)]
            sched = [
                (ph, ranks[s], ranks[d], b)  # group ranks -> global ranks
                for ph, s, d, b in rbd_schedule(pfts, placement, rbd.topo, row_bytes, gens)
            ]
            off_rank = lambda msgs: sorted(x for x in msgs if x[1] != x[2])  # noqa: E731
            out.append(
                {
                    "seed": seed,
                    "group": name,
                    "layout": f"{rbd.topo.nodes}x{rbd.topo.ranks_per_node}",
                    "empty_sends": counts.count(0),
                    "tokens": xt.shape[0],
                    "flat_moe_exact": torch.equal(flat, ref),
                    "rbd_exact": torch.equal(got, ref) and torch.equal(got, flat),
                    "rbd_combine_exact": torch.equal(y, combined),
                    "flat_inter_rows": inter(flat_log, "a2a") // row_bytes,
                    "rbd_inter_rows": inter(rbd_log, "pilot") // row_bytes,
                    "remote_pairs": len(remote),
                    "unique_remote": len(set(remote)),
                    "rbd_other_phases_intra": all(
                        not world_topo.is_inter_node(x[1], x[2])
                        for x in rbd_log
                        if x[0] in ("replica", "replica_meta")
                    ),
                    # self-messages are local copies: the group's intra-node p2p does not log them
                    "rbd_log_is_schedule": off_rank(rbd_log)
                    == off_rank(x for x in sched if x[1] == ctx.rank),
                }
            )
    if ctx.rank in (0, 1, 2):  # 2 members on node 0, 1 on node 1: RBD must refuse it
        try:
            RBDDispatcher.for_group(list(range(3)), group=uneven)
            out.append({"seed": "refused", "message": None})
        except ValueError as e:
            out.append({"seed": "refused", "message": str(e)})
    return out


def _autograd_vs_local(dispatcher, seed, me, placement, experts, top_k):
    """The dispatcher's autograd form against the same formula computed in one process: expert
    e on rank r computes (r + 2) * x - 1, so a row or a gradient sent to the wrong rank changes
    the result. out[t] = sum_j w[t, j] * ((rank(e_tj) + 2) * x[t] - 1); loss = sum(out * g)."""
    xt, top, w = _routing(seed, me, experts, top_k)
    g = torch.Generator().manual_seed(seed * 13 + me)
    g_out = torch.randint(-9, 9, xt.shape, generator=g).double()
    rank_of = torch.tensor(placement)
    # local reference: plain autograd on this rank's tokens
    x_ref, w_ref = xt.clone().requires_grad_(True), w.clone().requires_grad_(True)
    scale = (rank_of[top] + 2).double().unsqueeze(-1)  # [tokens, k, 1]
    out_ref = (w_ref.unsqueeze(-1) * (scale * x_ref.unsqueeze(1) - 1)).sum(1)
    (out_ref * g_out).sum().backward()
    # over the ranks, through the dispatcher's differentiable dispatch and combine
    x, wd = xt.clone().requires_grad_(True), w.clone().requires_grad_(True)
    pft = build_pft(top, wd, experts)
    rows = dispatcher.dispatch(x, pft)
    weights = dispatcher.received_weights(pft.combine_weights)
    out = dispatcher.combine((me + 2) * rows - 1, xt.shape[0], weights=weights)
    (out * g_out).sum().backward()
    same = lambda a, b: a is not None and b is not None and torch.allclose(a, b, atol=1e-9, rtol=0)  # noqa: E731
    return {
        "autograd_forward": same(out.detach(), out_ref.detach()),
        "autograd_dx": same(x.grad, x_ref.grad) if xt.shape[0] else True,
        "autograd_dw": same(wd.grad, w_ref.grad) if xt.shape[0] else True,
    }


def registry_vs_reference(ctx, seeds, experts=6, top_k=3):
    """Every registered all-to-all, chosen by name: its dispatcher's dispatch == the loop
    reference (the flat layout) and combine == the loop reference; what it sends during dispatch
    == its routed_schedule; its autograd form (forward, dx, d weights) == one process's. Nodes:
    the launcher's (what the group dispatchers read too)."""
    from moe_repro.components.alltoall import Dispatcher, algorithm_names, get_algorithm

    topo = Topology.from_context(ctx)
    comms = build_communicators(topo, ctx.rank, ctx.backend, ctx.comm)
    n, me, row_bytes = ctx.world_size, ctx.rank, 6 * 8
    out = []
    for name in algorithm_names():
        algo = get_algorithm(name)
        for seed in seeds:
            placement = _placement(seed, experts, n)
            xt, top, w = _routing(seed, me, experts, top_k)
            pft = build_pft(top, w, experts)
            dispatcher = algo.dispatcher(
                comms, placement, torch.Generator().manual_seed(seed * 31 + me)
            )
            log = []
            comms.set_log(log)
            got = dispatcher.dispatch(xt, pft)
            comms.set_log(None)
            exact = torch.equal(got, _reference_dispatch(seed, placement, n, me, experts, top_k))
            # The Dispatcher contract: without grad, the next dispatch writes into the same
            # buffer (no fresh multi-MiB tensor per call), and is as exact.
            start, before = got.data_ptr(), got.clone()
            again = dispatcher.dispatch(xt, pft)
            reuses, same = again.data_ptr() == start, torch.equal(again, before)
            y = dispatcher.combine(3 * got - 1, xt.shape[0])  # expert e computes 3x - 1
            kept = torch.equal(got, before)  # the way back leaves the dispatched rows alone
            combined = torch.zeros_like(xt)
            for t in range(xt.shape[0]):
                for j in range(top_k):
                    combined[t] += w[t, j] * (3 * xt[t] - 1)
            pfts = [build_pft(*_routing(seed, r, experts, top_k)[1:], experts) for r in range(n)]
            gens = [torch.Generator().manual_seed(seed * 31 + r) for r in range(n)]
            sched = algo.routed_schedule(pfts, placement, topo, row_bytes, gens)
            case = {
                "algo": name,
                "seed": seed,
                "is_dispatcher": isinstance(dispatcher, Dispatcher),
                "dispatch_exact": exact,
                "combine_exact": torch.equal(y, combined),
                "log_is_schedule": sorted(log) == sorted(m for m in sched if m[1] == me),
                "second_dispatch_reuses_buffer": reuses,
                "second_dispatch_exact": same,
                "combine_keeps_dispatched_rows": kept,
            }
            case.update(
                _autograd_vs_local(
                    algo.dispatcher(comms, placement), seed, me, placement, experts, top_k
                )
            )
            out.append(case)
    return out
