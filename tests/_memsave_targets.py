"""Rank targets for the memory-saving component tests (issue 10), imported by real rank processes.

Inputs come from ``*_inputs`` helpers seeded by (seed, rank) so that the test process can rebuild
exactly the same tensors for its single-process reference."""

import torch


def vocab_inputs(seed, rank, tokens, hidden, vocab):
    """The full projection weight (same on every rank), this rank's batch, targets, output grad."""
    g = torch.Generator().manual_seed(seed)
    w_full = torch.randn(hidden, vocab, generator=g) * 0.5
    g_rank = torch.Generator().manual_seed(seed * 1000 + rank + 1)
    n = tokens[rank]
    x = torch.randn(n, hidden, generator=g_rank)
    targets = torch.randint(0, vocab, (n,), generator=g_rank)
    grad_out = torch.rand(n, generator=g_rank)
    return w_full, x, targets, grad_out


def vocab_loss(ctx, cases):
    return [_vocab_loss_one(ctx, **case) for case in cases]


def _vocab_loss_one(ctx, seed, tokens, hidden, vocab, block_cols=None, subgroups=1):
    """subgroups > 1: the world splits into that many P-rank groups of consecutive ranks (MoP's
    sub-groups of the W ranks), each sharding its own copy of W_voc."""
    import torch.distributed as dist

    from moe_repro.components.model.vocab_parallel_loss import (
        shard_bounds,
        vocab_parallel_cross_entropy,
    )

    group, p, group_rank = None, ctx.world_size, ctx.rank
    if subgroups > 1:
        p = ctx.world_size // subgroups
        groups = [dist.new_group(list(range(g * p, (g + 1) * p))) for g in range(subgroups)]
        group, group_rank = groups[ctx.rank // p], ctx.rank % p
    w_full, x, targets, grad_out = vocab_inputs(seed, ctx.rank, tokens, hidden, vocab)
    lo, hi = shard_bounds(vocab, p)[group_rank]
    w_local = w_full[:, lo:hi].clone().requires_grad_(True)
    x.requires_grad_(True)
    loss = vocab_parallel_cross_entropy(
        x, w_local, targets, vocab, group=group, block_cols=block_cols
    )
    loss.backward(grad_out)
    return {
        "loss": loss.tolist(),
        "grad_x": x.grad.tolist(),
        "grad_w": w_local.grad.tolist(),
        "lo": lo,
        "hi": hi,
    }


def attention_inputs(seed, seq, heads, kv_heads, dim):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(seq, heads, dim, generator=g)
    k = torch.randn(seq, kv_heads, dim, generator=g)
    v = torch.randn(seq, kv_heads, dim, generator=g)
    grad_out = torch.randn(seq, heads, dim, generator=g)
    return q, k, v, grad_out


def ulysses(ctx, cases):
    import torch.distributed as dist

    from moe_repro.components.model.ulysses_attention import ulysses_attention

    results = []
    for case in cases:
        # subgroups > 1: D-rank groups of consecutive ranks, each holding its own sequence
        # (seed + group index), as MoP's sequence-parallel sub-groups of the W ranks.
        subgroups = case.get("subgroups", 1)
        d = ctx.world_size // subgroups
        group, g_index, g_rank = None, 0, ctx.rank
        if subgroups > 1:
            groups = [dist.new_group(list(range(g * d, (g + 1) * d))) for g in range(subgroups)]
            g_index, g_rank = ctx.rank // d, ctx.rank % d
            group = groups[g_index]
        lengths = case["lengths"][g_index * d : (g_index + 1) * d]
        q, k, v, grad_out = attention_inputs(
            case["seed"] + g_index, sum(lengths), case["heads"], case["kv_heads"], case["dim"]
        )
        lo = sum(lengths[:g_rank])
        hi = lo + lengths[g_rank]
        ql, kl, vl = (t[lo:hi].clone().requires_grad_(True) for t in (q, k, v))
        try:
            out = ulysses_attention(ql, kl, vl, group=group)
        except ValueError as e:
            results.append({"error": str(e)})
            continue
        out.backward(grad_out[lo:hi])
        results.append(
            {
                "out": out.tolist(),
                "dq": ql.grad.tolist(),
                "dk": kl.grad.tolist(),
                "dv": vl.grad.tolist(),
                "lo": lo,
                "hi": hi,
            }
        )
    return results


def ssmb_model(seed, hidden, dense_ffn, experts, expert_ffn, top_k, activation):
    """Full weights of one layer (identical on every rank and in the test process)."""
    from moe_repro.components.moe.moe_layer import MoELayer

    torch.manual_seed(seed)
    w1 = torch.randn(hidden, dense_ffn) * hidden**-0.5
    w2 = torch.randn(dense_ffn, hidden) * dense_ffn**-0.5
    b2 = torch.randn(hidden) * 0.1
    moe = MoELayer(hidden, expert_ffn, experts, top_k, activation=activation)
    return w1, w2, b2, moe


def ssmb_inputs(seed, seq, hidden):
    g = torch.Generator().manual_seed(seed + 17)
    return torch.randn(seq, hidden, generator=g), torch.randn(seq, hidden, generator=g)


def ssmb(ctx, cases):
    from moe_repro.components.moe.ssmb import SSMBLayer

    results = []
    for case in cases:
        w1, w2, b2, moe_full = ssmb_model(
            case["seed"],
            case["hidden"],
            case["dense_ffn"],
            case["experts"],
            case["expert_ffn"],
            case["top_k"],
            case["activation"],
        )
        x, grad_out = ssmb_inputs(case["seed"], case["seq"], case["hidden"])
        per_mode = {}
        for sharded in (True, False):
            layer = SSMBLayer(w1, w2, b2, moe_full, sequence_sharded=sharded)
            xi = x.clone().requires_grad_(True)
            out = layer(xi)
            out.backward(grad_out)
            layer.sync_grads()
            per_mode["ssmb" if sharded else "tp_ep"] = {
                "out": out.tolist(),
                "dx": xi.grad.tolist(),
                "dw1": layer.dense.w1.grad.tolist(),
                "dw2": layer.dense.w2.grad.tolist(),
                "db2": layer.dense.b2.grad.tolist(),
                "dgate": layer.moe.gate.weight.grad.tolist(),
                "dw_in": layer.moe.experts.w_in.grad.tolist(),
                "dw_out": layer.moe.experts.w_out.grad.tolist(),
                "local_experts": layer.moe.local_experts,
            }
        results.append(per_mode)
    return results
