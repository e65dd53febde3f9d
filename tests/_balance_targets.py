"""Rank targets for the balancer exactness tests (FEPLB two-phase dispatch, least-loaded EP).

Each balanced layer is compared with the loop-over-tokens float64 reference of _moe_targets
(independent of components/) and with plain EP (components/moe_layer.py) on the same inputs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from _moe_targets import load_local, make_tokens, make_weights, max_err, reference_grads


def _run(layer, x, grad_out):
    x = x.clone().requires_grad_(True)
    out = layer(x)
    (out * grad_out).sum().backward()
    return out.detach(), x.grad, {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                                  for n, p in layer.named_parameters()}


def balanced_vs_reference(ctx, cases: list[dict]) -> list[dict]:
    from moe_repro.components.feplb import FEPLBMoELayer
    from moe_repro.components.least_loaded_ep import LeastLoadedMoELayer
    from moe_repro.components.moe_layer import MoELayer

    torch.manual_seed(0)
    copy_group = dist.new_group(ranks=list(range(ctx.world_size)))
    results = []
    for case in cases:
        h, f, e, k = case["d_model"], case["d_ffn"], case["experts"], case["top_k"]
        w = make_weights(case["seed"], h, f, e, case.get("dead", ()))
        x, grad_out = make_tokens(case["seed"] * 100 + ctx.rank, case["tokens"][ctx.rank], h)
        common = dict(expert_parallel=True, gemm=case.get("gemm", "sequential"))
        if case["impl"] == "feplb":
            layer = FEPLBMoELayer(h, f, e, k, dyn=case["dyn"], tau=case.get("tau", 0),
                                  max_num_dyn=case.get("max_num_dyn"), copy_group=copy_group, **common)
        else:
            layer = LeastLoadedMoELayer(h, f, e, k, alpha=case.get("alpha", 1.0),
                                        min_chunk=case.get("min_chunk", 1), **common)
        plain = MoELayer(h, f, e, k, **common)
        load_local(layer, w)
        load_local(plain, w)
        out, dx, grads = _run(layer, x, grad_out)
        p_out, p_dx, p_grads = _run(plain, x, grad_out)

        ref_out, ref_dx, ref_grads = reference_grads(x, grad_out, w, k)
        for name in ref_grads:
            if name.startswith("experts."):
                dist.all_reduce(ref_grads[name])
        errs = {"out": max_err(out, ref_out), "dx": max_err(dx, ref_dx)}
        vs_plain = {"out": max_err(out, p_out), "dx": max_err(dx, p_dx)}
        for name, g in grads.items():
            ref = ref_grads[name][layer.local_experts] if name.startswith("experts.") else ref_grads[name]
            errs[name] = max_err(g, ref)
            vs_plain[name] = max_err(g, p_grads[name])
        if case["impl"] == "feplb":
            moves = [(m.expert, m.src, m.dst) for m in layer.stats.plan.moves]
        else:
            moves = [(s.expert, s.rank, s.rows) for s in layer.last_plan.foreign_segments()]
        results.append({"rank": ctx.rank, "errs": errs, "vs_plain": vs_plain, "moves": moves})
    return results
