"""xmoe-appc1: EP-first vs DP-first placement, all-to-all and gradient all-reduce bytes per link class.

X-MoE App. C.1 argues qualitatively (no table): EP-first keeps the token all-to-all inside a
node but sends every expert gradient across nodes; DP-first does the opposite, and wins for
large MoEs on Frontier (25 GB/s inter-node vs up to 200 GB/s intra-node). We
- run both placements for real at small scale (gloo ranks grouped into emulated nodes): a real
  uneven all-to-all with random routing (4 exchanges: dispatch and combine, forward and
  backward) and a real ring all-reduce of expert gradients, counting the bytes each message put
  on each link class, beside the formula of components.placement for the same sizes;
- evaluate the formula at the paper's example scale (64 GPUs = 8 nodes x 8, EP = 8) and at
  X-MoE's Large run (256 GPUs, EP = 64) for models of the zoo, with the paper's bandwidths.
All cells are ours (the appendix prints no numbers): verdict no-paper-value.
"""

from __future__ import annotations

from moe_repro.reproductions.spec import Figure, Reproduction, Result

GB = 1e9


def measure_rank(ctx, orders: list[str], **kwargs) -> dict:
    """Both placements in one world (fewer process launches): {order: result}."""
    return {order: _measure_placement(ctx, order, **kwargs) for order in orders}


def _measure_placement(ctx, order: str, ep: int, tokens: int, top_k: int, hidden: int,
                       expert_params: int, seed: int, uniform: bool = False) -> dict:
    """One rank of a real small run: 4 all-to-all exchanges in its EP group and a ring
    all-reduce of its expert gradient in its DP group; returns the message log."""
    import torch
    import torch.distributed as dist

    from moe_repro.components.alltoall.flat import TorchComm
    from moe_repro.components.network.rank_layout import group_of, placement_groups, ring_all_reduce

    ep_groups, dp_groups = placement_groups(ctx.world_size, ep, order)
    handles = {}
    for g in ep_groups + dp_groups:  # every rank creates every group, in the same order
        handles[tuple(g)] = dist.new_group(g)
    my_ep, my_dp = group_of(ctx.rank, ep_groups), group_of(ctx.rank, dp_groups)
    ep_comm = TorchComm(handles[tuple(my_ep)], my_ep)
    dp_comm = TorchComm(handles[tuple(my_dp)], my_dp)
    log: list = []
    ep_comm.log = dp_comm.log = log

    g = torch.Generator().manual_seed(seed * 7919 + ctx.rank)
    assignments = tokens * top_k
    if uniform:
        if assignments % ep:
            raise ValueError("uniform routing needs tokens * top_k divisible by EP")
        send_counts = [assignments // ep] * ep
    else:
        dest = torch.randint(0, ep, (assignments,), generator=g)
        send_counts = torch.bincount(dest, minlength=ep).tolist()
    rows = torch.randn(assignments, hidden, generator=g)
    ep_comm.log = None  # the counts exchange is metadata, not the token traffic
    recv_counts = ep_comm.exchange_counts(send_counts)
    ep_comm.log = log
    dispatched = ep_comm.alltoallv(rows, send_counts, recv_counts, "a2a-dispatch")
    combined = ep_comm.alltoallv(dispatched, recv_counts, send_counts, "a2a-combine")
    grad_dispatched = ep_comm.alltoallv(combined, send_counts, recv_counts, "a2a-combine-bwd")
    back = ep_comm.alltoallv(grad_dispatched, recv_counts, send_counts, "a2a-dispatch-bwd")
    roundtrip_ok = bool(torch.equal(back, rows))

    grad = torch.randint(-1000, 1000, (expert_params,), generator=g).float()  # exact sums
    ring = ring_all_reduce(dp_comm, grad)
    reference = grad.clone()
    dist.all_reduce(reference, group=handles[tuple(my_dp)])
    return {"log": log, "roundtrip_ok": roundtrip_ok, "allreduce_ok": bool(torch.equal(ring, reference)),
            "send_counts": send_counts}


def run_small(orders: list[str], nodes: int, gpus_per_node: int, ep: int, tokens: int, top_k: int,
              hidden: int, expert_params: int, seed: int, uniform: bool = False,
              timeout_s: float = 120.0) -> dict:
    """Measured bytes per link class of real small runs (all ranks' messages), per order."""
    from moe_repro.components.network.rank_layout import measured_bytes
    from moe_repro.components.network.topology import Topology
    from moe_repro.runtime.launch import run_ranks

    out = run_ranks("moe_repro.reproductions.xmoe_appc1:measure_rank",
                    dict(orders=list(orders), ep=ep, tokens=tokens, top_k=top_k, hidden=hidden,
                         expert_params=expert_params, seed=seed, uniform=uniform),
                    world_size=nodes * gpus_per_node, ranks_per_node=gpus_per_node, timeout_s=timeout_s)
    topo = Topology(nodes=nodes, ranks_per_node=gpus_per_node)
    result = {}
    for order in orders:
        log = [tuple(m) for r in out for m in r[order]["log"]]
        result[order] = {"alltoall": measured_bytes(log, topo, "a2a"),
                         "allreduce": measured_bytes(log, topo, "grad-allreduce"),
                         "correct": all(r[order]["roundtrip_ok"] and r[order]["allreduce_ok"] for r in out)}
    return result


def compute(repro: Reproduction, params: dict) -> Result:
    from moe_repro.components.network.rank_layout import ORDERS, comm_time_s, traffic_model
    from moe_repro.components.model.zoo import get_model

    cells, assumptions = [], []
    # --- real small runs -----------------------------------------------------------------
    nodes, gpn = int(params["small_nodes"]), int(params["small_gpus_per_node"])
    ep = gpn  # the App. C.1 example: EP equal to the GPUs of one node
    tokens, hidden, k, eparams = 64, 32, 2, 4096
    real_runs = run_small(ORDERS, nodes, gpn, ep, tokens, k, hidden, eparams, int(params["seed"]))
    for order in ORDERS:
        real = real_runs[order]
        model = traffic_model(nodes, gpn, ep, order, tokens, k, hidden, eparams, act_bytes=4,
                              grad_bytes=4)
        for kind in ("alltoall", "allreduce"):
            for cls in ("intra_node", "inter_node"):
                row = f"small real {nodes}x{gpn}, EP={ep}, {order}"
                cells.append(repro.compare(row, f"{kind} {cls} (measured)", real[kind][cls] / 1e3, "kB",
                                           note=None if real["correct"] else "a collective returned a wrong result"))
                cells.append(repro.compare(row, f"{kind} {cls} (formula)", model[kind][cls] / 1e3, "kB",
                                           note="uniform routing expectation" if kind == "alltoall" else None))
    assumptions.append(f"Small real runs: {nodes} emulated nodes x {gpn} gloo ranks, EP = {gpn}, "
                       f"{tokens} tokens x top-{k} x H = {hidden} fp32 per rank, random uniform "
                       f"routing, 4 all-to-all exchanges; ring all-reduce of {eparams} fp32 expert "
                       "gradient elements per rank. Bytes summed over all ranks.")

    # --- full scale, formula -------------------------------------------------------------
    intra_bw, inter_bw = float(params["intra_GBps"]) * GB, float(params["inter_GBps"]) * GB
    seq = int(params["seq"])
    scales = [("mixtral-8x7b", 8, 8, 8), ("xmoe-small", 8, 8, 8), ("xmoe-large", 32, 8, 64),
              ("deepseek-v3", 32, 8, 64)]
    xs, ep_first_t, dp_first_t, labels = [], [], [], []
    for key, n_nodes, per_node, ep_deg in scales:
        m = get_model(key)
        if m.n_experts % ep_deg:
            continue
        params_per_rank = m.n_experts // ep_deg * m.n_mat * m.d_model * m.d_ffn
        times = {}
        for order in ORDERS:
            t = traffic_model(n_nodes, per_node, ep_deg, order, seq, m.top_k, m.d_model,
                              params_per_rank, act_bytes=2, grad_bytes=2)
            world = n_nodes * per_node
            times[order] = comm_time_s(t, intra_bw, inter_bw, world)
            row = f"{m.name}, {world} GPUs ({n_nodes}x{per_node}), EP={ep_deg}, {order}"
            for kind in ("alltoall", "allreduce"):
                cells.append(repro.compare(row, f"{kind} inter-node per GPU", t[kind]["inter_node"] / world / GB, "GB"))
            cells.append(repro.compare(row, "comm time per GPU (model)", times[order] * 1e3, "ms",
                                       note=f"{params['intra_GBps']} GB/s intra, {params['inter_GBps']} GB/s inter-node"))
        winner = min(times, key=times.get)
        cells.append(repro.compare(f"{m.name}, EP={ep_deg}", "faster placement (1 = DP-first)",
                                   1.0 if winner == "dp-first" else 0.0, "",
                                   note=f"{winner} is faster by {max(times.values()) / min(times.values()):.2f}x"))
        labels.append(m.name)
        xs.append(len(xs))
        ep_first_t.append(times["ep-first"] * 1e3)
        dp_first_t.append(times["dp-first"] * 1e3)
    assumptions += [
        f"Full scale (formula): one MoE layer per step, {seq} tokens per GPU (micro-batch 1, "
        "X-MoE's sequence length), bf16 activations and gradients, uniform routing, ring "
        "all-reduce of each GPU's expert parameters over its DP group (no ZeRO), "
        f"intra-node {params['intra_GBps']} GB/s and inter-node {params['inter_GBps']} GB/s per GPU (App. C.1).",
        "Comm time = per-GPU bytes per class / class bandwidth, classes serialised; no overlap, "
        "no latency term. The EP/DP split per model is ours (App. C.1 uses 8 experts, EP = 8 on 64 GPUs).",
    ]
    fig = Figure(name="xmoe-appc1-time", title="Modelled MoE-layer communication time per GPU",
                 xlabel="model (" + ", ".join(f"{i}: {n}" for i, n in enumerate(labels)) + ")",
                 ylabel="ms per layer and step", yscale="log",
                 series=[{"label": "EP-first", "x": xs, "y": ep_first_t, "kind": "ours"},
                         {"label": "DP-first", "x": xs, "y": dp_first_t, "kind": "ours"}])
    return Result(cells=cells, assumptions=assumptions, figures=[fig])


REPRODUCTION = Reproduction(
    id="xmoe-appc1",
    title="EP-first vs DP-first placement: all-to-all and gradient all-reduce bytes per link class",
    paper="xmoe",
    element="App. C.1",
    how="A+R",
    description="Bytes per link class of the token all-to-all and the expert-gradient all-reduce "
                "under both placements: counted from real small runs and from the formula at full scale.",
    paper_values=[],
    compute=compute,
    defaults={"small_nodes": 2, "small_gpus_per_node": 2, "seed": 0, "seq": 4096,
              "intra_GBps": 200.0, "inter_GBps": 25.0},
)
