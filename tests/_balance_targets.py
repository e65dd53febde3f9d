"""Rank targets for the balancer exactness tests (FEPLB two-phase dispatch, least-loaded EP).

Each balanced layer is compared with the loop-over-tokens float64 reference of _moe_targets
(independent of components/) and with plain EP (components/moe/moe_layer.py) on the same inputs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from _moe_targets import load_local, make_tokens, make_weights, max_err, reference_grads


def _run(layer, x, grad_out):
    x = x.clone().requires_grad_(True)
    out = layer(x)
    (out * grad_out).sum().backward()
    return (
        out.detach(),
        x.grad,
        {
            n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in layer.named_parameters()
        },
    )


def balanced_vs_reference(ctx, cases: list[dict]) -> list[dict]:
    from moe_repro.components.balance.feplb import FEPLBMoELayer
    from moe_repro.components.balance.least_loaded_ep import LeastLoadedMoELayer
    from moe_repro.components.moe.moe_layer import MoELayer

    torch.manual_seed(0)
    copy_group = dist.new_group(ranks=list(range(ctx.world_size)))
    results = []
    for case in cases:
        h, f, e, k = case["d_model"], case["d_ffn"], case["experts"], case["top_k"]
        w = make_weights(case["seed"], h, f, e, case.get("dead", ()))
        x, grad_out = make_tokens(case["seed"] * 100 + ctx.rank, case["tokens"][ctx.rank], h)
        common = dict(expert_parallel=True, gemm=case.get("gemm", "sequential"))
        if case["impl"] == "feplb":
            layer = FEPLBMoELayer(
                h,
                f,
                e,
                k,
                dyn=case["dyn"],
                tau=case.get("tau", 0),
                max_num_dyn=case.get("max_num_dyn"),
                copy_group=copy_group,
                **common,
            )
        else:
            layer = LeastLoadedMoELayer(
                h,
                f,
                e,
                k,
                alpha=case.get("alpha", 1.0),
                min_chunk=case.get("min_chunk", 1),
                **common,
            )
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
            ref = (
                ref_grads[name][layer.local_experts]
                if name.startswith("experts.")
                else ref_grads[name]
            )
            errs[name] = max_err(g, ref)
            vs_plain[name] = max_err(g, p_grads[name])
        overlap = None
        if case["impl"] == "feplb":
            moves = [(m.expert, m.src, m.dst) for m in layer.stats.plan.moves]
            copy = layer.stats.copy
            overlap = vars(copy.overlap()) if copy is not None and copy.overlap() else None
        else:
            moves = [(s.expert, s.rank, s.rows) for s in layer.last_plan.foreign_segments()]
        results.append(
            {
                "rank": ctx.rank,
                "errs": errs,
                "vs_plain": vs_plain,
                "moves": moves,
                "overlap": overlap,
            }
        )
    return results


def migration_unchanged(
    ctx, seed: int, tokens: list[int], experts: int, swaps: list[list[int]]
) -> dict:
    """EP layer + Adam state; migrate experts across ranks (Alg. 2 swaps); compare the layer's
    output, input gradient, and per-logical-expert weights, gradients and Adam state."""
    from moe_repro.components.balance.expert_migration import migrate_ep_layer
    from moe_repro.components.moe.moe_layer import ExpertPlacement, MoELayer

    h, f, k = 12, 10, 2
    w = make_weights(seed, h, f, experts)
    x, grad_out = make_tokens(seed * 100 + ctx.rank, tokens[ctx.rank], h)
    layer = MoELayer(h, f, experts, k, expert_parallel=True)
    load_local(layer, w)
    opt = torch.optim.Adam(layer.parameters(), lr=1e-2)
    _, _, _ = _run(layer, x, grad_out)
    opt.step()

    def per_expert(lay):
        out = {}
        for name in ("w_in", "w_gate", "w_out"):
            p = getattr(lay.experts, name)
            st = opt.state[p]
            for i, e in enumerate(lay.local_experts):
                out[(name, e)] = (
                    p.detach()[i].clone(),
                    p.grad[i].clone(),
                    st["exp_avg"][i].clone(),
                    st["exp_avg_sq"][i].clone(),
                )
        return out

    layer.zero_grad()
    out0, dx0, _ = _run(layer, x, grad_out)
    before = per_expert(layer)
    ranks = layer.placement.rank_of_expert().tolist()
    for a, b in swaps:
        ranks[a], ranks[b] = ranks[b], ranks[a]
    sent = migrate_ep_layer(layer, opt, ExpertPlacement.from_ranks(ranks, ctx.world_size))
    layer.zero_grad()
    out1, dx1, _ = _run(layer, x, grad_out)
    after = per_expert(layer)
    # every logical expert's state, gathered from whichever rank now holds it
    mine = {f"{n}:{e}": [t.tolist() for t in v] for (n, e), v in after.items()}
    was = {f"{n}:{e}": [t.tolist() for t in v] for (n, e), v in before.items()}
    return {
        "out": max_err(out1, out0),
        "dx": max_err(dx1, dx0),
        "after": mine,
        "before": was,
        "sent": sent,
        "local": layer.local_experts,
    }


def assert_exact_vs_plain(results, tol=1e-5):
    """Every rank's case: the balanced layer within ``tol`` of the loop reference and of plain EP."""
    for rank_results in results:
        for r in rank_results:
            assert max(r["errs"].values()) < tol, r
            assert max(r["vs_plain"].values()) < tol, r
