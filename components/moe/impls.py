"""The MoE implementations the suites compare, as one registry: what each one is and supports.

Ours: ``pft`` (the padding-free layer, moe_layer.py) and ``padded`` (the capacity-padded GShard /
DeepSpeed layer, padded_moe.py). Peers (peers.py, peer_ep.py; the ``peers`` extra): each of
Megatron-core's and DeepSpeed's forms. Each entry declares what callers may rely on -- ranks,
backward, dtypes, its drop policy and capacity arithmetic, the stages it can be cut into -- so
that the suites (moe-dispatch, moe-layer) read the registry and never branch on a name.

Adding an implementation: one ``register(MoEImpl(...))`` below, with its ``form`` naming how its
stages are called (suites/_moe_stages.py has one builder per form).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from moe_repro.components.moe.moe_layer import expert_capacity, float_expert_capacity

ONE_RANK_STAGES = (
    "gating",
    "buffer_dispatch",
    "dispatch_a2a",
    "expert",
    "combine_a2a",
    "buffer_combine",
)
PEER_STAGES = ("gating", "buffer_dispatch", "expert", "buffer_combine")


def _deepspeed_capacity(tokens: int, experts: int, top_k: int, factor: float) -> int:
    """DeepSpeed's ``_capacity``: ceil(S / E * tensor(c * k)), a float32 product."""
    import torch

    return int(torch.ceil((tokens / experts) * torch.tensor(factor * top_k)))


@dataclass(frozen=True)
class MoEImpl:
    name: str  # what users type (--impl)
    label: str  # how reports call it
    form: str  # how its stages are built: "pft", "padded" or "peer"
    distribution: str | None  # the package it needs (None: this project)
    stages: tuple[str, ...]  # the stage cuts it offers on one rank
    ep_layer: bool  # has a whole expert-parallel layer (ranks > 1, backward)
    backward: bool  # its whole-layer pass has a backward
    dtypes: tuple[str, ...]
    drop_policy: (
        str | None
    )  # which pairs it keeps above capacity (pft.DROP_POLICIES); None: no drop
    renormalize_after_drop: bool  # weights rescaled over the kept pairs (DeepSpeed)
    # (tokens, experts, top_k, factor) -> capacity, in the implementation's own arithmetic
    capacity: Callable[[int, int, int, float], int | None]
    routes_on_fp32_logits: bool  # its router runs in fp32 whatever the input dtype
    # our MoELayer's options that give this implementation's semantics (references, weights)
    layer_options: dict = field(default_factory=dict)
    # the expert GEMM it runs: None, our grouped-GEMM kernel (``gemm``, auto by default) on its
    # rows; else the fixed kernel it runs (a capacity-padded buffer: one bmm per projection)
    expert_kernel: str | None = None
    # whether our dispatch/combine pipelining (overlap.py, ``overlap``) applies to it
    pipelines: bool = False

    def supports(
        self,
        *,
        ranks: int = 1,
        backward: bool = False,
        dtype: str = "float32",
        stage: str | None = None,
    ) -> str | None:
        """None when it supports this, else a one-line reason."""
        if dtype not in self.dtypes:
            return f"impl {self.name} runs in {', '.join(self.dtypes)}, not {dtype}"
        if ranks > 1 and not self.ep_layer:
            return f"impl {self.name} runs on one rank only (ranks=1)"
        if backward and not self.backward:
            return f"impl {self.name} has no backward pass here"
        if self.whole_layer_only(ranks=ranks, backward=backward):
            if stage is not None and stage != "layer":
                return (
                    f"impl {self.name} with ranks={ranks}, backward={int(backward)} runs as a "
                    f"whole layer: stage=layer, got {stage!r}"
                )
        elif stage is not None and stage not in (*self.stages, "layer", "total"):
            return (
                f"impl {self.name} has stages {', '.join(self.stages)}, layer, total; got {stage!r}"
            )
        return None

    def whole_layer_only(self, *, ranks: int, backward: bool) -> bool:
        """Runs as one whole-layer pass (its own expert-parallel path): with backward, or for a
        peer on several ranks (its all-to-alls need its own layer around them)."""
        return backward or (self.form == "peer" and ranks > 1)


MOE_IMPLS: dict[str, MoEImpl] = {}


def register(impl: MoEImpl) -> MoEImpl:
    if impl.name in MOE_IMPLS:
        raise ValueError(f"MoE implementation {impl.name!r} is already registered")
    MOE_IMPLS[impl.name] = impl
    return impl


def get_impl(name: str) -> MoEImpl:
    if name not in MOE_IMPLS:
        raise ValueError(f"impl must be one of {', '.join(MOE_IMPLS)}, got {name!r}")
    return MOE_IMPLS[name]


def impl_names(**facts) -> tuple[str, ...]:
    """Names whose facts equal every keyword given, e.g. ``impl_names(ep_layer=True)``."""
    return tuple(
        n for n, i in MOE_IMPLS.items() if all(getattr(i, k) == v for k, v in facts.items())
    )


def _ours_capacity(tokens, experts, top_k, factor):
    return expert_capacity(tokens, experts, top_k, factor)


def _megatron_capacity(tokens, experts, top_k, factor):  # get_capacity(S * k, E, c) in float64
    return float_expert_capacity(tokens, experts, top_k, factor)


register(
    MoEImpl(
        "pft",
        "padding-free (ours)",
        "pft",
        None,
        ONE_RANK_STAGES,
        ep_layer=True,
        backward=True,
        dtypes=("float32", "bfloat16"),
        drop_policy="probs",
        renormalize_after_drop=False,
        capacity=_ours_capacity,
        routes_on_fp32_logits=False,
        pipelines=True,
    )
)
register(
    MoEImpl(
        "padded",
        "capacity-padded (ours)",
        "padded",
        None,
        ONE_RANK_STAGES,
        ep_layer=True,
        backward=False,
        dtypes=("float32", "bfloat16"),
        drop_policy="slot",
        renormalize_after_drop=False,
        capacity=_ours_capacity,
        routes_on_fp32_logits=False,
        expert_kernel="bmm",
    )
)
register(
    MoEImpl(
        "megatron",
        "Megatron-core (token dropping)",
        "peer",
        "megatron-core",
        PEER_STAGES,
        ep_layer=True,
        backward=True,
        dtypes=("float32", "bfloat16"),
        drop_policy="probs",
        renormalize_after_drop=False,
        capacity=_megatron_capacity,
        routes_on_fp32_logits=True,
    )
)
register(
    MoEImpl(
        "megatron-nodrop",
        "Megatron-core (dropless)",
        "peer",
        "megatron-core",
        PEER_STAGES,
        ep_layer=True,
        backward=True,
        dtypes=("float32", "bfloat16"),
        drop_policy=None,
        renormalize_after_drop=False,
        capacity=lambda *_: None,
        routes_on_fp32_logits=True,
        layer_options={"capacity_factor": None},
    )
)
register(
    MoEImpl(
        "deepspeed",
        "DeepSpeed MOELayer (sparse)",
        "peer",
        "deepspeed",
        PEER_STAGES,
        ep_layer=True,
        backward=True,
        dtypes=("float32", "bfloat16"),
        drop_policy="probs",
        renormalize_after_drop=True,
        capacity=_deepspeed_capacity,
        routes_on_fp32_logits=True,
        layer_options={"drop_policy": "probs", "renormalize_after_drop": True},
        expert_kernel="bmm",  # its [E_local, W*C, H] capacity buffer (peer_ep.py)
    )
)
register(
    MoEImpl(
        "deepspeed-einsum",
        "DeepSpeed GShard einsums",
        "peer",
        "deepspeed",
        PEER_STAGES,
        ep_layer=False,
        backward=False,
        dtypes=("float32", "bfloat16"),
        drop_policy="probs",
        renormalize_after_drop=True,
        capacity=_deepspeed_capacity,
        routes_on_fp32_logits=True,
        expert_kernel="bmm",
    )
)
