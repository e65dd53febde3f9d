"""Routing workloads as one protocol: (seed, step, EP layout) -> a routing, the same at any layout.

A :class:`Workload` maps ``(seed, step, layer)`` to a :class:`Routing`: the expert ids
([T, k] int64, k distinct experts per token) and gates ([T, k] float32, rows summing to 1) of
the T tokens of one step, plus, where the workload says so, each token's source position in
[0, 1). Nothing in a routing depends on the EP layout: the layout only decides which rank a
token starts on (:meth:`Routing.source_ranks`) and which rank holds an expert, so the same
logical workload is replayed at EP 2 and EP 16, and by every balancer alike. Every draw comes
from a generator seeded by sha256 of ``name|seed|step|layer``.

Families (``Workload.family``):
  standard    W0-W7, the eight token-imbalance workloads of Megatron-core's open benchmark
              (NVIDIA/Megatron-LM pull request #7488), written from its definitions; W4's uneven
              sources are our realisation (the published generator leaves them even);
  synthetic   this project's generator (routing_trace.synthetic_trace), sources fixed to 16
              groups of consecutive tokens;
  real-count  OLMoE-1B-7B and Mixtral-8x7B: the expert popularity (per-expert counts over one
              text domain, data/olmoe_routing/SOURCE.md) and, for ``olmoe-layers``, the
              cross-layer joint counts are REAL; the tokens of each step and the gates are
              sampled.

Why: balancers are compared on the same routing at every EP size, and each workload says which
of its parts are real and which are sampled. Each workload's definition and what in it is
real: see docs/balance-workloads.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch

DATA_DIR = Path(__file__).parent / "data" / "olmoe_routing"
MEGATRON_SOURCE = (
    "Megatron-core open token-imbalance benchmark, NVIDIA/Megatron-LM pull request "
    "#7488 (benchmarks/moe/token_imbalance), roadmap issue #6757"
)

STANDARD = (
    "balanced",
    "hot-set",
    "hot-rank",
    "spread",
    "ragged-source",
    "zero-expert-rank",
    "rotating-hotspot",
    "burst",
)
STANDARD_IDS = {name: f"W{i}" for i, name in enumerate(STANDARD)}
REAL_MODELS = {"olmoe": "olmoe", "mixtral": "mistral"}  # our prefix -> the data's model key
DOMAINS = ("arxiv", "book", "c4", "github", "wikipedia")
LAYERS = (0, 7, 15)
SWITCH = ("c4", "github", 4)  # olmoe-switch: domain before, domain after, switch step


@dataclass(frozen=True)
class Routing:
    """One step of one layer: k distinct experts and their gates per token."""

    expert_ids: torch.Tensor  # int64 [T, k]
    gates: torch.Tensor  # float32 [T, k], rows sum to 1
    source_position: torch.Tensor | None = None  # float64 [T] in [0, 1); None: t / T

    @property
    def tokens(self) -> int:
        return int(self.expert_ids.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.expert_ids.shape[1])

    def source_ranks(self, world: int) -> torch.Tensor:
        """The EP rank each token starts on under a layout of ``world`` ranks: int64 [T]."""
        if world < 1:
            raise ValueError(f"world must be >= 1, got {world}")
        if self.source_position is None:
            return torch.arange(self.tokens, dtype=torch.int64) * world // max(self.tokens, 1)
        return (self.source_position * world).floor().to(torch.int64).clamp_(0, world - 1)

    def expert_counts(self, num_experts: int) -> torch.Tensor:
        """Token-expert rows per expert: int64 [E]."""
        return torch.bincount(self.expert_ids.reshape(-1), minlength=num_experts)

    def source_counts(self, num_experts: int, world: int) -> torch.Tensor:
        """Rows per (source rank, expert): int64 [W, E] (what the balancers take)."""
        src = self.source_ranks(world).repeat_interleave(self.top_k)
        flat = src * num_experts + self.expert_ids.reshape(-1)
        return torch.bincount(flat, minlength=world * num_experts).reshape(world, num_experts)


@dataclass(frozen=True)
class Workload:
    """A named routing generator; ``routing(seed, step, world)`` is the protocol."""

    name: str
    family: str  # standard | synthetic | real-count
    num_experts: int
    top_k: int
    tokens: int  # tokens per step (global: the layout splits them)
    description: str  # what it is, and what in it is real and what sampled
    draw: Callable[[torch.Generator, int, int, int], Routing] = field(repr=False)
    num_layers: int = 1
    params: dict = field(default_factory=dict)

    def routing(self, seed: int, step: int, world: int | None = None, layer: int = 0) -> Routing:
        """The routing of ``step`` (and ``layer``). ``world`` (the EP size) is only checked,
        never used: the routing is the same at every layout."""
        if step < 0 or seed < 0:
            raise ValueError(f"seed and step must be >= 0, got seed={seed}, step={step}")
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"{self.name} has {self.num_layers} layer(s), asked for layer {layer}")
        if world is not None and (world < 1 or self.num_experts % world):
            raise ValueError(
                f"{self.name}: {self.num_experts} experts do not divide over EP={world}"
            )
        return self.draw(step_generator(self.name, seed, step, layer), seed, step, layer)

    def generator_params(self) -> dict:
        return {
            "workload": self.name,
            "family": self.family,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "tokens": self.tokens,
            "num_layers": self.num_layers,
            **self.params,
        }


def step_generator(name: str, seed: int, step: int, layer: int = 0) -> torch.Generator:
    """A generator that depends on (workload, seed, step, layer) and nothing else."""
    digest = hashlib.sha256(f"{name}|{seed}|{step}|{layer}".encode()).hexdigest()
    return torch.Generator().manual_seed(int(digest[:15], 16))


def standard_gates(g: torch.Generator, tokens: int, top_k: int) -> torch.Tensor:
    """Gates uniform in [0.5, 1), normalised per token (the published rule)."""
    gates = torch.rand(tokens, top_k, generator=g, dtype=torch.float32) * 0.5 + 0.5
    return gates / gates.sum(dim=1, keepdim=True)


def distinct_from_pools(
    g: torch.Generator, pools: list[list[int]], pool_of_token: torch.Tensor, top_k: int
) -> torch.Tensor:
    """Per token, k distinct experts uniform from its pool (a random permutation's first k)."""
    ids = torch.empty(len(pool_of_token), top_k, dtype=torch.int64)
    for p, pool in enumerate(pools):
        rows = (pool_of_token == p).nonzero().flatten()
        if not len(rows):
            continue
        if top_k > len(pool):
            raise ValueError(f"top_k={top_k} exceeds a pool of {len(pool)} experts")
        keys = torch.rand(len(rows), len(pool), generator=g)
        pick = keys.argsort(dim=1)[:, :top_k]
        ids[rows] = torch.as_tensor(pool, dtype=torch.int64)[pick]
    return ids.sort(dim=1).values


def gumbel_top_k(g: torch.Generator, log_weights: torch.Tensor, top_k: int) -> torch.Tensor:
    """k distinct experts per row, without replacement in proportion to exp(log_weights) [T, E]."""
    u = torch.rand(log_weights.shape, generator=g, dtype=torch.float64).clamp_min_(1e-300)
    # in place, the same numbers without three [T, E] temporaries: a quarter less time, most of
    # a real-count feplb reproduction's (tokens x EP rows per micro-batch)
    return torch.sub(log_weights, u.log_().neg_().log_(), out=u).topk(top_k, dim=-1).indices


# --- the eight standard workloads --------------------------------------------------------------


def hot_width(num_experts: int, top_k: int) -> int:
    return max(top_k, num_experts // 4)


def _standard_draw(name: str, num_experts: int, top_k: int, tokens: int):
    everyone = list(range(num_experts))
    hot = hot_width(num_experts, top_k)
    t = torch.arange(tokens)

    def draw(g: torch.Generator, seed: int, step: int, layer: int) -> Routing:
        position = None
        if name == "balanced":
            ids = ((t * top_k).unsqueeze(1) + torch.arange(top_k)) % num_experts
            ids = ids.sort(dim=1).values
        elif name in ("hot-set", "hot-rank", "rotating-hotspot"):
            start = ((step // 3) * hot) % num_experts if name == "rotating-hotspot" else 0
            block = [(start + i) % num_experts for i in range(hot)]
            ids = distinct_from_pools(g, [everyone, block], (t % 4 != 0).long(), top_k)
        elif name == "spread":
            pool = sorted({(2 * i) % num_experts for i in range(max(top_k, num_experts // 2))})
            pools = [everyone, pool if len(pool) >= top_k else everyone]
            ids = distinct_from_pools(g, pools, (t % 4 != 0).long(), top_k)
        elif name == "ragged-source":
            ids = distinct_from_pools(g, [everyone], torch.zeros(tokens, dtype=torch.long), top_k)
            u = torch.rand(tokens, generator=g, dtype=torch.float64)
            position = 1.0 - torch.sqrt(1.0 - u)  # density 2 (1 - x): our realisation
        elif name == "zero-expert-rank":
            live = list(range(num_experts // 2, num_experts)) or everyone
            ids = distinct_from_pools(g, [live], torch.zeros(tokens, dtype=torch.long), top_k)
        elif name == "burst":
            burst = step % 4 == 3
            use_hot = ((t % 2 == 0) & burst).long()
            ids = distinct_from_pools(g, [everyone, list(range(hot))], use_hot, top_k)
        else:
            raise ValueError(f"unknown standard workload {name!r}")
        return Routing(ids, standard_gates(g, tokens, top_k), position)

    return draw


def standard_workload(
    name: str, num_experts: int = 8, top_k: int = 2, tokens: int = 128
) -> Workload:
    """One of the eight standard workloads (docs/balance-workloads.md); defaults are the published ones."""
    if name not in STANDARD:
        raise ValueError(f"unknown standard workload {name!r}; known: {', '.join(STANDARD)}")
    _check_sizes(num_experts, top_k, tokens)
    return Workload(
        name,
        "standard",
        num_experts,
        top_k,
        tokens,
        f"{STANDARD_IDS[name]} {name}: from the definitions of the {MEGATRON_SOURCE}"
        + ("; uneven sources are our realisation" if name == "ragged-source" else ""),
        _standard_draw(name, num_experts, top_k, tokens),
    )


# --- our synthetic generator, as a workload ----------------------------------------------------

SYNTHETIC_SOURCES = 16  # fixed token groups (noise per group), merged by any layout up to EP 16


def synthetic_workload(
    num_experts: int = 64,
    top_k: int = 8,
    tokens: int = 4096,
    *,
    skew: float = 1.0,
    drift: float = 0.05,
    noise: float = 0.3,
) -> Workload:
    from moe_repro.components.balance.routing_trace import synthetic_trace

    _check_sizes(num_experts, top_k, tokens)
    if tokens % SYNTHETIC_SOURCES:
        raise ValueError(
            f"synthetic: tokens must be a multiple of {SYNTHETIC_SOURCES}, got {tokens}"
        )

    def draw(g: torch.Generator, seed: int, step: int, layer: int) -> Routing:
        # the drifting popularity is a walk over steps: replay it up to this step
        trace = synthetic_trace(
            1,
            step + 1,
            num_experts,
            top_k,
            tokens // SYNTHETIC_SOURCES,
            SYNTHETIC_SOURCES,
            skew=skew,
            drift=drift,
            noise=noise,
            seed=seed,
            keep_tokens=True,
        )
        if trace.top_experts is None:  # keep_tokens=True keeps them
            raise RuntimeError("the synthetic trace kept no tokens")
        ids = trace.top_experts[0][step].sort(dim=1).values
        return Routing(ids, standard_gates(g, tokens, top_k))

    return Workload(
        "synthetic",
        "synthetic",
        num_experts,
        top_k,
        tokens,
        "this project's synthetic generator (routing_trace.synthetic_trace), "
        f"{SYNTHETIC_SOURCES} fixed source groups; all of it chosen by us",
        draw,
        params={"skew": skew, "drift": drift, "noise": noise},
    )


# --- real routing counts -----------------------------------------------------------------------


@lru_cache(maxsize=1)
def real_counts() -> dict:
    with open(DATA_DIR / "expert_counts.json") as f:
        return json.load(f)["models"]


@lru_cache(maxsize=1)
def real_crosslayer_counts() -> dict:
    with open(DATA_DIR / "crosslayer_counts.json") as f:
        return json.load(f)["models"]


def real_popularity(model: str, domain: str, layer: int) -> torch.Tensor:
    """The real top-k assignment counts per expert, float64 [E] (model: olmoe or mixtral)."""
    key = REAL_MODELS.get(model)
    if key is None:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(REAL_MODELS)}")
    by_domain = real_counts()[key]["topk_counts"]
    if domain not in by_domain or str(layer) not in by_domain[domain]:
        raise ValueError(
            f"{model}: no counts for domain {domain!r} layer {layer}; domains "
            f"{', '.join(by_domain)}, layers {', '.join(map(str, LAYERS))}"
        )
    return torch.tensor(by_domain[domain][str(layer)], dtype=torch.float64)


def _real_shape(model: str) -> tuple[int, int]:
    m = real_counts()[REAL_MODELS[model]]
    return int(m["num_experts"]), int(m["top_k"])


def _log_weights(counts: torch.Tensor) -> torch.Tensor:
    # an expert with zero real count stays unreachable (log 0 = -inf)
    return torch.log(counts / counts.sum())


def real_count_workload(
    name: str, num_experts: int | None = None, top_k: int | None = None, tokens: int = 4096
) -> Workload:
    """``olmoe-<domain>-L<layer>``, ``mixtral-<domain>-L<layer>``, ``olmoe-switch``,
    ``olmoe-layers`` (docs/balance-workloads.md says what is real and what is sampled)."""
    model = name.split("-", 1)[0]
    if model not in REAL_MODELS:
        raise ValueError(f"unknown real-count workload {name!r}")
    experts, k = _real_shape(model)
    if (num_experts not in (None, experts)) or (top_k not in (None, k)):
        raise ValueError(
            f"{name} is {model}'s routing: {experts} experts, top-{k} "
            f"(got {num_experts} experts, top-{top_k})"
        )
    _check_sizes(experts, k, tokens)
    real = f"REAL: {model} per-expert counts ({DATA_DIR.name}/SOURCE.md); SAMPLED: tokens, gates"
    if name == "olmoe-switch":
        before, after, at = SWITCH
        logw = {d: _log_weights(real_popularity(model, d, 7)) for d in (before, after)}

        def draw(g, seed, step, layer):
            ids = gumbel_top_k(g, logw[before if step < at else after].expand(tokens, -1), k)
            return Routing(ids.sort(dim=1).values, standard_gates(g, tokens, k))

        return Workload(
            name,
            "real-count",
            experts,
            k,
            tokens,
            f"{real}; layer 7, domain {before} before step {at}, {after} from then on",
            draw,
            params={"before": before, "after": after, "switch_step": at, "layer": 7},
        )
    if name == "olmoe-layers":
        domain = "c4"
        first = _log_weights(real_popularity(model, domain, 0))
        joint = real_crosslayer_counts()["olmoe"]["expert_counts_crosslayer"][domain]
        conditional = []
        for pair in ("0->7", "7->15"):
            j = torch.tensor(joint[pair], dtype=torch.float64)
            conditional.append(j / j.sum(1, keepdim=True).clamp_min(1.0))  # P(b | a)

        def draw(g, seed, step, layer):
            # one token stream through the layers: draw layer 0, then each next layer given the
            # previous one's experts; the generator of layer 0 drives the whole chain so layer L
            # of a step is the same whichever layer is asked for first
            chain = step_generator(name, seed, step, 0)
            ids = gumbel_top_k(chain, first.expand(tokens, -1), k)
            for cond in conditional[:layer]:
                mix = cond[ids].sum(1) / k  # [T, E]: mean of P(b | a_j)
                ids = gumbel_top_k(chain, torch.log(mix), k)
            return Routing(ids.sort(dim=1).values, standard_gates(g, tokens, k))

        return Workload(
            name,
            "real-count",
            experts,
            k,
            tokens,
            f"{real}; domain {domain}, layers 0, 7, 15, each next layer drawn from "
            "the REAL joint counts 0->7, 7->15 given the previous layer's experts",
            draw,
            num_layers=3,
            params={"domain": domain, "layers": [0, 7, 15]},
        )
    try:
        _, domain, layer_text = name.split("-")
        layer = int(layer_text.removeprefix("L"))
    except ValueError:
        raise ValueError(
            f"real-count workload names are <model>-<domain>-L<layer>, got {name!r}"
        ) from None
    layer_logw = _log_weights(real_popularity(model, domain, layer))

    def draw_layer(g, seed, step, layer_index):
        ids = gumbel_top_k(g, layer_logw.expand(tokens, -1), k)
        return Routing(ids.sort(dim=1).values, standard_gates(g, tokens, k))

    return Workload(
        name,
        "real-count",
        experts,
        k,
        tokens,
        f"{real}; domain {domain}, layer {layer}",
        draw_layer,
        params={"model": model, "domain": domain, "layer": layer},
    )


def real_count_names() -> tuple[str, ...]:
    names = [f"{m}-{d}-L{layer}" for m in REAL_MODELS for d in DOMAINS for layer in LAYERS]
    return (*names, "olmoe-switch", "olmoe-layers")


def workload_names() -> tuple[str, ...]:
    return (*STANDARD, "synthetic", *real_count_names())


def get_workload(
    name: str, num_experts: int | None = None, top_k: int | None = None, tokens: int | None = None
) -> Workload:
    """Any workload by name. Standard ones take E, k, T (defaults: the published 8, 2, 128);
    synthetic takes them too (64, 8, 4096); real-count ones fix E and k to their model's."""
    if name in STANDARD:
        return standard_workload(name, num_experts or 8, top_k or 2, tokens or 128)
    if name == "synthetic":
        return synthetic_workload(num_experts or 64, top_k or 8, tokens or 4096)
    if name.split("-", 1)[0] in REAL_MODELS:
        return real_count_workload(name, num_experts, top_k, tokens or 4096)
    raise ValueError(
        f"unknown workload {name!r}; known: {', '.join(STANDARD)}, synthetic, "
        f"<olmoe|mixtral>-<{'|'.join(DOMAINS)}>-L<0|7|15>, olmoe-switch, olmoe-layers"
    )


def max_over_mean(counts) -> float:
    """Busiest over mean; nan where nothing was routed (never a made-up epsilon)."""
    c = torch.as_tensor(counts, dtype=torch.float64)
    mean = float(c.mean()) if c.numel() else 0.0
    return float(c.max()) / mean if mean > 0 else math.nan


def _check_sizes(num_experts: int, top_k: int, tokens: int) -> None:
    if min(num_experts, top_k, tokens) < 1:
        raise ValueError(
            f"experts, top_k and tokens must be >= 1, got {num_experts}, {top_k}, {tokens}"
        )
    if top_k > num_experts:
        raise ValueError(f"top_k={top_k} > {num_experts} experts")
