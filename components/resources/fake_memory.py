"""Training memory per category as PyTorch accounts it, beside our memory model's terms.

One FSDP2 training step (``fully_shard``, bf16 parameters, fp32 gradient reduction; forward,
backward, Adam) of a scaled-down zoo stack (``StackSpec.scaled``: GQA attention through SDPA, a
SwiGLU/GeLU FFN or an MoE block) on rank 0 of a ``world``-rank fake process group
(torch.testing._internal.distributed.fake_pg: collectives are no-ops with the right shapes).
MoE experts are expert-parallel over ``ep`` ranks and their module is its own FSDP unit on the
``world / ep`` ranks left, as torchtitan's apply_moe_ep_tp + apply_fsdp shard them.

- ``measure_fake``: FakeTensorMode (exact sizes, no storage, no allocator rounding on the CPU
  device) with torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker filing each tensor
  under FSDP's categories; runs anywhere.
- ``measure_cuda``: the same step on real CUDA tensors, recorded by the caching allocator
  (torch.cuda.memory._record_memory_history / _snapshot); ``measure`` uses it where the
  runtime's device rule counts a GPU.

Routing: fake tensors carry no values, so copy j of token t goes to expert (t k + j) mod E (every
expert gets T k / E copies: balanced, dropless, unpadded); the router's probabilities are still
computed and the gate weights gathered from them. ``load`` scales the copies the measured rank's
experts receive (1 = balanced). ``planner_memory`` asks memory_model.LayoutMemory for the same
stack and layout; ``side_by_side`` pairs its terms with the tracker's categories. See
docs/memory-accounting.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as Fn
from torch import nn

from moe_repro.components.model.zoo import MoEModel
from moe_repro.components.resources import formulas as F
from moe_repro.runtime.device import cuda_count, resolve_device
from moe_repro.components.resources.memory_model import (
    LayerMemory,
    LayoutMemory,
    MemoryLayout,
    StageMemory,
    pipeline_stages,
)

# How a SwiGLU keeps its activations: "eager" as torchtitan's FeedForward (silu(w1 x) * w3 x:
# autograd keeps w1 x, silu(w1 x), w3 x and the product, 4 d_ffn per token); "fused" as
# Megatron-core's bias_swiglu_impl (keeps w1 x and w3 x, recomputes silu in backward; with the
# product kept by w2: 3 d_ffn, the n_mat d_ffn our activation formula counts).
SWIGLU = ("eager", "fused")

# FSDPMemTracker's categories (torch.distributed._tools.fsdp2_mem_tracker._FSDPRefType names)
CATEGORIES = (
    "SHARDED_PARAM",
    "UNSHARDED_PARAM",
    "BUFFER",
    "SHARDED_GRAD",
    "UNSHARDED_GRAD",
    "ACT",
    "TEMP",
    "ALL_GATHER",
    "REDUCE_SCATTER",
    "OPT",
    "INP",
)


@dataclass(frozen=True)
class StackSpec:
    """A layer stack and its layout: ``batch`` sequences of ``seq`` tokens per rank; ``world``
    data-parallel ranks (FSDP), ``ep`` of them expert-parallel (EP divides world and experts).
    ``experts`` = 0: a dense stack with an FFN of ``d_ffn``. ``n_mat`` 2: GeLU FFN; 3: SwiGLU."""

    layers: int
    d_model: int
    heads: int
    kv_heads: int
    head_dim: int
    d_ffn: int
    batch: int
    seq: int
    experts: int = 0
    top_k: int = 0
    n_mat: int = 3
    ep: int = 1
    world: int = 8
    load: float = 1.0
    swiglu: str = "eager"
    name: str = "stack"

    def __post_init__(self):
        for k in ("layers", "d_model", "heads", "kv_heads", "head_dim", "d_ffn", "batch", "seq"):
            if getattr(self, k) <= 0:
                raise ValueError(f"{k} must be positive, got {getattr(self, k)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        if self.n_mat not in (2, 3):
            raise ValueError(f"n_mat must be 2 (GeLU) or 3 (SwiGLU), got {self.n_mat}")
        if self.swiglu not in SWIGLU:
            raise ValueError(f"swiglu must be one of {SWIGLU}, got {self.swiglu!r}")
        if self.world % self.ep:
            raise ValueError(f"ep={self.ep} must divide world={self.world}")
        if self.experts:
            if not 0 < self.top_k <= self.experts or self.experts % self.ep:
                raise ValueError(f"need 0 < top_k <= experts and ep | experts, got {self}")
            if (self.tokens * self.top_k) % self.experts:
                raise ValueError("balanced routing needs experts | batch x seq x top_k")
            if self.load <= 0 or (self.copies * self.load) % self.ep:
                raise ValueError(f"load must be positive and give whole splits, got {self.load}")
        elif self.ep != 1:
            raise ValueError("a dense stack has no expert parallelism (ep must be 1)")

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def copies(self) -> int:
        """Routed copies this rank sends per MoE layer: T k."""
        return self.tokens * self.top_k

    @classmethod
    def scaled(
        cls,
        m: MoEModel,
        width: int,
        layers: int,
        batch: int,
        seq: int,
        ep: int = 1,
        world: int = 8,
        load: float = 1.0,
        swiglu: str = "eager",
    ) -> StackSpec:
        """A zoo model with d_model, d_ffn and head_dim divided by ``width`` (heads, KV heads,
        experts, top-k and the FFN's matrices kept) and ``layers`` layers: the same layer, smaller.
        Models with MLA, shared experts, a residual FFN or dense layers beside MoE ones are
        refused (the stack has none of them)."""
        if m.mla is not None or m.attn_params != "gqa":
            raise ValueError(f"{m.key}: only GQA/MHA attention is built")
        if m.n_shared or m.d_ffn_residual or m.extra_params_per_layer:
            raise ValueError(f"{m.key}: shared experts / residual FFNs are not built")
        dense = m.n_moe_layers == 0
        if not dense and m.n_dense_layers:
            raise ValueError(f"{m.key}: mixed dense and MoE layers are not built")
        heads = m.heads
        hd = m.head_dim or m.d_model // heads
        ffn = (m.d_ffn_dense or m.d_ffn) if dense else m.d_ffn
        for what, v in (("d_model", m.d_model), ("d_ffn", ffn), ("head_dim", hd)):
            if v % width:
                raise ValueError(f"width {width} does not divide {m.key}'s {what} {v}")
        return cls(
            layers=layers,
            d_model=m.d_model // width,
            heads=heads,
            kv_heads=m.n_kv_heads or heads,
            head_dim=hd // width,
            d_ffn=ffn // width,
            batch=batch,
            seq=seq,
            experts=0 if dense else m.n_experts,
            top_k=0 if dense else m.top_k,
            n_mat=m.n_mat,
            ep=ep,
            world=world,
            load=load,
            swiglu=swiglu,
            name=f"{m.key} / {width}, {layers} layers",
        )

    def model(self) -> MoEModel:
        """The stack as a zoo entry (no vocabulary: the stack has no embedding or head)."""
        m = MoEModel(
            key=f"stack:{self.name}",
            name=self.name,
            layers=self.layers,
            d_model=self.d_model,
            d_ffn=self.d_ffn,
            n_experts=self.experts or 1,
            top_k=self.top_k or 1,
            n_mat=self.n_mat,
            n_heads=self.heads,
            n_kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            vocab=None,
            source="components.resources.fake_memory.StackSpec",
        )
        return m if self.experts else dataclasses.replace(m, moe_layers=0, d_ffn_dense=self.d_ffn)

    def layout(self) -> MemoryLayout:
        return MemoryLayout(dp=self.world, ep=self.ep, micro_batch=self.batch)


def planner_memory(spec: StackSpec, precision: str = "bf16-adam") -> StageMemory:
    """Our memory model's terms for ``spec``: ZeRO-3 (FSDP full shard), no recompute, FlashAttention
    (SDPA keeps no scores), no dropout, capacity factor = ``load`` (the routed copies the rank's
    experts receive), no framework overhead."""
    lm = LayerMemory(
        spec.model(), spec.seq, F.precision(precision), flash=True, capacity_factor=spec.load
    )
    lay = LayoutMemory(lm, spec.layout(), pipeline_stages(spec.model(), 1))
    return lay.stage(3, "none", 0, 0)


# --------------------------------------------------------------------------------------------
# The stack
# --------------------------------------------------------------------------------------------


class _Attention(nn.Module):
    def __init__(self, s: StackSpec):
        super().__init__()
        self.h, self.kv, self.hd = s.heads, s.kv_heads, s.head_dim
        self.wq = nn.Linear(s.d_model, s.heads * s.head_dim, bias=False)
        self.wk = nn.Linear(s.d_model, s.kv_heads * s.head_dim, bias=False)
        self.wv = nn.Linear(s.d_model, s.kv_heads * s.head_dim, bias=False)
        self.wo = nn.Linear(s.heads * s.head_dim, s.d_model, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.wq(x).view(b, n, self.h, self.hd).transpose(1, 2)
        k = self.wk(x).view(b, n, self.kv, self.hd).transpose(1, 2)
        v = self.wv(x).view(b, n, self.kv, self.hd).transpose(1, 2)
        y = Fn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv < self.h)
        return self.wo(y.transpose(1, 2).reshape(b, n, self.h * self.hd))


class _FusedSwiGLU(torch.autograd.Function):
    """silu(a) * b keeping only a and b for backward (Megatron-core's bias_swiglu_impl)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return Fn.silu(a) * b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        sig = torch.sigmoid(a)
        return g * b * sig * (1 + a * (1 - sig)), g * a * sig


def _swiglu(a, b, how: str):
    return _FusedSwiGLU.apply(a, b) if how == "fused" else Fn.silu(a) * b


class _FFN(nn.Module):
    """GeLU (w1, w2) or SwiGLU (w1 gate, w3 up, w2 down), as torchtitan's FeedForward."""

    def __init__(self, s: StackSpec):
        super().__init__()
        self.how = s.swiglu
        self.w1 = nn.Linear(s.d_model, s.d_ffn, bias=False)
        self.w2 = nn.Linear(s.d_ffn, s.d_model, bias=False)
        self.w3 = nn.Linear(s.d_model, s.d_ffn, bias=False) if s.n_mat == 3 else None

    def forward(self, x):
        if self.w3 is None:
            return self.w2(Fn.gelu(self.w1(x)))
        return self.w2(_swiglu(self.w1(x), self.w3(x), self.how))


class _Experts(nn.Module):
    """This EP rank's E / EP experts as batched matrices (torchtitan's GroupedExperts layout)."""

    def __init__(self, s: StackSpec):
        super().__init__()
        self.how = s.swiglu
        e, d, f = s.experts // s.ep, s.d_model, s.d_ffn
        self.w1 = nn.Parameter(torch.randn(e, d, f) * 0.02)
        self.w2 = nn.Parameter(torch.randn(e, f, d) * 0.02)
        self.w3 = nn.Parameter(torch.randn(e, d, f) * 0.02) if s.n_mat == 3 else None

    def forward(self, x):  # x: (experts, rows, d)
        h = torch.bmm(x, self.w1)
        h = Fn.gelu(h) if self.w3 is None else _swiglu(h, torch.bmm(x, self.w3), self.how)
        return torch.bmm(h, self.w2)


class _MoE(nn.Module):
    """Router, balanced dropless routing (module docstring), EP all-to-all dispatch, the local
    experts, all-to-all combine, gate-weighted sum."""

    def __init__(self, s: StackSpec, ep_group):
        super().__init__()
        self.s, self.group = s, ep_group
        self.router = nn.Linear(s.d_model, s.experts, bias=False)
        self.experts = _Experts(s)

    def _a2a(self, x, send: int, recv: int):
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        if self.group is None:
            return x
        ep = self.s.ep
        return all_to_all_single_autograd(x, [recv // ep] * ep, [send // ep] * ep, self.group)

    def forward(self, x):
        s = self.s
        b, n, d = x.shape
        h = x.reshape(b * n, d)
        T, k, E, ep = b * n, s.top_k, s.experts, s.ep
        probs = self.router(h).softmax(-1)
        idx = (torch.arange(T * k, device=x.device) % E).view(T, k)  # balanced assignment
        gate = probs.gather(1, idx)
        # copies sorted by expert: position e (T k / E) + i holds copy i E + e
        order = torch.arange(T * k, device=x.device).view(-1, E).t().reshape(-1)
        sent = h[order // k]
        recv_rows = int(T * k * s.load)
        got = self._a2a(sent, T * k, recv_rows)  # source-major: (ep, E / ep, rows, d)
        el = E // ep
        xe = got.view(ep, el, -1, d).transpose(0, 1).reshape(el, -1, d)
        ye = self.experts(xe).view(el, ep, -1, d).transpose(0, 1).reshape(-1, d)
        back = self._a2a(ye, recv_rows, T * k)[order.argsort()].view(T, k, d)
        return (back * gate.unsqueeze(-1)).sum(1).view(b, n, d)


class _Block(nn.Module):
    def __init__(self, s: StackSpec, ep_group):
        super().__init__()
        self.norm1 = nn.LayerNorm(s.d_model, bias=False)
        self.norm2 = nn.LayerNorm(s.d_model, bias=False)
        self.attn = _Attention(s)
        self.ffn = _MoE(s, ep_group) if s.experts else _FFN(s)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


def build_stack(s: StackSpec, ep_group=None) -> nn.Sequential:
    return nn.Sequential(*[_Block(s, ep_group) for _ in range(s.layers)])


def parameter_count(s: StackSpec) -> tuple[int, int]:
    """(dense, expert) parameters of the whole stack, all EP ranks together, counted from the
    module itself on the meta device (not from the planner's formulas)."""
    with torch.device("meta"):
        blocks = build_stack(dataclasses.replace(s, ep=1, world=1))
    exp = sum(p.numel() for n, p in blocks.named_parameters() if ".experts." in n)
    return sum(p.numel() for p in blocks.parameters()) - exp, exp


# --------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------


# Sums of categories whose joint maximum is compared with one planner term: FSDP's gathered
# weights (the all-gather output and the unsharded parameters copied out of it) and its gradient
# reduction buffers (unsharded gradients and the reduce-scatter input).
GROUPS = {
    "gathered weights": ("UNSHARDED_PARAM", "ALL_GATHER"),
    "gradient buffers": ("UNSHARDED_GRAD", "REDUCE_SCATTER"),
}


@dataclass
class TrackedMemory:
    """One training step's memory on rank 0, by category (bytes). ``after_forward``,
    ``after_backward``, ``after_step``: the categories then; ``at_peak``: the categories when the
    total peaked; ``category_peaks``: each category's (and each GROUPS sum's) own maximum over the
    step; ``peak``: the peak total; ``output``: the model output's bytes (the caller's tensor,
    filed as an activation); ``how``: what produced the numbers; ``extra``: the fake run's
    "MoE forward transient" (the most an MoE block's forward holds at once beyond what it leaves
    behind, gathered weights aside: its dispatch and combine buffers), or the CUDA run's
    allocator figures. The step measured is the second:
    the first (untracked) creates Adam's state, as every later step finds it."""

    after_forward: dict[str, int]
    after_backward: dict[str, int]
    after_step: dict[str, int]
    at_peak: dict[str, int]
    category_peaks: dict[str, int]
    peak: int
    output: int
    how: str
    extra: dict[str, float] = field(default_factory=dict)


class _FakeWorld:
    """A fake process group of ``world`` ranks (this process is rank 0) and the FSDP and EP
    meshes on ``device``; the group is destroyed on exit unless it existed before."""

    def __init__(self, world: int, ep: int, device: str = "cpu"):
        self.world, self.ep, self.device, self.owned = world, ep, device, False

    def __enter__(self):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.testing._internal.distributed.fake_pg import FakeStore

        if dist.is_initialized():
            if dist.get_world_size() != self.world:
                raise RuntimeError(
                    f"a process group of {dist.get_world_size()} ranks exists; need {self.world}"
                )
        else:
            dist.init_process_group("fake", rank=0, world_size=self.world, store=FakeStore())
            self.owned = True
        # outside FakeTensorMode: the meshes need real ranks
        self.dp = init_device_mesh(self.device, (self.world,), mesh_dim_names=("dp",))
        self.ep_mesh = init_device_mesh(
            self.device, (self.world // self.ep, self.ep), mesh_dim_names=("efsdp", "ep")
        )
        self.ep_group = self.ep_mesh.get_group("ep") if self.ep > 1 else None
        return self

    def __exit__(self, *exc):
        if self.owned:
            dist.destroy_process_group()


def _shard(model: nn.Sequential, s: StackSpec, w: _FakeWorld):
    """torchtitan's apply_fsdp: experts on the efsdp dim (world / EP ranks), then each block and
    the root on all ranks; bf16 parameters, fp32 gradient reduction."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model:
        assert isinstance(block, _Block)
        if isinstance(block.ffn, _MoE):
            fully_shard(block.ffn.experts, mesh=w.ep_mesh["efsdp"], mp_policy=mp)
        fully_shard(block, mesh=w.dp, mp_policy=mp)
    fully_shard(model, mesh=w.dp, mp_policy=mp)


def _name(k) -> str:
    return str(k).split(".")[-1]


def _tracker(model, opt):
    """FSDPMemTracker that also keeps each category's and each GROUPS sum's own maximum (its
    peak snapshot holds the categories at the moment the total peaked only)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class PeakPerCategory(FSDPMemTracker):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.category_peaks: dict[str, int] = {}
            self.window: int | None = None  # max of Total - gathered weights inside a window

        def _update_peak_stats(self, peak_state) -> None:  # after every tracked op
            super()._update_peak_stats(peak_state)
            for snap in self._curr_mem_snap.values():
                now = {_name(k): v for k, v in snap.items()}
                for g, members in GROUPS.items():
                    now[g] = sum(now.get(c, 0) for c in members)
                for k, v in now.items():
                    if v > self.category_peaks.get(k, 0):
                        self.category_peaks[k] = v
                if self.window is not None:
                    self.window = max(self.window, now["Total"] - now["gathered weights"])

        def held(self) -> int:
            """Total less FSDP's gathered weights, now."""
            now = self.now()
            return now["Total"] - sum(now.get(c, 0) for c in GROUPS["gathered weights"])

        def watch_forward_transient(self, modules) -> list:
            """Hooks that record, per forward of each module, the most it held at once beyond
            what it left behind (its saved tensors and output), gathered weights aside."""
            found: list[int] = []

            def pre(mod, args):
                self.window = self.held()

            def post(mod, args, out):
                if self.window is not None:
                    found.append(self.window - self.held())
                self.window = None

            self.hooks = [
                h
                for m in modules
                for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))
            ]
            return found

        def now(self) -> dict[str, int]:
            (snap,) = self.get_tracker_snapshot("current").values()
            return {_name(k): v for k, v in snap.items()}

    return PeakPerCategory(model, opt)


def measure_fake(s: StackSpec, foreach: bool = False) -> TrackedMemory:
    """The second training step under FakeTensorMode with FSDPMemTracker (module docstring).
    ``foreach=False`` by default: Adam's per-parameter loop; ``foreach=True`` adds the grouped
    kernels' temporaries, which the tracker files as optimizer state."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with _FakeWorld(s.world, s.ep) as w, FakeTensorMode():
        model = build_stack(s, w.ep_group)
        _shard(model, s, w)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=foreach)
        x = torch.randn(s.batch, s.seq, s.d_model)
        model(x).float().sum().backward()  # step 1, untracked: creates Adam's state
        opt.step()
        opt.zero_grad()  # torchtitan's loop: gradients set to None before each step
        fmt = _tracker(model, opt)
        fmt.track_inputs((x,))
        moe_transients = fmt.watch_forward_transient(
            [m for m in model.modules() if isinstance(m, _MoE)]
        )
        with fmt:
            out = model(x)
            for h in fmt.hooks:
                h.remove()
            fwd = fmt.now()
            out.float().sum().backward()
            bwd = fmt.now()
            opt.step()
            step = fmt.now()
        (peak_snap,) = fmt.get_tracker_snapshot("peak").values()
        out_bytes = out.numel() * out.element_size()
    at_peak = {_name(k): v for k, v in peak_snap.items()}
    return TrackedMemory(
        after_forward=fwd,
        after_backward=bwd,
        after_step=step,
        at_peak=at_peak,
        category_peaks=dict(fmt.category_peaks),
        peak=at_peak.get("Total", 0),
        output=out_bytes,
        how=f"measured: FSDPMemTracker under FakeTensorMode, torch {torch.__version__}, "
        f"fake process group of {s.world} ranks (rank 0)",
        extra={"MoE forward transient": float(max(moe_transients, default=0))},
    )


def measure_cuda(s: StackSpec, foreach: bool = False) -> TrackedMemory:
    """The same second step on real CUDA tensors (rank 0 of the same fake process group),
    recorded by the caching allocator: torch.cuda.memory._record_memory_history, read back with
    torch.cuda.memory._snapshot(). The allocator knows no categories: ``at_peak`` holds the peak
    allocated and reserved bytes, the ``after_*`` the allocated bytes then (``Total``), and
    ``extra`` the snapshot's reserved bytes and trace length. Bytes are counted from the
    allocator's level before the model is built. ValueError (one line) without a GPU."""
    dev = resolve_device("cuda")  # the runtime's rule: one line, no traceback, without a GPU
    cm = torch.cuda.memory
    with _FakeWorld(s.world, s.ep, "cuda") as w:
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(dev)
        base_reserved = torch.cuda.memory_reserved(dev)
        with torch.device(dev):
            model = build_stack(s, w.ep_group)
        _shard(model, s, w)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=foreach)
        x = torch.randn(s.batch, s.seq, s.d_model, device=dev)
        model(x).float().sum().backward()  # step 1: creates Adam's state
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        cm._record_memory_history(max_entries=200_000)
        try:
            out = model(x)
            fwd = torch.cuda.memory_allocated(dev) - base
            out.float().sum().backward()
            bwd = torch.cuda.memory_allocated(dev) - base
            opt.step()
            torch.cuda.synchronize(dev)
            step = torch.cuda.memory_allocated(dev) - base
            snap = cm._snapshot()
        finally:
            cm._record_memory_history(enabled=None)
        stats = torch.cuda.memory_stats(dev)
        out_bytes = out.numel() * out.element_size()
        name = torch.cuda.get_device_name(dev)
    peak = stats["allocated_bytes.all.peak"] - base
    return TrackedMemory(
        after_forward={"Total": fwd},
        after_backward={"Total": bwd},
        after_step={"Total": step},
        at_peak={"allocated": peak, "reserved": stats["reserved_bytes.all.peak"] - base_reserved},
        category_peaks={},
        peak=peak,
        output=out_bytes,
        how=f"measured: CUDA caching allocator (_record_memory_history / _snapshot), torch "
        f"{torch.__version__}, {name}, fake process group of {s.world} ranks (rank 0)",
        extra={
            "reserved_in_snapshot": float(sum(seg["total_size"] for seg in snap["segments"])),
            "trace_events": float(sum(len(t) for t in snap.get("device_traces", []))),
        },
    )


def measure(s: StackSpec, foreach: bool = False) -> TrackedMemory:
    """``measure_cuda`` where a GPU is present, ``measure_fake`` otherwise."""
    return measure_cuda(s, foreach) if cuda_count() else measure_fake(s, foreach)


# --------------------------------------------------------------------------------------------
# Side by side
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One planner term (or sum of terms) beside the tracker's bytes it stands for."""

    term: str
    ours: float
    tracker: float
    tracker_is: str

    @property
    def rel(self) -> float:
        """(ours - tracker) / tracker."""
        return (self.ours - self.tracker) / self.tracker if self.tracker else float("inf")


def side_by_side(ours: StageMemory, got: TrackedMemory) -> list[Row]:
    """Our terms beside the tracker's categories (docs/memory-accounting.md): model state after
    the optimizer step; activations held at the end of the forward, less the model's output (the
    caller's tensor); ZeRO-3's gathered weights against the largest all-gather output + unsharded
    parameters; and the total against the step's peak, less the input batch."""
    a, p = got.after_step, got.category_peaks
    return [
        Row(
            "weights + grads + optimizer",
            ours.weights + ours.grads + ours.optimizer,
            a.get("SHARDED_PARAM", 0) + a.get("SHARDED_GRAD", 0) + a.get("OPT", 0),
            "SHARDED_PARAM + SHARDED_GRAD + OPT after the step",
        ),
        Row(
            "activations",
            ours.activations,
            got.after_forward.get("ACT", 0) - got.output,
            "ACT after the forward - the output",
        ),
        Row(
            "buffers",
            ours.buffers,
            p.get("gathered weights", 0),
            "max(UNSHARDED_PARAM + ALL_GATHER)",
        ),
        Row("total", ours.total, got.peak - got.at_peak.get("INP", 0), "peak - INP"),
    ]
