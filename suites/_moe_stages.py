"""Shared set-up for the moe-dispatch and moe-layer suites: one MoE layer forward, cut into the
stages of X-MoE Fig. 11, each stage a zero-argument call on inputs prepared beforehand.

impl "pft":    gating (+ PFT construction), buffer dispatch (gather), dispatch all-to-all-v,
               expert (grouped GEMM), combine all-to-all-v, buffer combine (weighted scatter).
               On several ranks dispatch_a2a / combine_a2a are the layer's dispatch / combine
               (its dispatcher, with the gather and the weighted sum inside).
impl "padded": gating (+ dispatch mask and combine tensor [S, E, C]), buffer dispatch (einsum
               into [E, C, H]), even all-to-all, expert (bmm on [E_local, W*C, H]), even
               all-to-all back, buffer combine (einsum).
peers (components/moe/peers.py: megatron, megatron-drop, deepspeed-sparse, deepspeed-einsum):
               the peer's own gating, dispatch and combine around the same router weight and
               the same expert weights (ours: grouped GEMM on Megatron's [N, H] rows, bmm on
               DeepSpeed's [E, C, H] buffer); one rank only, with no all-to-all stages (their
               all-to-alls need the peers' own parallel state).
Forward only, under torch.no_grad() (Fig. 11 is a forward breakdown), except in whole-layer
passes (``backward`` = 1, or a peer on ranks > 1; stage "layer"): there each implementation's
own expert-parallel layer runs (ours: its dispatcher; Megatron's token dispatcher and
DeepSpeed's MOELayer with their own all-to-alls, components/moe/peer_ep.py), forward or forward
+ backward, and ``check`` compares its output (and input gradient) with a one-rank reference. Peak memory of a stage is
measured once per grid point after a warm-up call: peak allocated bytes on CUDA, else the
process's peak resident set rise (components/training/peak_memory.py), max over ranks.
"""

from __future__ import annotations

import math

import torch

from moe_repro.runtime.device import resolve_device
from moe_repro.runtime.timing import peak_memory_bytes, reset_peak_memory
from moe_repro.components.moe.moe_layer import MoEConfig, MoELayer
from moe_repro.components.moe.padded_moe import PaddedMoELayer
from moe_repro.components.moe.impls import ONE_RANK_STAGES, get_impl, impl_names
from moe_repro.components.moe.peers import peer_dispatch, require_peer
from moe_repro.suites.base import fits_in_memory


def peer_params(p: dict) -> dict:
    """Derived params of a grid point: the implementation's package and version (recorded with
    every result; "" for ours), or a one-line refusal when it is not installed or does not
    support the point (components/moe/impls.py declares what each supports)."""
    impl = get_impl(p["impl"])
    ranks, backward = int(p.get("ranks", 1)), bool(int(p.get("backward", 0)))
    why = impl.supports(
        ranks=ranks, backward=backward, dtype=p.get("dtype", "float32"), stage=p.get("stage")
    )
    if (
        why is None
        and impl.form == "peer"
        and impl.whole_layer_only(ranks=ranks, backward=backward)
        and ranks < 2
    ):
        why = f"impl {impl.name}: the peers' expert-parallel layers need ranks >= 2"
    if why:
        raise ValueError(why)
    if impl.distribution is None:
        return {"peer": ""}
    return {"peer": f"{impl.distribution}=={require_peer(impl.name)}"}


IMPLS = impl_names()  # the registry, components/moe/impls.py
STAGES = ONE_RANK_STAGES
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# Implementations that build GShard's [S, E, C] dispatch and combine masks (one-hot, einsums)
MASKED = ("padded", "deepspeed-einsum")


def _layer_bytes(p: dict) -> float:
    """What one grid point holds at its largest (float32, every local rank): the input and
    output, the S*k dispatch rows (twice: buffer and expert output), the padded buffer
    [E, C, H] with C = capacity_factor * S * k / E, the experts' weights, the router's
    [S, E] logits and probabilities, and for the masked implementations their int64 one-hots
    ([k S, E] twice, [S, k, C]) and the two [S, E, C] masks."""
    tokens, hidden, ffn = int(p["tokens"]), int(p["d_model"]), int(p["d_ffn"])
    experts, top_k = int(p["experts"]), int(p["top_k"])
    rows = tokens * top_k * (2 + 2 * float(p["capacity_factor"]))
    need = 2 * tokens * hidden + rows * hidden + 2 * experts * hidden * ffn + 3 * tokens * experts
    if p.get("impl") in MASKED:
        capacity = math.ceil(float(p["capacity_factor"]) * tokens * top_k / experts)
        need += 2 * top_k * tokens * (3 * experts + capacity) + 2 * tokens * experts * capacity
    return 4 * int(p.get("ranks", 1)) * need


MEMORY_RULES = (fits_in_memory(_layer_bytes, {"tokens": str(2**20), "d_model": str(2**16)}),)


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


def device_for(name: str, ctx=None) -> torch.device:
    """The point's device by the runtime's one rule (runtime/device.py)."""
    return resolve_device(name, ctx)


def build(params: dict, ctx, layer_options: dict | None = None) -> tuple[MoELayer, torch.Tensor]:
    impl = get_impl(params["impl"])
    if params["dtype"] not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {params['dtype']!r}")
    tokens, hidden = int(params["tokens"]), int(params["d_model"])
    experts, top_k = int(params["experts"]), int(params["top_k"])
    if min(hidden, experts, int(params["d_ffn"])) < 1 or tokens < 0 or not 1 <= top_k <= experts:
        raise ValueError("need tokens >= 0, d_model, d_ffn, experts >= 1 and 1 <= top_k <= experts")
    device, dtype = device_for(params["device"], ctx), DTYPES[params["dtype"]]
    torch.manual_seed(1234)  # same weights on every rank: the gate is replicated
    cls = PaddedMoELayer if impl.form == "padded" else MoELayer  # peers borrow MoELayer's weights
    config = MoEConfig(
        hidden,
        int(params["d_ffn"]),
        experts,
        top_k,
        gemm=params.get("gemm", "auto"),
        overlap=str(params.get("overlap", "auto")),
        capacity_factor=float(params["capacity_factor"]),
        dtype=dtype,
    )
    layer = cls.from_config(
        config.replace(**(layer_options or {})),
        device=device,
        expert_parallel=ctx is not None and ctx.world_size > 1,
    )
    g = torch.Generator().manual_seed(99 + (ctx.rank if ctx is not None else 0))
    x = torch.randn(tokens, hidden, generator=g).to(device=device, dtype=dtype)
    return layer, x


def stage_calls(layer: MoELayer, x: torch.Tensor, impl: str) -> dict:
    """Run the forward once, keeping every stage's input; return {stage: call} (and products)."""
    calls = {}
    form = get_impl(impl).form
    with torch.no_grad():
        if form == "pft":
            calls["gating"] = lambda: layer.make_pft(layer.route(x))
            pft = calls["gating"]()
            # One rank: buffer dispatch/combine are the PFT gather and the weighted scatter, the
            # all-to-all stages move nothing. Expert parallel: the layer's dispatch and combine
            # (its dispatcher: the code the alltoall suite times and the trainer runs) gather,
            # exchange and sum in one, so the *_a2a stages hold them and the buffer stages time
            # the local gather and scatter alone.
            calls["buffer_dispatch"] = lambda: layer.buffer_dispatch(x, pft)
            dispatch_in = calls["buffer_dispatch"]()
            if layer.dispatcher is None:
                plan = layer.dispatch(x, pft)[1]
                calls["dispatch_a2a"] = lambda: (dispatch_in, plan)
            else:
                calls["dispatch_a2a"] = lambda: layer.dispatch(x, pft)
            expert_in, plan = calls["dispatch_a2a"]()
            calls["expert"] = lambda: layer.expert_compute(expert_in, plan)
            expert_out = calls["expert"]()
            calls["combine_a2a"] = (
                (lambda: expert_out)
                if layer.dispatcher is None
                else (lambda: layer.combine(expert_out, plan, pft))
            )
            calls["combine_a2a"]()
            calls["buffer_combine"] = lambda: layer.buffer_combine(dispatch_in, pft)
            rows = pft.num_rows
        elif form == "peer":
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
            before = reset_peak_memory(device)
            call()
            peak = peak_memory_bytes(device) - before
        else:
            from moe_repro.components.training.peak_memory import (
                measure_peak_rss,
                peak_supported,
                return_freed_memory_to_os,
            )

            if not peak_supported():
                return float("nan")
            return_freed_memory_to_os()
            with measure_peak_rss() as m:
                call()
            peak = m.peak_bytes
    return ctx.all_reduce_max(float(peak)) if ctx is not None else float(peak)


def layer_pass_mode(params: dict) -> bool:
    """Whole-layer passes through each implementation's own expert-parallel path (forward, or
    forward + backward with ``backward``): as the registry says (MoEImpl.whole_layer_only)."""
    return get_impl(params["impl"]).whole_layer_only(
        ranks=int(params.get("ranks", 1)), backward=bool(int(params.get("backward", 0)))
    )


def _reference_out(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """The layer's output computed on this rank alone (differentiable in x): every rank built its
    experts from the same seed (build), so expert e's weights are local expert e mod E_local's
    here. Shares no code with any dispatcher or peer."""
    from moe_repro.components.moe.pft import gather_tokens, scatter_combine

    pft = layer.make_pft(layer.route(x))
    local = pft.expert_ids % len(layer.local_experts)
    order = torch.argsort(local, stable=True)
    rows = gather_tokens(x, pft).index_select(0, order)
    counts = torch.bincount(local, minlength=len(layer.local_experts))
    y = torch.zeros_like(rows).index_copy(0, order, layer.experts(rows, counts))
    out = scatter_combine(y, pft, layer.combine_accumulate)
    if layer.shared is not None:
        out = out + layer.shared(x, torch.tensor([x.shape[0]]))
    return out


def setup_layer_pass(params: dict, ctx) -> dict:
    """One implementation's whole layer over the real EP group: ours (its dispatcher), or a
    peer's own expert-parallel layer (components/moe/peer_ep.py) around our weights."""
    from moe_repro.components.moe.peer_ep import peer_forward

    impl, backward = params["impl"], bool(int(params.get("backward", 0)))
    peer_params(params)  # what the registry says it supports (one-line refusal)
    set_threads(params, ctx)
    layer, x = build(params, ctx, get_impl(impl).layer_options)
    if get_impl(impl).form == "peer":
        import torch.distributed as dist

        if not layer.expert_parallel:
            raise ValueError(f"impl {impl}: the peers' expert-parallel layers need ranks >= 2")
        forward = peer_forward(impl, layer, dist.group.WORLD, float(params["capacity_factor"]))
    else:
        forward = layer
    g = torch.Generator().manual_seed(7 + (ctx.rank if ctx is not None else 0))
    grad_out = torch.randn(x.shape, generator=g).to(x)

    def call():
        if not backward:
            with torch.no_grad():
                return forward(x)
        layer.zero_grad(set_to_none=True)
        xi = x.detach().requires_grad_(True)
        out = forward(xi)
        (out * grad_out).sum().backward()
        return out.detach(), xi.grad

    return {
        "call": call,
        "layer": layer,
        "x": x,
        "impl": impl,
        "backward": backward,
        "peak_bytes": float("nan"),
        "buffer_rows": float("nan"),
        "pass": True,
        "grad_out": grad_out,
    }


def check_layer_pass(state: dict) -> int:
    """Elements of the output (and, with backward, of the input gradient) that differ from the
    one-rank reference (:func:`_reference_out`) by more than 1e-5 of the largest value in fp32
    (1e-2 in bf16): a peer's own path and ours are checked alike. 0 outside whole-layer passes
    (the stage calls are checked by tests/test_moe_layer.py)."""
    if not state.get("pass"):
        return 0
    layer, x = state["layer"], state["x"]
    got = state["call"]()
    out, dx = got if state["backward"] else (got, None)
    xi = x.detach().clone().requires_grad_(state["backward"])
    want = _reference_out(layer, xi)
    tol = 1e-2 if x.dtype == torch.bfloat16 else 1e-5

    def wrong(a, b):
        return int(
            (
                (a.float() - b.float()).abs()
                > tol * max(1.0, b.abs().max().item() if b.numel() else 0)
            ).sum()
        )

    count = wrong(out, want.detach())
    if dx is not None:
        (ref_dx,) = torch.autograd.grad((want * state["grad_out"]).sum(), xi)
        count += wrong(dx, ref_dx)
    return count


def setup_stage(params: dict, ctx) -> dict:
    if layer_pass_mode(params):
        return setup_layer_pass(params, ctx)
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
        raise ValueError(
            f"stage must be one of {', '.join((*STAGES, 'layer', 'total'))}, got {stage!r}"
        )
    peak = measure_peak_bytes(call, x.device, ctx)
    return {
        "call": call,
        "peak_bytes": peak,
        "buffer_rows": prepared["buffer_rows"],
        "layer": layer,
        "x": x,
        "impl": params["impl"],
        "peer": prepared.get("peer"),
    }


def run_stage(state: dict) -> None:
    if state.get("pass"):  # a whole-layer pass: the call holds its own grad mode
        state["call"]()
        return
    with torch.no_grad():
        state["call"]()


def derive_stage(params: dict, state: dict, time_s: float) -> dict:
    if state.get("pass"):
        return {}
    return {"peak_bytes": state["peak_bytes"], "buffer_rows": state["buffer_rows"]}
