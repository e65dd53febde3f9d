"""Routing traces: format invariants, seeded synthetic generator, FEPLB's straggler metrics."""

import pytest
import torch

from moe_repro.components.balance.routing_trace import (
    GemmTimeModel,
    RoutingTrace,
    contiguous_ranks,
    counts_from_top_experts,
    device_loads,
    gemm_straggler,
    max_min_gap,
    synthetic_trace,
    token_straggler,
)


def _trace(**kw):
    args = dict(
        num_layers=2,
        num_micro_batches=5,
        num_experts=16,
        top_k=2,
        tokens_per_source=64,
        num_sources=4,
    )
    args.update(kw)
    return synthetic_trace(**args)


def test_counts_sum_to_tokens_times_k_and_seeded():
    t = _trace(seed=3, keep_tokens=True)
    assert t.counts.shape == (2, 5, 4, 16)
    assert bool((t.counts.sum(-1) == 64 * 2).all())
    assert torch.equal(t.counts, _trace(seed=3).counts)
    assert not torch.equal(t.counts, _trace(seed=4).counts)
    # kept tokens agree with the counts, and each token's k experts are distinct
    top = t.top_experts[1][2]
    assert top.shape == (256, 2) and bool((top[:, 0] != top[:, 1]).all())
    assert torch.equal(counts_from_top_experts(top, 16, 4), t.counts[1, 2])
    assert t.source.startswith("synthetic")


def test_skew_drift_noise_do_what_they_say():
    flat = _trace(skew=0.0, drift=0.0, noise=0.0, tokens_per_source=2000, num_micro_batches=2)
    skewed = _trace(skew=2.0, drift=0.0, noise=0.0, tokens_per_source=2000, num_micro_batches=2)
    cv = lambda c: float(c.double().std() / c.double().mean())  # noqa: E731
    assert cv(skewed.expert_counts(0, 0)) > 3 * cv(flat.expert_counts(0, 0))
    still = _trace(skew=1.0, drift=0.0, noise=0.0, num_micro_batches=30, tokens_per_source=500)
    moving = _trace(skew=1.0, drift=0.5, noise=0.0, num_micro_batches=30, tokens_per_source=500)

    def change(t):  # how far the expert popularity moved from first to last micro-batch
        a, b = t.expert_counts(0, 0).double(), t.expert_counts(0, 29).double()
        return float((a / a.sum() - b / b.sum()).abs().sum())

    assert change(moving) > 2 * change(still)


def test_regroup_sources():
    t = _trace()
    two = t.regroup_sources(2)
    assert torch.equal(two.counts[:, :, 0], t.counts[:, :, 0] + t.counts[:, :, 1])
    with pytest.raises(ValueError):
        t.regroup_sources(3)


def test_metrics_by_hand():
    # FEPLB Sec. 3.1: token straggler = max - mean.
    assert token_straggler([10, 20, 30, 60]) == 60 - 30
    assert gemm_straggler([1.0, 1.0, 4.0]) == 2.0
    assert max_min_gap([3, 9, 5]) == 6
    counts = torch.tensor([5, 0, 7, 1, 2, 2])
    assert device_loads(counts, contiguous_ranks(6, 3), 3).tolist() == [5, 8, 4]
    assert device_loads(counts, [2, 2, 0, 0, 1, 1], 3).tolist() == [8, 4, 5]


def test_gemm_model_memory_bound_small_groups():
    m = GemmTimeModel(d_model=1024, d_ffn=512, flops_per_s=1e15, bytes_per_s=3e12)
    # weights dominate small groups: one group of 64 costs less than two groups of 32
    assert m.expert_time_s(64) < 2 * m.expert_time_s(32)
    assert m.expert_time_s(0) == 0.0
    # large groups become compute-bound: time ~ linear in rows
    assert m.expert_time_s(200_000) == pytest.approx(2 * m.expert_time_s(100_000), rel=1e-3)


def test_bad_input():
    with pytest.raises(ValueError):
        RoutingTrace(torch.zeros(2, 3), 1, "x")
    with pytest.raises(ValueError):
        _trace(top_k=17)


def _reference_synthetic_counts_and_top(
    layers, mbs, experts, top_k, tokens, sources, skew, drift, noise, seed
):
    """The generator as first written (out-of-place Gumbel noise, one token source at a time for
    the counts): the reference the in-place generator must equal to the bit."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(layers, mbs, sources, experts, dtype=torch.int64)
    kept = []
    for layer in range(layers):
        kept.append([])
        log_pop = torch.randn(experts, generator=g, dtype=torch.float64) * skew
        for mb in range(mbs):
            if mb:
                log_pop = log_pop + torch.randn(experts, generator=g, dtype=torch.float64) * drift
            logits = (
                log_pop + torch.randn(sources, 1, experts, generator=g, dtype=torch.float64) * noise
            )
            u = torch.rand(sources, tokens, experts, generator=g, dtype=torch.float64).clamp_min(
                1e-300
            )
            gumbel = -torch.log(-torch.log(u))
            top = (logits + gumbel).topk(top_k, dim=-1).indices.reshape(-1, top_k)
            for token in range(top.shape[0]):
                for e in top[token].tolist():
                    counts[layer, mb, token // tokens, e] += 1
            kept[layer].append(top)
    return counts, kept


@pytest.mark.parametrize("case", range(6))
def test_the_generator_equals_its_reference_form_to_the_bit(case):
    rnd = torch.Generator().manual_seed(1000 + case)
    pick = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=rnd))
    experts = pick(4, 40)
    args = dict(
        layers=pick(1, 3),
        mbs=pick(1, 4),
        experts=experts,
        top_k=pick(1, min(8, experts)),
        tokens=pick(1, 50),
        sources=pick(1, 4),
        skew=float(torch.rand(1, generator=rnd)) * 2,
        drift=float(torch.rand(1, generator=rnd)) * 0.2,
        noise=float(torch.rand(1, generator=rnd)),
        seed=pick(0, 10**6),
    )
    counts, top = _reference_synthetic_counts_and_top(**args)
    t = synthetic_trace(
        args["layers"],
        args["mbs"],
        experts,
        args["top_k"],
        args["tokens"],
        args["sources"],
        skew=args["skew"],
        drift=args["drift"],
        noise=args["noise"],
        seed=args["seed"],
        keep_tokens=True,
    )
    assert torch.equal(t.counts, counts)
    for layer in range(args["layers"]):
        for mb in range(args["mbs"]):
            assert torch.equal(t.top_experts[layer][mb], top[layer][mb])
