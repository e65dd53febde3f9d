"""A small MoE transformer, nanoGPT style, cut into pipeline stages (Piper Sec. III-A2a, Fig. 2).

One stage of the PP x EP grid holds ``L/PP`` consecutive layers; each of its EP ranks replicates
attention, norms and router, and owns ``E/EP`` of every layer's experts. Stage 0 also holds the
token embedding, the last stage the final norm and the LM head.

    block(x) = x + attn(norm1(x));  x + moe(norm2(x))
    attn     = causal multi-head attention (torch SDPA)
    moe      = components/moe/moe_layer.py: top-k softmax router -> padding-free dispatch (PFT) ->
               all-to-all-v over the EP group -> SwiGLU experts -> all-to-all-v back -> combine

Parameters are initialised from a seed *per parameter name* (expert weights per global expert
index), so a stage built on any rank holds exactly the values the single-process reference model
holds under the same names: the trainer's exactness check relies on it.

Sizes come from the model zoo (``TransformerConfig.from_zoo``). A router load-balancing loss
(Switch Transformer, Fedus et al. 2022, Eq. 4: ``E * sum_e f_e P_e``) can be added per micro-batch
with ``aux_loss_coef``; inside a pipeline it cannot be added to the last stage's loss, so it is
injected into the backward pass where it arises (``_AddAuxLossGrad``, as Megatron-LM's
MoEAuxLossAutoScaler does), which gives the same gradients as adding it to the loss.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from moe_repro.runtime.timing import instant, instant_clock
from moe_repro.components.moe.gating import GateOutput
from moe_repro.components.moe.moe_layer import MoELayer
from moe_repro.components.moe.overlap import pipelined_routed


@dataclass(frozen=True)
class TransformerConfig:
    vocab: int
    d_model: int
    n_heads: int
    n_layers: int
    d_ffn: int  # per expert
    n_experts: int
    top_k: int
    seq_len: int
    aux_loss_coef: float = 0.0

    @classmethod
    def from_zoo(
        cls,
        key: str,
        seq_len: int | None = None,
        n_layers: int | None = None,
        aux_loss_coef: float = 0.0,
    ) -> "TransformerConfig":
        from moe_repro.components.model.zoo import TINY_MOE_SEQ, get_model

        m = get_model(key)
        if m.vocab is None or m.n_heads is None:
            raise ValueError(f"model {key!r} has no vocab/n_heads in the zoo; cannot build it")
        return cls(
            vocab=m.vocab,
            d_model=m.d_model,
            n_heads=m.n_heads,
            n_layers=n_layers or m.layers,
            d_ffn=m.d_ffn,
            n_experts=m.n_experts,
            top_k=m.top_k,
            seq_len=seq_len or TINY_MOE_SEQ,
            aux_loss_coef=aux_loss_coef,
        )

    def active_params_per_token(self) -> int:
        """Weights one token touches (for 6N FLOPs): attention 4d^2, router, k experts, head."""
        per_layer = (
            4 * self.d_model**2
            + self.d_model * self.n_experts
            + self.top_k * 3 * self.d_model * self.d_ffn
        )
        return self.n_layers * per_layer + self.vocab * self.d_model

    def train_flops_per_token(self) -> float:
        """6N plus causal attention scores, PaLM App. B: 6N + 12 L d s (x 1/2 for the causal mask)."""
        return (
            6.0 * self.active_params_per_token() + 6.0 * self.n_layers * self.d_model * self.seq_len
        )


# --- deterministic, name-keyed initialisation ---------------------------------------------------


def _seeded_normal(shape, std: float, seed: int, name: str) -> torch.Tensor:
    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.randn(shape, generator=g) * std


# --- timing: forward between two time stamps, backward between two identity marks ---------------------


class RegionClock:
    """Seconds per category (attention, experts, all-to-all), forward and backward together.

    Backward time of a region is the time between the autograd engine passing its output mark
    and its input mark (CPU autograd runs a region's nodes back to back). On CUDA every stamp
    first synchronizes the device, so a region's time includes its kernels, not only their
    launches (and the synchronizations serialize the step: region times are an upper bound
    on what overlapped kernels would take)."""

    def __init__(self, device=None):
        self.seconds: dict[str, float] = {}
        self._open: dict[str, float] = {}
        self.device = device
        self.clock = instant_clock(device)  # what timed the regions, for the record

    def now(self) -> float:
        # On CUDA the device's queued work is finished before the host clock is read: a region
        # boundary is a synchronization point (runtime/timing.py).
        return instant(self.device)

    def add(self, key: str, seconds: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds

    def reset(self) -> None:
        self.seconds.clear()
        self._open.clear()


class _Mark(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, clock, key, is_output):
        ctx.clock, ctx.key, ctx.is_output = clock, key, is_output
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        clock = ctx.clock
        if ctx.is_output:  # backward enters the region
            clock._open[ctx.key] = clock.now()
        elif ctx.key in clock._open:
            clock.add(ctx.key, clock.now() - clock._open.pop(ctx.key))
        return grad, None, None, None


def _timed(clock: RegionClock | None, key: str, fn, x: torch.Tensor):
    """Run ``fn(x)``, adding its forward time and (through identity marks on its input and
    tensor output) its backward time to ``clock[key]``. ``fn`` may return a tensor, a
    (tensor, extra) pair, or a GateOutput (marked on its combine weights)."""
    if clock is None:
        return fn(x)
    if x.requires_grad:
        x = _Mark.apply(x, clock, key, False)
    start = clock.now()
    out = fn(x)
    clock.add(key, clock.now() - start)

    def mark(t):
        return _Mark.apply(t, clock, key, True) if t.requires_grad else t

    if isinstance(out, tuple):
        return (mark(out[0]), *out[1:])
    if isinstance(out, GateOutput):
        return GateOutput(out.top_experts, mark(out.combine_weights), out.scores)
    return mark(out)


# --- layers -------------------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model {cfg.d_model} is not a multiple of n_heads {cfg.n_heads}")
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (t.view(b, s, self.n_heads, d // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class _AddAuxLossGrad(torch.autograd.Function):
    """Identity on ``x``; in backward, feeds d(coef * aux)/d(aux) = coef into the aux loss."""

    @staticmethod
    def forward(ctx, x, aux, coef):
        ctx.coef = coef
        ctx.aux_shape = aux.shape
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad.new_full(ctx.aux_shape, ctx.coef), None


class ExpertParallelMoE(nn.Module):
    """The padding-free MoE layer of components/moe/moe_layer.py (router replicated, E/EP experts
    per EP rank, contiguous placement: expert e on EP rank e // (E/EP)), run stage by stage so
    that the trainer can time router+experts apart from the all-to-alls, plus the optional
    Switch balance loss on this rank's tokens. ``all_to_all``: the registered all-to-all whose
    dispatcher the layer holds (components/alltoall, ``algorithm_names()``). ``overlap``: the
    layer's (components/moe/overlap.py; ``auto`` pipelines dispatch and combine with the expert
    GEMMs, forward and backward, under EP with the flat all-to-all). Pipelined, the all-to-alls
    run under the GEMMs and cannot be timed apart: the clock's ``experts`` region then holds the
    whole routed part and ``alltoall`` nothing."""

    def __init__(
        self,
        cfg: TransformerConfig,
        ep_size: int = 1,
        ep_rank: int = 0,
        ep_group=None,
        all_to_all: str = "flat",
        overlap: str = "auto",
    ):
        super().__init__()
        if cfg.n_experts % ep_size:
            raise ValueError(
                f"EP={ep_size} must divide the expert count {cfg.n_experts} (Piper Eq. 8)"
            )
        self.cfg = cfg
        self.first_expert = ep_rank * (cfg.n_experts // ep_size)
        self.layer = MoELayer(
            cfg.d_model,
            cfg.d_ffn,
            cfg.n_experts,
            cfg.top_k,
            expert_parallel=ep_size > 1,
            ep_group=ep_group,
            all_to_all=all_to_all,
            overlap=overlap,
        )
        if self.layer.local_experts[0] != self.first_expert:
            raise ValueError("EP group rank does not match the mesh's EP coordinate")
        self.clock: RegionClock | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        layer, clock = self.layer, self.clock
        gate_out = _timed(clock, "experts", layer.route, x)
        pft = layer.make_pft(gate_out)
        chunks = layer.overlap_chunks()
        if chunks > 1:  # dispatch and combine pipelined with the GEMMs: one region
            out = _timed(clock, "experts", lambda t: pipelined_routed(layer, t, pft, chunks), x)
        else:
            # Dispatch and combine (with their buffer gather and weighted sum) count as all-to-all.
            expert_in, plan = _timed(clock, "alltoall", lambda t: layer.dispatch(t, pft), x)
            y = _timed(clock, "experts", lambda t: layer.expert_compute(t, plan), expert_in)
            out = _timed(clock, "alltoall", lambda t: layer.combine(t, plan, pft), y)
        if self.cfg.aux_loss_coef and self.training:
            # Switch load-balancing loss on this rank's tokens: E * sum_e f_e * P_e.
            frac = pft.tokens_per_expert.to(gate_out.scores.dtype) / max(1, pft.num_rows)
            aux = self.cfg.n_experts * (frac * gate_out.scores.mean(0)).sum()
            out = _AddAuxLossGrad.apply(out, aux, self.cfg.aux_loss_coef)
        return out.reshape(shape)


class Block(nn.Module):
    def __init__(
        self,
        cfg: TransformerConfig,
        ep_size=1,
        ep_rank=0,
        ep_group=None,
        all_to_all: str = "flat",
        overlap: str = "auto",
    ):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = nn.RMSNorm(cfg.d_model)
        self.moe = ExpertParallelMoE(cfg, ep_size, ep_rank, ep_group, all_to_all, overlap)
        self.clock: RegionClock | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + _timed(self.clock, "attention", lambda t: self.attn(self.norm1(t)), x)
        # The MoE block times its own parts (router and experts vs all-to-all).
        return x + self.moe(self.norm2(x))


class StageModule(nn.Module):
    """Layers [first_layer, first_layer + n) of the model, plus embedding / head at the ends.

    Parameter names use global layer indices (``layers.3.attn.qkv.weight``) so that names are
    the same in every stage and in the single-process model.
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        layer_ids: list[int],
        is_first: bool,
        is_last: bool,
        ep_size: int = 1,
        ep_rank: int = 0,
        ep_group=None,
        seed: int = 0,
        checkpoint: bool = False,
        all_to_all: str = "flat",
    ):
        super().__init__()
        self.cfg, self.is_first, self.is_last, self.checkpoint = cfg, is_first, is_last, checkpoint
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model) if is_first else None
        self.layers = nn.ModuleDict(
            {
                # Checkpointed blocks stay unpipelined: the pipelined backward reads the chunks'
                # kept graphs, which checkpointing would recompute mid-exchange.
                str(i): Block(
                    cfg, ep_size, ep_rank, ep_group, all_to_all, "off" if checkpoint else "auto"
                )
                for i in layer_ids
            }
        )
        self.norm = nn.RMSNorm(cfg.d_model) if is_last else None
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False) if is_last else None
        self.reset_parameters(seed)

    def reset_parameters(self, seed: int) -> None:
        """GPT-2 style: N(0, 0.02), output projections N(0, 0.02 / sqrt(2L)), norms 1."""
        proj_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        experts = expert_param_names(self)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name in experts:
                    moe = expert_owner(self, name)
                    std = proj_std if name.endswith("w_out") else 0.02
                    for j in range(p.shape[0]):  # one stream per *global* expert
                        p[j].copy_(
                            _seeded_normal(
                                p.shape[1:], std, seed, f"{name}[{moe.first_expert + j}]"
                            )
                        )
                elif "norm" in name:
                    p.fill_(1.0)
                else:
                    std = proj_std if name.endswith("proj.weight") else 0.02
                    p.copy_(_seeded_normal(p.shape, std, seed, name))

    def blocks(self) -> list[Block]:
        """This stage's transformer blocks, first layer first."""
        return [b for b in self.layers.values() if isinstance(b, Block)]

    def set_clock(self, clock: RegionClock | None) -> None:
        for block in self.blocks():
            block.clock = clock
            block.moe.clock = clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.layers.values():
            if self.checkpoint and torch.is_grad_enabled():
                # Activation checkpointing: keep the block input only, recompute in backward
                # (the recomputation repeats the block's all-to-alls on every EP rank in step).
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if self.head is not None and self.norm is not None:  # the last stage has both
            x = self.head(self.norm(x))
        return x


def expert_param_names(module: nn.Module) -> set[str]:
    """Names of the per-expert weights (stacked [E_local, ...]; everything else is replicated)."""
    return {n for n, _ in module.named_parameters() if ".experts." in n}


def expert_owner(module: nn.Module, name: str) -> ExpertParallelMoE:
    """The MoE layer that holds the expert weight ``name``."""
    owner = module.get_submodule(name.split(".moe.")[0] + ".moe")
    if not isinstance(owner, ExpertParallelMoE):
        raise TypeError(f"{name} is not an expert weight of an ExpertParallelMoE")
    return owner


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy of one micro-batch (the loss the schedule scales by 1/M)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
