"""Megatron-core's and DeepSpeed's own expert-parallel MoE layers, on the same ranks as ours.

components/moe/peers.py runs the peers' gating, permute and unpermute on one rank. Here their
whole expert-parallel path runs over a real EP group (gloo on CPU), forward and backward, with
the same router weight and the same expert weights as our :class:`MoELayer` on that group:

  megatron   Megatron-core 0.16's ``MoEAlltoAllTokenDispatcher`` on our EP group, routed by our
             layer's kept pairs and weights; our experts run on its rows and scale them by its
             probs (the same product as Megatron's experts compute).
  deepspeed  DeepSpeed 0.19's ``MOELayer`` with its ``_AllToAll`` on our EP group and its own
             ``topkgating``; our layer matches it with ``capacity_factor``,
             ``drop_policy="probs"`` and ``renormalize_after_drop=True``.

CPU worlds: :func:`megatron_on_cpu` points Megatron's device allocations at the CPU and turns
its side-stream split-size copy into host lists; DeepSpeed's path only skips compiling a C++ op
it never calls (:func:`_without_shared_memory_op`). Every collective and every permutation is
the peers' own code.

Why: our layer is checked against the frameworks' own expert-parallel code, not a reading of
it. How each peer is driven and matched: see docs/moe-kernels.md.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from moe_repro.runtime.device import cuda_count  # whether CUDA exists: the runtime's one answer
from moe_repro.components.alltoall.base import Dispatcher, FlatLayout
from moe_repro.components.moe.moe_layer import MoELayer
from moe_repro.components.moe.peers import quiet_import, require_peer


def megatron_on_cpu() -> None:
    """On a CPU-only torch, make ``torch.cuda.current_device()`` name the CPU for this process
    (Megatron allocates its collectives' outputs there, forward and backward; without CUDA the
    call could only raise). Nothing changes where CUDA is present."""
    if not cuda_count():
        # deliberately a device where torch promises an int: Megatron passes it as a device
        torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]


def _megatron_dispatcher(
    hidden: int, experts: int, top_k: int, local_experts: list[int], ep_size: int, ep_group
):
    """Megatron's ``MoEAlltoAllTokenDispatcher`` for ``local_experts`` (consecutive) of ``experts``
    on ``ep_group``, dropless (no capacity factor), hidden size ``hidden``."""
    td = quiet_import("megatron.core.transformer.moe.token_dispatcher")
    tc = quiet_import("megatron.core.transformer.transformer_config")
    pgc = quiet_import("megatron.core.process_groups_config")

    # mypy cannot see a class of a module imported by name at run time (quiet_import)
    class _CPUAlltoAllTokenDispatcher(td.MoEAlltoAllTokenDispatcher):  # type: ignore[name-defined]
        """Megatron's all-to-all dispatcher; on CPU its DtoH side-stream step only turns the
        split sizes into host lists (what the CUDA path's copy to numpy gives the collective)."""

        def _maybe_dtoh_and_synchronize(self, point, tokens_per_expert=None):
            if cuda_count():
                return super()._maybe_dtoh_and_synchronize(point, tokens_per_expert)
            if point == self.cuda_dtoh_point:
                for name in ("input_splits", "output_splits", "output_splits_tp"):
                    value = getattr(self, name)
                    if torch.is_tensor(value):
                        setattr(self, name, value.tolist())
            return tokens_per_expert

    if not cuda_count() and td.MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is None:
        td.MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = False  # its __init__ makes a CUDA stream
    config = tc.TransformerConfig(  # ffn_hidden_size: required, unused by the dispatcher
        num_layers=1,
        hidden_size=hidden,
        num_attention_heads=1,
        ffn_hidden_size=hidden,
        num_moe_experts=experts,
        moe_router_topk=top_k,
        moe_token_dispatcher_type="alltoall",
        expert_model_parallel_size=ep_size,
        add_bias_linear=False,
        moe_permute_fusion=False,
    )
    groups = pgc.ProcessGroupCollection(ep=ep_group, tp_ep=ep_group, expt_tp=None)
    return _CPUAlltoAllTokenDispatcher(
        len(local_experts), list(local_experts), config, pg_collection=groups
    )


def megatron_forward(layer: MoELayer, ep_group) -> Callable[[torch.Tensor], torch.Tensor]:
    """x [S, H] -> [S, H] through Megatron's token dispatcher around ``layer``'s gate and
    experts (differentiable: gradients reach x, the gate and the experts)."""
    require_peer("megatron")
    if not layer.placement.is_contiguous:
        raise ValueError("Megatron's dispatcher needs contiguous experts per rank")
    megatron_on_cpu()
    dispatcher = _megatron_dispatcher(
        layer.d_model,
        layer.num_experts,
        layer.top_k,
        list(layer.local_experts),
        layer.placement.world_size,
        ep_group,
    )

    def forward(x: torch.Tensor) -> torch.Tensor:
        pft = layer.make_pft(layer.route(x))  # our kept pairs (after any capacity drop)
        routing_map, probs = _routing_map_and_probs(pft, x.shape[0], layer.num_experts, x.device)
        tokens, token_probs = dispatcher.dispatch_preprocess(x, routing_map, probs)
        tokens, token_probs = dispatcher.token_dispatch(tokens, token_probs)
        tokens, per_expert, token_probs = dispatcher.dispatch_postprocess(tokens, token_probs)
        y = layer.experts(tokens, torch.as_tensor(per_expert, dtype=torch.int64).cpu())
        y = y * token_probs.to(y.dtype).unsqueeze(1)
        y = dispatcher.combine_preprocess(y)
        y = dispatcher.token_combine(y)
        return dispatcher.combine_postprocess(y)

    return forward


def _routing_map_and_probs(
    pft, num_tokens: int, num_experts: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A PFT as the dense pair Megatron's router hands its dispatcher: a [S, E] bool routing map
    and [S, E] probs (each kept pair's combine weight, 0 elsewhere; differentiable)."""
    probs = torch.zeros(num_tokens, num_experts, dtype=pft.combine_weights.dtype, device=device)
    probs = probs.index_put((pft.token_ids, pft.expert_ids), pft.combine_weights)
    routing_map = torch.zeros(num_tokens, num_experts, dtype=torch.bool, device=device)
    routing_map[pft.token_ids, pft.expert_ids] = True
    return routing_map, probs


@dataclass
class MegatronPlan:
    routing_map: torch.Tensor
    probs: torch.Tensor
    layout: FlatLayout | None = None  # known once Megatron's preprocess has exchanged the counts
    received_probs: torch.Tensor | None = None  # the probs of the rows delivered here


class MegatronDispatcher(Dispatcher):
    """Megatron-core's ``MoEAlltoAllTokenDispatcher`` behind our :class:`Dispatcher`, so that the
    alltoall suite times it on the same routing, rows and ranks as ours and checks its output
    against the same reference.

    Dispatch is its ``dispatch_preprocess`` (tokens per expert, the all-gather of every rank's
    counts, ``permute``: rows and probs gathered expert by expert) and ``token_dispatch`` (the
    all-to-all-v of the rows and a second one of the probs). Combine is ``token_combine`` (the
    all-to-all-v back) and ``combine_postprocess`` (``unpermute``: each token the sum of its
    rows); the rows are first scaled by their probs, as Megatron's experts do before returning
    them. What it delivers is the flat layout (by source rank, each source's rows expert by
    expert, token ascending), the layout every one of our dispatchers delivers, for contiguous
    experts per rank (Megatron's requirement). Left out on both sides: Megatron's
    ``dispatch_postprocess`` / ``combine_preprocess``, which regroup the rows by local expert
    (``sort_chunks_by_idxs``), as our layer regroups after our dispatcher (moe_layer.MoELayer.dispatch).

    For timing and checking: the layer trains with its own path (:func:`megatron_forward`)."""

    def __init__(self, comm, expert_to_rank: list[int], hidden: int, top_k: int):
        require_peer("megatron")
        group = getattr(comm, "group", False)
        if group is False:
            raise ValueError(
                "Megatron-core's dispatcher runs on a torch.distributed process "
                "group: backend gloo or nccl, not mpi"
            )
        local = [e for e, r in enumerate(expert_to_rank) if r == comm.rank]
        if not local or local != list(range(local[0], local[0] + len(local))):
            raise ValueError(
                "Megatron-core's dispatcher needs at least one expert per rank, "
                "consecutive (placement contiguous)"
            )
        megatron_on_cpu()
        self._comm, self.num_experts = comm, len(expert_to_rank)
        self.megatron = _megatron_dispatcher(
            hidden,
            self.num_experts,
            top_k,
            local,
            comm.size,
            group if group is not None else torch.distributed.group.WORLD,
        )
        self._pft = None
        self._routing: tuple[torch.Tensor, torch.Tensor] | None = None

    def comm(self):
        return self._comm

    def plan(self, pft) -> MegatronPlan:
        # Megatron's router returns the dense pair; made from the PFT once per PFT (outside the
        # timing, as flat computes its send layout once per PFT)
        if pft is not self._pft or self._routing is None:
            self._routing = _routing_map_and_probs(
                pft, pft.num_tokens, self.num_experts, pft.combine_weights.device
            )
            self._pft = pft
        return MegatronPlan(*self._routing)

    def send_rows(self, x: torch.Tensor, state: MegatronPlan) -> torch.Tensor:
        m = self.megatron
        t = self._clock()
        rows, probs = m.dispatch_preprocess(x, state.routing_map, state.probs)
        t = self._lap("permute and counts", t)
        out, state.received_probs = m.token_dispatch(rows, probs)
        self._lap("all-to-all", t)
        state.layout = FlatLayout(
            send_rows=torch.empty(0, dtype=torch.int64),
            send_counts=[int(c) for c in m.input_splits],
            recv_counts=[int(c) for c in m.output_splits],
        )
        return out

    def return_rows(
        self, y: torch.Tensor, state: MegatronPlan, num_tokens: int, weighted: bool
    ) -> torch.Tensor:
        m = self.megatron
        if weighted:
            if state.received_probs is None:
                raise RuntimeError("combine called before Megatron's dispatch delivered rows")
            y = y * state.received_probs.to(y.dtype).unsqueeze(1)
        return m.combine_postprocess(m.token_combine(y)).reshape(num_tokens, y.shape[1])


class _DeepSpeedGate(nn.Module):
    """DeepSpeed's ``topkgating`` (sparse routes) on our router weight, as its MOELayer's gate."""

    def __init__(self, layer: MoELayer, capacity_factor: float, sm):
        super().__init__()
        self.layer, self.capacity_factor, self.sm = layer, capacity_factor, sm

    def _set_ep_group(self, group) -> None:
        pass  # drop_tokens=True: the capacity is local, no collective in the gate

    def forward(self, x, used_token=None, use_tutel=False, *_):
        logits = x.float() @ self.layer.gate.weight.float()
        return self.sm.topkgating(
            logits,
            self.layer.top_k,
            self.capacity_factor,
            min_capacity=1,
            drop_tokens=True,
            drop_policy="probs",
            sparse_routes=True,
        )


class _OurExpertsOnBuffer(nn.Module):
    """Our experts on DeepSpeed's [ep, E_local, C, H] buffer."""

    def __init__(self, layer: MoELayer):
        super().__init__()
        self.layer = layer

    def forward(self, buffer: torch.Tensor) -> torch.Tensor:
        ep, local, capacity, hidden = buffer.shape
        per_expert = buffer.transpose(0, 1).reshape(local, ep * capacity, hidden)
        out = self.layer.experts.forward_padded(per_expert)
        return out.reshape(local, ep, capacity, hidden).transpose(0, 1)


def _without_shared_memory_op() -> None:
    """Keep deepspeed.comm from compiling its shared-memory C++ op. Its ``TorchBackend`` builds
    that op on first use (torch's JIT extension build: minutes of compiling on a small CPU
    machine, again for every new install or extension cache), and the op only serves
    ``inference_all_reduce``; the MoE layer's all-to-all is torch.distributed's. The op is marked
    unavailable in DeepSpeed's own table of compatible ops, the one its ``build_shm_op``
    consults (deepspeed.ops keeps that dict so that edits to it persist)."""
    ops = quiet_import("deepspeed.ops")
    ops.__compatible_ops__["deepspeed_shm_comm"] = False


def deepspeed_forward(
    layer: MoELayer, ep_group, capacity_factor: float
) -> Callable[[torch.Tensor], torch.Tensor]:
    """x [S, H] -> [S, H] through DeepSpeed's MOELayer (its gating, encode, all-to-all, decode)
    around ``layer``'s router weight and experts."""
    require_peer("deepspeed")
    ds_comm = quiet_import("deepspeed.comm")
    sm = quiet_import("deepspeed.moe.sharded_moe")
    if not ds_comm.is_initialized():
        _without_shared_memory_op()
        with contextlib.redirect_stdout(io.StringIO()):
            ds_comm.init_distributed(
                dist_backend=torch.distributed.get_backend(),
                auto_mpi_discovery=False,
                verbose=False,
            )
    world = layer.placement.world_size
    moe = sm.MOELayer(
        _DeepSpeedGate(layer, capacity_factor, sm),
        _OurExpertsOnBuffer(layer),
        "ep_size_repro",
        world,
        len(layer.local_experts),
    )
    moe._set_ep_group(ep_group)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return moe(x, None)

    return forward


EP_PEERS = ("megatron", "megatron-nodrop", "deepspeed")  # impls.py declares what each supports


def peer_forward(impl: str, layer: MoELayer, ep_group, capacity_factor: float | None):
    """The named peer's expert-parallel forward around ``layer`` (built with the impl's
    ``layer_options``, components/moe/impls.py)."""
    if impl in ("megatron", "megatron-nodrop"):
        return megatron_forward(layer, ep_group)
    if impl == "deepspeed":
        if capacity_factor is None:
            raise ValueError("deepspeed drops tokens above capacity: give capacity_factor")
        return deepspeed_forward(layer, ep_group, capacity_factor)
    raise ValueError(f"multi-rank peer must be one of {', '.join(EP_PEERS)}, got {impl!r}")
