"""Shared set-up for the moe-dispatch and moe-layer suites: one MoE layer forward, cut into the
stages of X-MoE Fig. 11, each stage a zero-argument call on inputs prepared beforehand.

impl "pft":    gating (+ PFT construction), buffer dispatch (gather), dispatch all-to-all-v,
               expert (grouped GEMM), combine all-to-all-v, buffer combine (weighted scatter).
impl "padded": gating (+ dispatch mask and combine tensor [S, E, C]), buffer dispatch (einsum
               into [E, C, H]), even all-to-all, expert (bmm on [E_local, W*C, H]), even
               all-to-all back, buffer combine (einsum).
peers (components/moe/peers.py: megatron, megatron-drop, deepspeed-sparse, deepspeed-einsum):
               the peer's own gating, dispatch and combine around the same router weight and
               the same expert weights (ours: grouped GEMM on Megatron's [N, H] rows, bmm on
               DeepSpeed's [E, C, H] buffer); one rank only, with no all-to-all stages (their
               all-to-alls need the peers' own parallel state).
Forward only, under torch.no_grad() (Fig. 11 is a forward breakdown). Peak memory of a stage is
measured once per grid point after a warm-up call: peak allocated bytes on CUDA, else the
process's peak resident set rise (components/training/peak_memory.py), max over ranks.
"""

from __future__ import annotations

import torch

from moe_repro.components.moe.moe_layer import MoELayer
from moe_repro.components.moe.padded_moe import PaddedMoELayer
from moe_repro.components.moe.peers import PEER_IMPLS, peer_dispatch, require_peer
from moe_repro.suites.base import fits_in_memory


def peer_params(p: dict) -> dict:
    """Derived params of a grid point: the peer's package and version (recorded with every
    result), or a one-line refusal when it is not installed or the stage needs ranks."""
    if p["impl"] not in PEER_IMPLS:
        return {"peer": ""}
    version = require_peer(p["impl"])
    if int(p.get("ranks", 1)) != 1:
        raise ValueError(f"impl {p['impl']} runs on one rank (ranks=1): its all-to-all needs the "
                         f"peer's own parallel state")
    if p["stage"] not in (*PEER_STAGES, "layer", "total"):
        raise ValueError(f"impl {p['impl']} has stages {', '.join(PEER_STAGES)}, layer, total; "
                         f"got {p['stage']!r}")
    return {"peer": f"{PEER_IMPLS[p['impl']][0]}=={version}"}

OUR_IMPLS = ("pft", "padded")
IMPLS = (*OUR_IMPLS, *PEER_IMPLS)
PEER_STAGES = ("gating", "buffer_dispatch", "expert", "buffer_combine")
STAGES = ("gating", "buffer_dispatch", "dispatch_a2a", "expert", "combine_a2a", "buffer_combine")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _layer_bytes(p: dict) -> float:
    """What one grid point holds at its largest (float32, every local rank): the input and
    output, the S*k dispatch rows (twice: buffer and expert output), the padded buffer
    [E, C, H] with C = capacity_factor * S * k / E, and the experts' weights."""
    tokens, hidden, ffn = int(p["tokens"]), int(p["d_model"]), int(p["d_ffn"])
    experts, top_k = int(p["experts"]), int(p["top_k"])
    rows = tokens * top_k * (2 + 2 * float(p["capacity_factor"]))
    return 4 * int(p.get("ranks", 1)) * (2 * tokens * hidden + rows * hidden + 2 * experts * hidden * ffn)


MEMORY_RULES = (fits_in_memory(_layer_bytes, {"tokens": str(2 ** 20), "d_model": str(2 ** 16)}),)


def set_threads(params: dict, ctx) -> None:
    """Intra-op threads of this process (``threads``; 0 keeps what it has: torch's default in a
    local run, the launcher's share of the cores on a rank). An explicit count also applies on
    a rank, so a one-rank world can run with the one thread each rank of a two-rank world gets
    on two cores (a single-threaded index_add_ is several times faster than a two-threaded one
    there, so thread counts must match where times are compared)."""
    threads = int(params.get("threads", 0))
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    if threads:
        torch.set_num_threads(threads)


def device_for(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build(params: dict, ctx) -> tuple[MoELayer, torch.Tensor]:
    impl = params["impl"]
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if params["dtype"] not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {params['dtype']!r}")
    tokens, hidden = int(params["tokens"]), int(params["d_model"])
    experts, top_k = int(params["experts"]), int(params["top_k"])
    if min(hidden, experts, int(params["d_ffn"])) < 1 or tokens < 0 or not 1 <= top_k <= experts:
        raise ValueError("need tokens >= 0, d_model, d_ffn, experts >= 1 and 1 <= top_k <= experts")
    device, dtype = device_for(params["device"]), DTYPES[params["dtype"]]
    torch.manual_seed(1234)  # same weights on every rank: the gate is replicated
    cls = PaddedMoELayer if impl == "padded" else MoELayer  # peers borrow MoELayer's weights
    layer = cls(hidden, int(params["d_ffn"]), experts, top_k,
                capacity_factor=float(params["capacity_factor"]), gemm=params.get("gemm", "sequential"),
                expert_parallel=ctx is not None and ctx.world_size > 1, dtype=dtype, device=device)
    g = torch.Generator().manual_seed(99 + (ctx.rank if ctx is not None else 0))
    x = torch.randn(tokens, hidden, generator=g).to(device=device, dtype=dtype)
    return layer, x


def stage_calls(layer: MoELayer, x: torch.Tensor, impl: str) -> dict:
    """Run the forward once, keeping every stage's input; return {stage: call} (and products)."""
    calls = {}
    with torch.no_grad():
        if impl == "pft":
            calls["gating"] = lambda: layer.make_pft(layer.route(x))
            pft = calls["gating"]()
            calls["buffer_dispatch"] = lambda: layer.buffer_dispatch(x, pft)
            dispatch_in = calls["buffer_dispatch"]()
            calls["dispatch_a2a"] = lambda: layer.dispatch_alltoall(dispatch_in, pft)
            expert_in, plan = calls["dispatch_a2a"]()
            calls["expert"] = lambda: layer.expert_compute(expert_in, plan)
            expert_out = calls["expert"]()
            calls["combine_a2a"] = lambda: layer.combine_alltoall(expert_out, plan)
            combine_in = calls["combine_a2a"]()
            calls["buffer_combine"] = lambda: layer.buffer_combine(combine_in, pft)
            rows = pft.num_rows
        elif impl in PEER_IMPLS:
            peer = peer_dispatch(impl, layer.gate.weight, layer.top_k, layer.capacity_factor)
            calls["gating"] = lambda: peer.route(x)
            routing = calls["gating"]()
            calls["buffer_dispatch"] = lambda: peer.dispatch(x, routing)
            buffer = calls["buffer_dispatch"]()

            def experts_on(buf, r):
                if buf.dim() == 3:  # DeepSpeed's [E, C, H] capacity buffer
                    return layer.experts.forward_padded(buf)
                return layer.experts(buf, r["map"].sum(0).long())  # Megatron's [N, H], expert-major

            def whole_layer():
                r = peer.route(x)
                return peer.combine(experts_on(peer.dispatch(x, r), r), r)

            calls["expert"] = lambda: experts_on(buffer, routing)
            expert_out = calls["expert"]()
            calls["buffer_combine"] = lambda: peer.combine(expert_out, routing)
            calls["layer"] = whole_layer
            rows = buffer.shape[0] * (buffer.shape[1] if buffer.dim() == 3 else 1)
            return {"calls": calls, "buffer_rows": rows, "peer": peer}
        else:
            def gating():
                gate = layer.route(x)
                return gate, layer.make_masks(gate)
            calls["gating"] = gating
            _, (mask, combine) = gating()
            calls["buffer_dispatch"] = lambda: layer.buffer_dispatch_padded(x, mask)
            buffers = calls["buffer_dispatch"]()
            calls["dispatch_a2a"] = lambda: layer.dispatch_alltoall_padded(buffers)
            expert_in = calls["dispatch_a2a"]()
            calls["expert"] = lambda: layer.expert_compute_padded(expert_in)
            expert_out = calls["expert"]()
            capacity = mask.shape[2]
            calls["combine_a2a"] = lambda: layer.combine_alltoall_padded(expert_out, capacity)
            combine_in = calls["combine_a2a"]()
            calls["buffer_combine"] = lambda: layer.buffer_combine_padded(combine_in, combine)
            rows = layer.num_experts * capacity
    calls["layer"] = lambda: layer(x)
    return {"calls": calls, "buffer_rows": rows}


def measure_peak_bytes(call, device: torch.device, ctx) -> float:
    """Peak memory of one call above what was allocated before it (see module docstring)."""
    with torch.no_grad():
        call()  # warm-up: lazily built kernels, thread pools
        if device.type == "cuda":
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            call()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - before
        else:
            from moe_repro.components.training.peak_memory import (measure_peak_rss, peak_supported,
                                                          return_freed_memory_to_os)
            if not peak_supported():
                return float("nan")
            return_freed_memory_to_os()
            with measure_peak_rss() as m:
                call()
            peak = m.peak_bytes
    return ctx.all_reduce_max(float(peak)) if ctx is not None else float(peak)


def setup_stage(params: dict, ctx) -> dict:
    stage = params["stage"]
    set_threads(params, ctx)
    layer, x = build(params, ctx)
    prepared = stage_calls(layer, x, params["impl"])
    calls = prepared["calls"]
    if stage == "total":  # gating + buffer dispatch + buffer combine (the moe-dispatch total)
        chosen = [calls["gating"], calls["buffer_dispatch"], calls["buffer_combine"]]
        call = lambda: [c() for c in chosen]  # noqa: E731
    elif stage in calls:
        call = calls[stage]
    else:
        raise ValueError(f"stage must be one of {', '.join((*STAGES, 'layer', 'total'))}, got {stage!r}")
    peak = measure_peak_bytes(call, x.device, ctx)
    return {"call": call, "peak_bytes": peak, "buffer_rows": prepared["buffer_rows"],
            "layer": layer, "x": x, "impl": params["impl"], "peer": prepared.get("peer")}


def run_stage(state: dict) -> None:
    with torch.no_grad():
        state["call"]()


def derive_stage(params: dict, state: dict, time_s: float) -> dict:
    return {"peak_bytes": state["peak_bytes"], "buffer_rows": state["buffer_rows"]}
