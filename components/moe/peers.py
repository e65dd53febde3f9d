"""The MoE stacks users train with, Megatron-core and DeepSpeed, behind one dispatch interface.

Each implementation is three calls on the same inputs as ours, so a suite can time them stage by
stage beside the padding-free dispatch (X-MoE Sec. 5.4.1: gating, buffer dispatch, buffer
combine):

    routing = route(x)              router logits (fp32), scores, top-k, capacity dropping
    buffer  = dispatch(x, routing)  the rows each expert reads
    out     = combine(y, routing)   weighted sum of the experts' rows back per token

Implementations (pip install -e ".[peers]"; versions are pinned in pyproject.toml):

  megatron          megatron.core ``topk_routing_with_score_function`` (softmax before top-k,
                    Megatron's --moe-router-pre-softmax, so weights are the gate's as in ours),
                    ``apply_router_token_dropping`` (drop policy "probs", capacity from
                    ``get_capacity``), ``permute`` / ``unpermute``: the semantics of our pft.
  megatron-nodrop   the same without token dropping (Megatron's dropless default).
  deepspeed         deepspeed.moe.sharded_moe ``topkgating(..., sparse_routes=True)`` and the
                    slot gather/scatter its MOELayer runs (``_route_slots``, ``_sparse_encode``,
                    ``_sparse_decode``) into an [E, C, H] buffer: DeepSpeed's MOELayer path.
  deepspeed-einsum  ``topkgating`` with dense [S, E, C] masks and GShard's einsums
                    ("sec,sm->ecm", "sec,ecm->sm"), DeepSpeed's path before the sparse one.

DeepSpeed's TopKGate calls top1gating / top2gating for k = 1, 2 and topkgating above; the
suites call topkgating for every k (same masks as top2gating's up to GShard's slot order, see
tests/test_peer_equivalence.py, which checks all three gates against ours). Every peer is
imported only when an implementation is built, so the project starts and runs without them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Any, Callable

import torch

# implementation name -> (distribution that provides it, what it runs)
PEER_IMPLS = {
    "megatron": ("megatron-core", "Megatron-core permute/unpermute with token dropping (probs)"),
    "megatron-nodrop": ("megatron-core", "Megatron-core permute/unpermute, no token dropping"),
    "deepspeed": ("deepspeed", "DeepSpeed topkgating + sparse slot encode/decode (its MOELayer)"),
    "deepspeed-einsum": ("deepspeed", "DeepSpeed topkgating + dense GShard einsums"),
}
INSTALL_HINT = 'pip install -e ".[peers]"'


class PeerUnavailable(ValueError):
    """A peer implementation was asked for but its package is not installed."""


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def peer_versions() -> dict[str, str]:
    """{distribution: version} of the peers installed here (recorded with every result)."""
    found = {}
    for distribution in sorted({d for d, _ in PEER_IMPLS.values()}):
        version = installed_version(distribution)
        if version:
            found[distribution] = version
    return found


def require_peer(impl: str) -> str:
    """The version of ``impl``'s package; PeerUnavailable (one line, with the hint) if absent."""
    distribution = PEER_IMPLS[impl][0]
    version = installed_version(distribution)
    if version is None:
        raise PeerUnavailable(
            f"impl {impl} needs {distribution}, which is not installed: {INSTALL_HINT}"
        )
    return version


@dataclass
class DispatchStages:
    name: str
    route: Callable[[torch.Tensor], Any]
    dispatch: Callable[[torch.Tensor, Any], torch.Tensor]
    combine: Callable[[torch.Tensor, Any], torch.Tensor]


def quiet_import(module: str) -> Any:
    """Import a peer module without its start-up chatter (Megatron warns about missing TE/Apex,
    DeepSpeed logs the accelerator it picked)."""
    import contextlib
    import io
    import warnings

    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        return importlib.import_module(module)


def peer_dispatch(
    impl: str, router_weight: torch.Tensor, top_k: int, capacity_factor: float
) -> DispatchStages:
    """Build ``impl``'s stages around the router weight W_g [H, E] (shared with our layer)."""
    if impl not in PEER_IMPLS:
        raise ValueError(f"peer impl must be one of {', '.join(PEER_IMPLS)}, got {impl!r}")
    require_peer(impl)
    weight32 = router_weight.detach().float()

    def logits_of(x: torch.Tensor) -> torch.Tensor:
        return x.float() @ weight32  # fp32 router (Megatron --moe-router-dtype fp32)

    if impl.startswith("megatron"):
        mu = quiet_import("megatron.core.transformer.moe.moe_utils")
        drop = impl == "megatron"

        def route(x):
            probs, routing_map = mu.topk_routing_with_score_function(
                logits_of(x), top_k, use_pre_softmax=True, score_function="softmax"
            )
            if drop:
                probs, routing_map = mu.apply_router_token_dropping(
                    probs,
                    routing_map,
                    router_topk=top_k,
                    capacity_factor=capacity_factor,
                    drop_policy="probs",
                )
            return {"probs": probs, "map": routing_map, "shape": x.shape}

        def dispatch(x, r):
            permuted, _, r["sorted_indices"] = mu.permute(x, r["map"])
            return permuted

        def combine(y, r):
            return mu.unpermute(
                y, r["sorted_indices"], r["shape"], probs=r["probs"], routing_map=r["map"]
            )

        return DispatchStages(impl, route, dispatch, combine)

    sm = quiet_import("deepspeed.moe.sharded_moe")
    sparse = impl == "deepspeed"

    def route_topk(x):
        out = sm.topkgating(
            logits_of(x),
            top_k,
            capacity_factor,
            min_capacity=1,
            drop_tokens=True,
            drop_policy="probs",
            sparse_routes=sparse,
        )
        if sparse:
            _, capacity, experts, indices, locations, gates, _ = out
            capacity = int(capacity)
            return {
                "slots": sm._route_slots(indices, locations, experts, capacity),
                "gates": gates,
                "experts": experts,
                "capacity": capacity,
                "tokens": x.shape[0],
            }
        _, combine_weights, dispatch_mask, _ = out
        return {"combine": combine_weights, "mask": dispatch_mask}

    if sparse:

        def dispatch(x, r):
            return sm._sparse_encode(x, r["slots"], r["experts"], r["capacity"])

        def combine(y, r):
            experts, capacity, hidden = y.shape
            return sm._sparse_decode(
                y.reshape(experts * capacity, hidden), r["slots"], r["gates"], r["tokens"]
            )
    else:

        def dispatch(x, r):
            return sm.einsum("sec,sm->ecm", r["mask"].type_as(x), x)

        def combine(y, r):
            return sm.einsum("sec,ecm->sm", r["combine"].type_as(y), y)

    return DispatchStages(impl, route_topk, dispatch, combine)
