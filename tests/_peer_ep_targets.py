"""Rank targets for tests/test_peer_equivalence.py: the peers' own expert-parallel layers beside
ours on the same ranks, forward and backward."""

from __future__ import annotations

import torch
import torch.distributed as dist

from moe_repro.components.moe.moe_layer import MoELayer
from moe_repro.components.moe.peer_ep import peer_forward


def _grads(layer, x):
    return {
        "dx": x.grad.clone(),
        "gate": layer.gate.weight.grad.clone(),
        **{n: p.grad.clone() for n, p in layer.experts.named_parameters()},
    }


def peers_beside_ours(
    ctx, impls, tokens=48, d_model=16, d_ffn=12, experts=8, top_k=2, capacity_factor=1.25, seed=5
):
    """For each peer: our layer and the peer's layer around the same weights, the same tokens
    and the same upstream gradient; max |difference| of outputs and of every gradient."""
    out = {}
    for impl in impls:
        # the peers' semantics: Megatron dropless on our routing; DeepSpeed's capacity dropping
        opts = (
            {}
            if impl == "megatron"
            else dict(
                capacity_factor=capacity_factor, drop_policy="probs", renormalize_after_drop=True
            )
        )
        torch.manual_seed(seed)  # the same weights on every rank (router replicated)
        ours = MoELayer(d_model, d_ffn, experts, top_k, expert_parallel=True, **opts)
        torch.manual_seed(seed)
        theirs = MoELayer(d_model, d_ffn, experts, top_k, expert_parallel=True, **opts)
        g = torch.Generator().manual_seed(seed * 100 + ctx.rank)
        x = torch.randn(tokens, d_model, generator=g)
        grad_out = torch.randn(tokens, d_model, generator=g)
        forward = peer_forward(impl, theirs, dist.group.WORLD, capacity_factor)
        results = {}
        for name, layer, call in (("ours", ours, ours), ("peer", theirs, forward)):
            xi = x.clone().requires_grad_(True)
            y = call(xi)
            (y * grad_out).sum().backward()
            results[name] = (y.detach(), _grads(layer, xi))
        (y_o, g_o), (y_p, g_p) = results["ours"], results["peer"]
        diffs = {"out": (y_o - y_p).abs().max().item() if y_o.numel() else 0.0}
        for k in g_o:
            diffs[k] = (g_o[k] - g_p[k]).abs().max().item() if g_o[k].numel() else 0.0
        scale = {"out": y_o.abs().max().item(), "dx": g_o["dx"].abs().max().item()}
        with torch.no_grad():
            kept = ours.make_pft(ours.route(x)).num_rows
        out[impl] = {"diffs": diffs, "scale": scale, "dropped_pairs": tokens * top_k - kept}
        if impl == "deepspeed":  # its communication backend, set up by peer_forward
            from deepspeed.comm import comm as ds_comm

            out[impl]["shared_memory_op_built"] = ds_comm.cdb.shm_comm_op is not None
    return out


def megatron_dispatch_checked(ctx, point, reverse_received_rows=False):
    """The alltoall suite's check of Megatron's dispatcher (path megatron-dispatch) on this
    rank: #wrong of its dispatch and combine against the suite's reference. With
    ``reverse_received_rows`` its all-to-all's output rows (and their probs) come in reverse
    order: a planted fault the check must see."""
    from moe_repro.suites import alltoall

    state = alltoall.setup(point, ctx)
    megatron = state["dispatcher"].megatron
    if reverse_received_rows:
        token_dispatch = megatron.token_dispatch

        def reversed_dispatch(rows, probs):
            out, out_probs = token_dispatch(rows, probs)
            return out.flip(0), out_probs.flip(0)

        megatron.token_dispatch = reversed_dispatch
    return {"wrong": alltoall.check(state), "rows": int(state["pft"].num_rows)}
