"""Routing traces as data, a seeded synthetic generator, and the straggler metrics of FEPLB.

A :class:`RoutingTrace` holds per-expert token counts ``counts[layer, micro_batch, source,
expert]`` (int64; ``source`` is the EP rank whose tokens were routed, which the balancers need:
FasterMoE's shadow experts compute a token on its source rank, LLEP/FEPLB ship rows from it),
optionally the per-token top-k choices (``top_experts``) for measures that need token identity,
and ``source``, where the routing came from ("synthetic: ..." or "real: ...").

Generators: ``synthetic_trace`` (log-normal expert popularity with skew, a Gaussian random-walk
drift over micro-batches, per-source noise, Gumbel top-k without replacement; a pure function of
the seed) and ``group_limited_trace`` (DeepSeek-V3's node-limited routing, tech report Sec.
2.1.2: the top-M groups by their top K_r / M affinities, then the top-k experts inside them;
V3's balancing bias left out, so the skew stands for the imbalance that remains).

Metrics (FEPLB Sec. 3.1): token straggler = max_d T_d - mean(T) and GEMM straggler = max_d G_d -
mean(G), averaged over layers and micro-batches.

Why: the balancers are scored on routings whose every parameter is stated and seeded. The trace
format, the generators' models and the metrics in full: see docs/balance-workloads.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RoutingTrace:
    counts: torch.Tensor  # int64 [L, M, W, E]
    top_k: int
    source: str
    top_experts: list[list[torch.Tensor]] | None = None  # [L][M] -> [S, k]
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.counts.dim() != 4:
            raise ValueError(
                f"counts must be [layers, micro_batches, sources, experts], "
                f"got shape {tuple(self.counts.shape)}"
            )
        if bool((self.counts < 0).any()):
            raise ValueError("counts must be non-negative")
        self.counts = self.counts.to(torch.int64)

    @property
    def num_layers(self) -> int:
        return self.counts.shape[0]

    @property
    def num_micro_batches(self) -> int:
        return self.counts.shape[1]

    @property
    def num_sources(self) -> int:
        return self.counts.shape[2]

    @property
    def num_experts(self) -> int:
        return self.counts.shape[3]

    def expert_counts(self, layer: int, micro_batch: int) -> torch.Tensor:
        """Tokens per expert summed over sources: int64 [E]."""
        return self.counts[layer, micro_batch].sum(0)

    def regroup_sources(self, world: int) -> "RoutingTrace":
        """The same routing seen by ``world`` source ranks (consecutive sources merged)."""
        if self.num_sources % world:
            raise ValueError(f"{self.num_sources} sources do not merge into {world} ranks")
        per = self.num_sources // world
        c = self.counts.reshape(
            self.num_layers, self.num_micro_batches, world, per, self.num_experts
        ).sum(3)
        return RoutingTrace(c, self.top_k, self.source, self.top_experts, dict(self.meta))


def counts_from_top_experts(
    top_experts: torch.Tensor, num_experts: int, num_sources: int = 1
) -> torch.Tensor:
    """[S, k] choices -> [W, E] counts; token s belongs to source s // (S / W)."""
    tokens = top_experts.shape[0]
    if tokens % num_sources:
        raise ValueError(f"{tokens} tokens do not split over {num_sources} sources")
    per = tokens // num_sources
    source = torch.arange(tokens).repeat_interleave(top_experts.shape[1]) // per
    flat = source * num_experts + top_experts.reshape(-1).cpu()
    return torch.bincount(flat, minlength=num_sources * num_experts).reshape(
        num_sources, num_experts
    )


def _drifting_logits(
    num_layers: int,
    num_micro_batches: int,
    num_experts: int,
    tokens_per_source: int,
    num_sources: int,
    skew: float,
    drift: float,
    noise: float,
    seed: int,
):
    """Yield (layer, micro-batch, logits [W, 1, E], Gumbel noise [W, S/W, E]) of the synthetic
    router: a log-popularity per layer (``skew``) that drifts between micro-batches (``drift``),
    a per-source perturbation (``noise``), and Gumbel noise per token. Both traces draw through
    here, in this order, so a seed gives the same popularity to either router."""
    g = torch.Generator().manual_seed(seed)
    for layer in range(num_layers):
        log_pop = torch.randn(num_experts, generator=g, dtype=torch.float64) * skew
        for mb in range(num_micro_batches):
            if mb:
                log_pop = (
                    log_pop + torch.randn(num_experts, generator=g, dtype=torch.float64) * drift
                )
            logits = (
                log_pop
                + torch.randn(num_sources, 1, num_experts, generator=g, dtype=torch.float64) * noise
            )
            u = torch.rand(
                num_sources, tokens_per_source, num_experts, generator=g, dtype=torch.float64
            ).clamp_min_(1e-300)
            # -log(-log(u)) in place: the same operations in the same order (so the same values
            # to the bit) without three temporaries of the tensor's size; most of a trace's time
            yield layer, mb, logits, u.log_().neg_().log_().neg_()


def synthetic_trace(
    num_layers: int,
    num_micro_batches: int,
    num_experts: int,
    top_k: int,
    tokens_per_source: int,
    num_sources: int,
    *,
    skew: float = 1.0,
    drift: float = 0.05,
    noise: float = 0.3,
    seed: int = 0,
    keep_tokens: bool = False,
) -> RoutingTrace:
    """Seeded synthetic routing; see docs/balance-workloads.md for the model."""
    if min(num_layers, num_micro_batches, num_experts, top_k, tokens_per_source, num_sources) <= 0:
        raise ValueError("all sizes must be positive")
    if top_k > num_experts:
        raise ValueError(f"top_k={top_k} > num_experts={num_experts}")
    if min(skew, drift, noise) < 0:
        raise ValueError("skew, drift and noise must be >= 0")
    counts = torch.zeros(num_layers, num_micro_batches, num_sources, num_experts, dtype=torch.int64)
    kept: list[list[torch.Tensor]] | None = [] if keep_tokens else None
    for layer, mb, logits, gumbel in _drifting_logits(
        num_layers,
        num_micro_batches,
        num_experts,
        tokens_per_source,
        num_sources,
        skew,
        drift,
        noise,
        seed,
    ):
        # gumbel + logits in place (addition commutes exactly): the gumbel tensor is not reused
        choice = gumbel.add_(logits).topk(top_k, dim=-1).indices  # [W, S/W, k]
        top = choice.reshape(-1, top_k)
        counts[layer, mb] = counts_from_top_experts(top, num_experts, num_sources)
        if kept is not None:
            if mb == 0:
                kept.append([])
            kept[layer].append(top)
    src = (
        f"synthetic: seed={seed}, skew={skew}, drift={drift}, noise={noise}, "
        f"{tokens_per_source} tokens x top-{top_k} per source, {num_sources} sources"
    )
    return RoutingTrace(
        counts,
        top_k,
        src,
        kept,
        {
            "skew": skew,
            "drift": drift,
            "noise": noise,
            "seed": seed,
            "tokens_per_source": tokens_per_source,
        },
    )


def group_limited_trace(
    num_layers: int,
    num_micro_batches: int,
    num_experts: int,
    top_k: int,
    tokens_per_source: int,
    num_sources: int,
    *,
    num_groups: int = 8,
    top_groups: int = 4,
    skew: float = 1.0,
    drift: float = 0.05,
    noise: float = 0.3,
    seed: int = 0,
) -> RoutingTrace:
    """Seeded group-limited routing (DeepSeek-V3 Sec. 2.1.2; docs/balance-workloads.md). Tokens' choices
    are always kept (``top_experts``): group-limited routing matters through token identity."""
    if (
        min(
            num_layers,
            num_micro_batches,
            num_experts,
            top_k,
            tokens_per_source,
            num_sources,
            num_groups,
            top_groups,
        )
        <= 0
    ):
        raise ValueError("all sizes must be positive")
    if num_experts % num_groups:
        raise ValueError(f"{num_groups} groups do not divide the {num_experts} experts")
    if top_groups > num_groups:
        raise ValueError(f"top_groups={top_groups} > num_groups={num_groups}")
    group_size = num_experts // num_groups
    if top_k > top_groups * group_size:
        raise ValueError(
            f"top_k={top_k} > the {top_groups * group_size} experts of {top_groups} groups"
        )
    if min(skew, drift, noise) < 0:
        raise ValueError("skew, drift and noise must be >= 0")
    per_group_score = max(1, top_k // top_groups)  # V3: the top K_r / M = 8 / 4 = 2 affinities
    counts = torch.zeros(num_layers, num_micro_batches, num_sources, num_experts, dtype=torch.int64)
    kept: list[list[torch.Tensor]] = []
    for layer, mb, logits, gumbel in _drifting_logits(
        num_layers,
        num_micro_batches,
        num_experts,
        tokens_per_source,
        num_sources,
        skew,
        drift,
        noise,
        seed,
    ):
        affinity = torch.sigmoid(logits + gumbel)  # [W, S/W, E]
        by_group = affinity.reshape(num_sources, tokens_per_source, num_groups, group_size)
        group_score = by_group.topk(per_group_score, dim=-1).values.sum(-1)  # [W, S/W, groups]
        kept_groups = group_score.topk(top_groups, dim=-1).indices
        allowed = torch.zeros_like(group_score, dtype=torch.bool).scatter_(-1, kept_groups, True)
        masked = affinity.masked_fill(~allowed.repeat_interleave(group_size, dim=-1), -1.0)
        top = masked.topk(top_k, dim=-1).indices.reshape(-1, top_k)
        counts[layer, mb] = counts_from_top_experts(top, num_experts, num_sources)
        if mb == 0:
            kept.append([])
        kept[layer].append(top)
    src = (
        f"synthetic group-limited: seed={seed}, skew={skew}, drift={drift}, noise={noise}, "
        f"{tokens_per_source} tokens x top-{top_k} in top-{top_groups} of {num_groups} groups "
        f"per source, {num_sources} sources"
    )
    return RoutingTrace(
        counts,
        top_k,
        src,
        kept,
        {
            "skew": skew,
            "drift": drift,
            "noise": noise,
            "seed": seed,
            "tokens_per_source": tokens_per_source,
            "num_groups": num_groups,
            "top_groups": top_groups,
        },
    )


# --- loads and metrics --------------------------------------------------------------------------


def device_loads(
    expert_counts: torch.Tensor, rank_of_expert: torch.Tensor | list[int], world: int
) -> torch.Tensor:
    """Rows each device computes when expert e runs on rank_of_expert[e]: int64 [W]."""
    ranks = torch.as_tensor(rank_of_expert, dtype=torch.int64)
    if ranks.numel() != expert_counts.numel():
        raise ValueError(f"{ranks.numel()} ranks for {expert_counts.numel()} experts")
    return torch.zeros(world, dtype=torch.int64).index_add_(0, ranks, expert_counts.to(torch.int64))


def contiguous_ranks(num_experts: int, world: int) -> torch.Tensor:
    """Expert e on rank e // (E / W) (Megatron/DeepSpeed default placement)."""
    if num_experts % world:
        raise ValueError(f"{num_experts} experts do not divide over {world} ranks")
    return torch.arange(num_experts) // (num_experts // world)


def token_straggler(loads) -> float:
    """FEPLB Sec. 3.1: max_d T_d - mean T (excess tokens on the most loaded device)."""
    t = torch.as_tensor(loads, dtype=torch.float64)
    if t.numel() == 0:
        raise ValueError("need at least one device")
    return float(t.max() - t.mean())


def gemm_straggler(times) -> float:
    """FEPLB Sec. 3.1: max_d G_d - mean G, G_d the device's grouped-GEMM time."""
    return token_straggler(times)


def max_min_gap(loads) -> float:
    """Piper Alg. 2's objective: s_{k+} - s_{k-}."""
    t = torch.as_tensor(loads, dtype=torch.float64)
    return float(t.max() - t.min())


@dataclass(frozen=True)
class GemmTimeModel:
    """Roofline time of one expert's SwiGLU FFN on ``rows`` tokens (3 GEMMs, forward).

    t(rows) = launch_s + max(2 * rows * H * F * n_mat / flops_per_s,
                             (n_mat * H * F + rows * (2H + 2F)) * itemsize / bytes_per_s)
    Small groups are memory-bound (the weights are read whatever the row count), which is why
    FEPLB moves whole experts rather than splitting them (FEPLB Sec. 2). A *model*, labelled so.
    """

    d_model: int
    d_ffn: int
    flops_per_s: float
    bytes_per_s: float
    n_mat: int = 3
    itemsize: int = 2
    launch_s: float = 0.0

    def expert_time_s(self, rows: int) -> float:
        if rows <= 0:
            return 0.0
        flops = 2.0 * rows * self.d_model * self.d_ffn * self.n_mat
        nbytes = (
            self.n_mat * self.d_model * self.d_ffn + rows * (2 * self.d_model + 2 * self.d_ffn)
        ) * self.itemsize
        return self.launch_s + max(flops / self.flops_per_s, nbytes / self.bytes_per_s)

    def device_times_s(self, groups_per_device: list[list[int]]) -> list[float]:
        """Grouped-GEMM time per device from the row counts of the expert groups it runs."""
        return [sum(self.expert_time_s(int(r)) for r in groups) for groups in groups_per_device]
