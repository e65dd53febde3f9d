"""Loop-over-tokens MoE reference and rank targets for the MoE layer tests.

The reference is deliberately naive and independent of components/: for each token it scores
every expert, picks the k best with Python's sorted(), and adds each chosen expert's FFN output
times its weight, in float64. Nothing in it uses PFT, grouped GEMMs or dispatch masks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def make_weights(
    seed: int, d_model: int, d_ffn: int, num_experts: int, dead_experts=(), num_shared: int = 0
) -> dict[str, torch.Tensor]:
    """Full (global) layer weights, identical on every rank for the same seed.

    Feature 0 of the inputs is a large constant (see make_tokens); a strongly negative gate
    weight on it means those experts never win a top-k slot (empty experts), and the spread of
    the others' weights makes routing uneven.
    """
    g = torch.Generator().manual_seed(seed)
    gate = torch.randn(d_model, num_experts, generator=g) * 0.5
    gate[0] = torch.linspace(0.0, 1.0, num_experts)
    for e in dead_experts:
        gate[0, e] = -4.0
    w = {
        "gate.weight": gate,
        "experts.w_in": torch.randn(num_experts, d_model, d_ffn, generator=g) * d_model**-0.5,
        "experts.w_gate": torch.randn(num_experts, d_model, d_ffn, generator=g) * d_model**-0.5,
        "experts.w_out": torch.randn(num_experts, d_ffn, d_model, generator=g) * d_ffn**-0.5,
    }
    if num_shared:
        width = num_shared * d_ffn
        w["shared.w_in"] = torch.randn(1, d_model, width, generator=g) * d_model**-0.5
        w["shared.w_gate"] = torch.randn(1, d_model, width, generator=g) * d_model**-0.5
        w["shared.w_out"] = torch.randn(1, width, d_model, generator=g) * width**-0.5
    return w


def make_tokens(seed: int, num_tokens: int, d_model: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer input [S, H] (feature 0 = 4.0) and an upstream gradient for the output."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, d_model, generator=g)
    x[:, 0] = 4.0
    return x, torch.randn(num_tokens, d_model, generator=g)


def reference_forward(
    x: torch.Tensor,
    w: dict[str, torch.Tensor],
    top_k: int,
    score: str = "softmax",
    normalize: bool = False,
) -> torch.Tensor:
    """out[s] = sum over the k best experts e of weight(s, e) * SwiGLU_e(x[s]) (+ shared)."""
    rows = []
    num_experts = w["gate.weight"].shape[1]
    for s in range(x.shape[0]):
        logits = x[s] @ w["gate.weight"]
        scores = torch.softmax(logits, 0) if score == "softmax" else torch.sigmoid(logits)
        chosen = sorted(range(num_experts), key=lambda e: -float(scores[e].detach()))[:top_k]
        total = sum(scores[e] for e in chosen)
        row = torch.zeros_like(x[s])
        for e in chosen:
            weight = scores[e] / total if normalize else scores[e]
            hidden = F.silu(x[s] @ w["experts.w_gate"][e]) * (x[s] @ w["experts.w_in"][e])
            row = row + weight * (hidden @ w["experts.w_out"][e])
        if "shared.w_in" in w:
            hidden = F.silu(x[s] @ w["shared.w_gate"][0]) * (x[s] @ w["shared.w_in"][0])
            row = row + hidden @ w["shared.w_out"][0]
        rows.append(row)
    return torch.stack(rows) if rows else x.new_zeros(0, x.shape[1])


def reference_grads(x, grad_out, w, top_k, score="softmax", normalize=False):
    """Output, input gradient and weight gradients of the reference, in float64."""
    x64 = x.double().requires_grad_(True)
    w64 = {k: v.double().requires_grad_(True) for k, v in w.items()}
    out = reference_forward(x64, w64, top_k, score, normalize)
    if out.requires_grad:  # S = 0: nothing to differentiate, every gradient is zero
        (out * grad_out.double()).sum().backward()
    grads = {k: (v.grad if v.grad is not None else torch.zeros_like(v)) for k, v in w64.items()}
    return out.detach(), x64.grad if x64.grad is not None else torch.zeros_like(x64), grads


def load_local(layer, w: dict[str, torch.Tensor]) -> None:
    """Copy the global weights into a layer that holds only its rank's experts."""
    local = layer.local_experts
    with torch.no_grad():
        for name, p in layer.named_parameters():
            full = w[name]
            p.copy_(full[local] if name.startswith("experts.") else full)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max abs difference relative to the reference's scale (0 for empty tensors)."""
    if a.numel() == 0:
        return 0.0
    scale = max(1.0, float(b.abs().max()))
    return float((a.double() - b.double()).abs().max()) / scale


def layer_vs_reference(ctx, cases: list[dict]) -> list[dict]:
    """Rank target: MoE layer under EP vs the single-process reference, per case."""
    import torch.distributed as dist

    from moe_repro.components.moe.moe_layer import ExpertPlacement, MoELayer
    from moe_repro.components.moe.padded_moe import PaddedMoELayer

    torch.manual_seed(0)
    results = []
    for case in cases:
        h, f, e, k = case["d_model"], case["d_ffn"], case["experts"], case["top_k"]
        w = make_weights(case["seed"], h, f, e, case.get("dead", ()), case.get("shared", 0))
        x, grad_out = make_tokens(case["seed"] * 100 + ctx.rank, case["tokens"][ctx.rank], h)
        dtype = getattr(torch, case.get("dtype", "float32"))
        if dtype != torch.float32:  # the layer holds rounded values: so does the reference
            w = {n: t.to(dtype).float() for n, t in w.items()}
            x, grad_out = x.to(dtype), grad_out.to(dtype)
        placement = (
            ExpertPlacement.from_ranks(case["rank_of_expert"], ctx.world_size)
            if case.get("rank_of_expert")
            else None
        )
        kwargs = dict(
            num_shared=case.get("shared", 0),
            gemm=case.get("gemm", "sequential"),
            expert_parallel=True,
            placement=placement,
            dtype=dtype,
        )
        if case.get("impl") == "padded":
            layer = PaddedMoELayer(
                h, f, e, k, capacity_factor=float(e), **kwargs
            )  # C >= S: no drops
        else:
            layer = MoELayer(h, f, e, k, **kwargs)
        load_local(layer, w)
        x.requires_grad_(True)
        out = layer(x)
        (out * grad_out).sum().backward()

        ref_out, ref_dx, ref_grads = reference_grads(x.detach().float(), grad_out.float(), w, k)
        for name in ref_grads:  # expert weights see every rank's tokens: sum the references
            if name.startswith("experts."):
                dist.all_reduce(ref_grads[name])
        errs = {"out": max_err(out.detach(), ref_out), "dx": max_err(x.grad, ref_dx)}
        for name, p in layer.named_parameters():
            ref = (
                ref_grads[name][layer.local_experts]
                if name.startswith("experts.")
                else ref_grads[name]
            )
            errs[name] = max_err(p.grad if p.grad is not None else torch.zeros_like(p), ref)
        results.append(
            {
                "rank": ctx.rank,
                "rows": int(x.shape[0]),
                "errs": errs,
                "local_experts": layer.local_experts,
            }
        )
    return results


def halo_layer_vs_flat_layer(ctx, cases: list[dict]) -> list[dict]:
    """Rank target: the same MoE layer with HALO and with the flat all-to-all (same weights,
    tokens and upstream gradient): outputs, input and parameter gradients must be identical; the
    HALO layer is also checked against the loop reference."""
    import torch.distributed as dist

    from moe_repro.components.moe.moe_layer import ExpertPlacement, MoELayer

    results = []
    for case in cases:
        h, f, e, k = case["d_model"], case["d_ffn"], case["experts"], case["top_k"]
        w = make_weights(case["seed"], h, f, e, case.get("dead", ()), case.get("shared", 0))
        x, grad_out = make_tokens(case["seed"] * 100 + ctx.rank, case["tokens"][ctx.rank], h)
        placement = (
            ExpertPlacement.from_ranks(case["rank_of_expert"], ctx.world_size)
            if case.get("rank_of_expert")
            else None
        )
        runs = {}
        for kind in ("flat", "halo"):
            layer = MoELayer(
                h,
                f,
                e,
                k,
                num_shared=case.get("shared", 0),
                expert_parallel=True,
                placement=placement,
                all_to_all=kind,
                overlap="off",  # the dispatchers' own paths, bit for bit
            )
            load_local(layer, w)
            xi = x.clone().requires_grad_(True)
            out = layer(xi)
            (out * grad_out).sum().backward()
            runs[kind] = (
                out.detach(),
                xi.grad,
                {
                    n: (p.grad if p.grad is not None else torch.zeros_like(p))
                    for n, p in layer.named_parameters()
                },
                layer,
            )
        (out_f, dx_f, g_f, _), (out_h, dx_h, g_h, halo_layer) = runs["flat"], runs["halo"]
        identical = {
            "out": torch.equal(out_f, out_h),
            "dx": torch.equal(dx_f, dx_h),
            **{n: torch.equal(g_f[n], g_h[n]) for n in g_f},
        }
        ref_out, ref_dx, ref_grads = reference_grads(x, grad_out, w, k)
        for name in ref_grads:
            if name.startswith("experts."):
                dist.all_reduce(ref_grads[name])
        errs = {"out": max_err(out_h, ref_out), "dx": max_err(dx_h, ref_dx)}
        for name, g in g_h.items():
            ref = ref_grads[name]
            errs[name] = max_err(
                g, ref[halo_layer.local_experts] if name.startswith("experts.") else ref
            )
        results.append(
            {"rank": ctx.rank, "rows": int(x.shape[0]), "identical": identical, "errs": errs}
        )
    return results


def overlap_vs_unpipelined(ctx, cases: list[dict]) -> list[dict]:
    """Rank target: the layer with dispatch/combine pipelined in ``case["overlap"]`` chunks vs
    the same layer unpipelined (overlap="off"), same weights, tokens and upstream gradient:
    output, input and every parameter gradient (errs_vs_off), and the pipelined layer against
    the loop reference (errs). ``dtype``: the layer's (the reference takes its rounded values)."""
    import torch.distributed as dist

    from moe_repro.components.moe.moe_layer import ExpertPlacement, MoELayer

    results = []
    for case in cases:
        h, f, e, k = case["d_model"], case["d_ffn"], case["experts"], case["top_k"]
        w = make_weights(case["seed"], h, f, e, case.get("dead", ()), case.get("shared", 0))
        x, grad_out = make_tokens(case["seed"] * 100 + ctx.rank, case["tokens"][ctx.rank], h)
        dtype = getattr(torch, case.get("dtype", "float32"))
        w = {n: t.to(dtype).float() for n, t in w.items()}
        x, grad_out = x.to(dtype), grad_out.to(dtype)
        placement = (
            ExpertPlacement.from_ranks(case["rank_of_expert"], ctx.world_size)
            if case.get("rank_of_expert")
            else None
        )
        runs = {}
        for overlap in ("off", case["overlap"]):
            layer = MoELayer(
                h,
                f,
                e,
                k,
                num_shared=case.get("shared", 0),
                gemm=case.get("gemm", "auto"),
                expert_parallel=True,
                placement=placement,
                overlap=overlap,
                dtype=dtype,
            )
            load_local(layer, w)
            xi = x.clone().requires_grad_(True)
            out = layer(xi)
            (out * grad_out).sum().backward()
            grads = {n: p.grad for n, p in layer.named_parameters()}
            runs[overlap] = (out.detach(), xi.grad, grads, layer)
        (out_o, dx_o, g_o, _), (out_p, dx_p, g_p, piped) = runs["off"], runs[case["overlap"]]
        with torch.no_grad():  # the timed forward-only passes keep no graphs
            out_nograd = piped(x)
        errs_vs_off = {
            "out": max_err(out_p, out_o),
            "dx": max_err(dx_p, dx_o),
            "out_no_grad": max_err(out_nograd, out_o),
        }
        for n in g_o:
            errs_vs_off[n] = max_err(g_p[n], g_o[n])
        ref_out, ref_dx, ref_grads = reference_grads(x.float(), grad_out.float(), w, k)
        for name in ref_grads:
            if name.startswith("experts."):
                dist.all_reduce(ref_grads[name])
        errs = {"out": max_err(out_p, ref_out), "dx": max_err(dx_p, ref_dx)}
        for name, g in g_p.items():
            ref = ref_grads[name]
            errs[name] = max_err(
                g, ref[piped.local_experts] if name.startswith("experts.") else ref
            )
        results.append(
            {
                "rank": ctx.rank,
                "chunks": piped.overlap_chunks(),
                "errs_vs_off": errs_vs_off,
                "errs": errs,
                "out_dtype": str(out_p.dtype),
            }
        )
    return results


def counts_async_vs_blocking(ctx) -> dict:
    """Rank target: Comm.allgather_ints_async (the pipelined layer's counts exchange) gives
    what the blocking all-gather gives, with local work between issue and read."""
    from moe_repro.components.network.comm import TorchComm

    comm = TorchComm.of_group()
    values = [ctx.rank, 5, 3 * ctx.rank + 1]
    pending = comm.allgather_ints_async(values)
    torch.randn(64, 64) @ torch.randn(64, 64)  # work while it is in flight
    return {"async": pending(), "blocking": comm.allgather_ints(values)}
