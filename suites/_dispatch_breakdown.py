"""Rank target: per-stage dispatch times of flat and RBD dispatch (xmoe-fig12's breakdown).

Not a suite (no SUITE): the stages of one call cannot be separate grid points, so this target
times them inside one real world, on the alltoall suite's inputs (same seeds, placement and
routing). A stage's time in one repeat is the slowest rank's; reported: median over repeats.
"""

from __future__ import annotations

import statistics
import time

import torch

FLAT_STAGES = ("buffer gather", "counts exchange", "all-to-all")


def dispatch_breakdown(ctx, params: dict, repeats: int, warmup: int = 1) -> dict:
    from moe_repro.components.alltoall.flat import flat_all_to_all_v
    from moe_repro.components.alltoall.rbd import RBDDispatcher
    from moe_repro.components.network.topology import Topology, build_communicators, bytes_by_link_class
    from moe_repro.suites.alltoall import rank_workload

    topo = Topology(nodes=int(params["nodes"]), ranks_per_node=int(params["gpus_per_node"]))
    comms = build_communicators(topo, ctx.rank, ctx.backend, ctx.comm)
    work = rank_workload(params, ctx.rank, ctx.world_size)
    x, pft, token_order, send_counts = work["x"], work["pft"], work["token_order"], work["send_counts"]
    rbd = RBDDispatcher(comms, work["placement"])
    gen = torch.Generator().manual_seed(104729 + ctx.rank)

    def flat_once(laps: dict) -> torch.Tensor:
        t0 = time.perf_counter()
        send = x.index_select(0, token_order)
        t1 = time.perf_counter()
        recv_counts = comms.world.exchange_counts(send_counts)
        t2 = time.perf_counter()
        out = flat_all_to_all_v(comms.world, send, send_counts, recv_counts)
        t3 = time.perf_counter()
        laps.update({"buffer gather": t1 - t0, "counts exchange": t2 - t1, "all-to-all": t3 - t2})
        return out

    def rbd_once(laps: dict) -> torch.Tensor:
        rbd.timings = laps
        out = rbd.dispatch(x, pft, gen)
        rbd.timings = None
        return out

    result = {}
    for name, once in (("flat", flat_once), ("rbd", rbd_once)):
        log: list = []
        comms.set_log(log)
        once({})
        comms.set_log(None)
        mine = bytes_by_link_class(log, topo)
        result[f"{name}_bytes"] = {k: sum(col) for k, col in zip(
            mine, zip(*comms.world.allgather_ints(list(mine.values()))))}
        for _ in range(warmup):
            once({})
        per_stage: dict[str, list[float]] = {}
        totals = []
        for _ in range(repeats):
            laps: dict[str, float] = {}
            ctx.barrier()
            t0 = time.perf_counter()
            once(laps)
            totals.append(ctx.all_reduce_max(time.perf_counter() - t0))
            for stage in sorted(laps):  # same order on every rank: the reductions must match
                per_stage.setdefault(stage, []).append(ctx.all_reduce_max(laps[stage]))
        result[f"{name}_stages"] = {s: statistics.median(v) for s, v in per_stage.items()}
        result[f"{name}_total"] = statistics.median(totals)
        result[f"{name}_total_iqr"] = (statistics.quantiles(totals, n=4)[2]
                                       - statistics.quantiles(totals, n=4)[0]) if len(totals) > 1 else 0.0
    return result
