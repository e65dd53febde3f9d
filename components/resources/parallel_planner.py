"""Parallelism planner: DP (ZeRO 0-3) x TP (+SP) x PP (1F1B / interleaved) x EP x ETP x CP x recompute.

Searches the layouts people combine in Megatron-LM / Megatron-core, DeepSpeed and FSDP for a zoo
model on ``nodes`` nodes of a platform profile, checks each against the memory of one GPU, and
ranks the ones that fit by a predicted step time. Every number comes from
``components.resources.formulas`` (parameters, FLOPs, activation bytes, ZeRO model-state bytes,
communication bytes) and the platform profile (HBM, achievable GEMM/attention rates, NVLink and
NIC bandwidths); the rules that join them are repeated, with the numbers used, in
``ParallelPlan.assumptions``. Piper's PP x EP planner (``planner.py``, Eq. 7-11) searches its
own layouts with the same memory model (memory_model.LayoutMemory) and time model.

The rules, in short:
  mesh         Megatron-core's: DP x TP x PP x CP for dense layers, re-folded as ETP x EP x
               EDP x PP for MoE layers ("MoE parallel folding", Liu et al. 2025);
  constraints  TP within a node and dividing heads and split widths, PP <= layers, EP divides
               the experts, CP for long sequences, the global batch divides into DP x mb x M;
  memory       memory_model.LayoutMemory: model state per ZeRO stage and precision,
               activations per stage and schedule (1F1B / interleaved, Narayanan et al. 2021),
               full or block recompute, buffers; every stage checked, the binding one reported;
  step time    components.resources.time_model (per-GEMM rooflines, attention, HBM-bound
               kernels), TP/SP, EP, ETP and PP traffic exposed, DP and CP overlapped where the
               frameworks overlap them, the (PP - 1) / VPP bubble; MFU = model FLOPs / (GPUs x
               peak x step time).

Why: a layout's feasibility and speed are decided by memory per GPU and exposed communication,
which the frameworks' own rules fix; stating those rules once lets the plan be checked against
published runs (reproductions/validation.py). Every rule, with its source in Megatron-core,
DeepSpeed or FSDP: see docs/planner.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from moe_repro.components.model.params import param_counts
from moe_repro.components.model.pipeline_split import stage_sizes
from moe_repro.components.model.zoo import MoEModel
from moe_repro.components.network.platform import Platform
from moe_repro.components.resources import ep_time as E
from moe_repro.components.resources import formulas as F
from moe_repro.components.resources import memory_terms as MT
from moe_repro.components.resources.layout_time import (
    Layout,
    LayoutView,
    PlanContext,
    dp_time,
    layout_view,
    slot_time,
    time_assumptions,
)
from moe_repro.components.resources.memory_model import (
    ALL_LAYERS,
    LayerMemory,
    Stage,
    split_stages,
)
from moe_repro.components.resources.planner import divisors
from moe_repro.components.resources import time_model as T

GiB = 2**30
RECOMPUTE = ("none", "selective", "block", "full")  # + "full:N" (block method, N fixed)
ZERO_STAGES = (0, 1, 2, 3)
CP_FROM_SEQ = 16384  # context parallelism is offered from this sequence length on
CP_DEGREES = (2, 4, 8, 16, 32)
MICRO_BATCHES = (1, 2, 4, 8)  # sequences per micro-batch tried when M is not fixed
VPP_DEGREES = (2, 3, 4, 6, 8)
DEFAULT_TOKENS_PER_STEP = 2**22  # ~4M tokens: GPT-3 (3.2M) and Llama 3 (4M-16M) scale


# ============================================================================================
# Results
# ============================================================================================


@dataclass
class ParallelCandidate:
    dp: int
    tp: int
    sp: bool
    pp: int
    vpp: int
    ep: int
    cp: int
    zero: int
    recompute: str
    micro_batch: int
    micro_batches: int
    memory: dict[str, float] = field(default_factory=dict)  # bytes on the binding stage
    memory_stage: int = 0
    step_s: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)  # seconds; they add up to step_s
    comm_bytes: dict[str, float] = field(
        default_factory=dict
    )  # sent per GPU per step, by dimension
    mfu: float = 0.0
    tflops_per_gpu: float = 0.0
    feasible: bool = True
    why_not: str = ""
    layers_per_stage: str = ""
    etp: int = 1  # expert tensor parallelism (Megatron-core --expert-tensor-parallel-size)
    recompute_layers: int = (
        0  # full recompute: layers per stage (per model chunk) recomputed, else 0
    )
    chunk_layers: int = 0  # layers of the largest model chunk (a stage when VPP = 1)
    # layers of the first / last pipeline stage of an uneven split (Megatron-LM's
    # --decoder-first/last-pipeline-num-layers); 0: the even split
    first_stage_layers: int = 0
    last_stage_layers: int = 0
    gemm_precision: str = "bf16"

    @property
    def recompute_note(self) -> str:
        """The recompute mode for a table: none, selective, full, or "full 12/24 layers"."""
        if self.recompute.startswith("full:"):
            return f"full {self.recompute_layers}/{self.chunk_layers} layers"
        return self.recompute

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ParallelPlan:
    model: str
    platform: str
    nodes: int
    gpus_per_node: int
    gpus: int
    seq: int
    global_batch: int
    precision: str
    params: dict[str, int]  # total, active
    flops_per_token: dict[str, float]  # forward, training (model FLOPs, causal attention)
    hbm_bytes: float
    candidates: list[ParallelCandidate]  # feasible by step time, then the closest misses
    rejected: list[dict]  # {"reason", "count"}, most frequent first
    assumptions: list[str]
    search: dict = field(default_factory=dict)  # layouts, evaluated, seconds

    @property
    def feasible(self) -> list[ParallelCandidate]:
        return [c for c in self.candidates if c.feasible]

    @property
    def best(self) -> ParallelCandidate | None:
        return next((c for c in self.candidates if c.feasible), None)

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "candidates"}
        d["candidates"] = [c.to_dict() for c in self.candidates]
        return d


# ============================================================================================
# Layer notes
# ============================================================================================


def _layer_note(m: MoEModel, pp: int, v: int, first: int = 0, last: int = 0) -> str:
    L = m.layers
    if pp == 1:
        return f"{L}"
    if first or last:
        sizes = stage_sizes(L, pp, first or None, last or None)
        mid = sizes[1:-1]
        middle = "".join(f" + {n} x {mid.count(n)}" for n in sorted(set(mid), reverse=True))
        chunks = f" ({v} chunks per stage)" if v > 1 else ""
        return f"{sizes[0]}{middle} + {sizes[-1]}{chunks}"
    if v > 1:
        return f"{L // (pp * v)} x {pp * v} chunks"
    base, extra = divmod(L, pp)
    return f"{base}" if not extra else f"{base + 1} x {extra} + {base} x {pp - extra}"


# ============================================================================================
# The search
# ============================================================================================


class _Rejections:
    """Reasons grouped by their text, with counts; memory reasons also keep the smallest need."""

    def __init__(self):
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}
        self.memory: dict[tuple, list] = {}  # (zero, term) -> [count, min bytes, candidate]

    def add(self, reason: str, example: str = "", n: int = 1) -> None:
        """``reason`` groups; ``example`` (the first one seen is kept) names one case of it."""
        self.counts[reason] = self.counts.get(reason, 0) + n
        if example and reason not in self.examples:
            self.examples[reason] = example

    def add_memory(self, zero: int, term: str, need: float, make) -> None:
        """``make()`` builds the candidate; called only for the closest miss so far."""
        g = self.memory.setdefault((zero, term), [0, math.inf, None])
        g[0] += 1
        if need < g[1]:
            g[1], g[2] = need, make

    def lines(self, hbm: float) -> list[dict]:
        out: list[dict] = [
            {
                "reason": r + (f" (e.g. {self.examples[r]})" if r in self.examples else ""),
                "count": n,
            }
            for r, n in self.counts.items()
        ]
        for (zero, term), (n, need, _) in sorted(self.memory.items()):
            out.append(
                {
                    "reason": f"ZeRO-{zero} memory {math.ceil(need / GiB * 10) / 10:.1f} GiB or more > "
                    f"{hbm / GiB:.1f} GiB HBM usable (largest term: {term})",
                    "count": n,
                }
            )
        out.sort(key=lambda d: -d["count"])
        return out

    def closest_misses(self) -> list[ParallelCandidate]:
        return [g[2]() for _, g in sorted(self.memory.items()) if g[2] is not None]


def _options(name: str, fixed: int | None, free: list[int]) -> list[int]:
    if fixed is None:
        return free
    if fixed <= 0:
        raise ValueError(f"{name} must be positive, got {fixed}")
    return [fixed]


def default_global_batch(seq: int, gpus: int) -> int:
    """About 4M tokens per step (2^22 / seq sequences), rounded up to a multiple of the GPUs so
    that every data-parallel degree divides it."""
    want = max(1, -(-DEFAULT_TOKENS_PER_STEP // seq))
    return gpus * max(1, -(-want // gpus))


@dataclass(frozen=True)
class PlanRequest:
    """What a parallelism plan is asked for: the model, the platform, the nodes, and every degree,
    mode or setting the user fixed (None: searched). :func:`plan` answers it; ``plan_parallel``
    takes the same fields as arguments."""

    model: MoEModel
    platform: Platform
    nodes: int
    seq: int = 4096
    global_batch: int | None = None
    precision: str = "bf16-adam"
    zero: tuple[int, ...] | None = None
    recompute: tuple[str, ...] | None = None
    tp: int | None = None
    pp: int | None = None
    ep: int | None = None
    cp: int | None = None
    vpp: int | None = None
    micro_batches: int | None = None
    sp: bool | None = None
    flash_attention: bool = True
    dropout: bool = False
    capacity_factor: float = 1.0
    etp: int | None = None
    overlap_dp: bool = True
    fused_grad_accumulation: bool = True
    overlap_tp: bool = True
    dispatcher: str = "alltoall"  # ep_time.DISPATCHERS
    overlap_ep: bool = False
    memory_kind: str | None = None  # memory_terms.KINDS; None: live tensors + profile overhead
    memory_margin: float = 0.0  # fraction of HBM the plan keeps free
    # memory_terms.MemorySettings fields of the framework that runs the plan (framework, loss,
    # optimizer, expandable_segments, mlp, selective); empty: the defaults (FSDP2 at ZeRO-3,
    # Megatron-core otherwise)
    memory_settings: tuple[tuple[str, Any], ...] = ()
    first_stage_layers: int | None = None  # Megatron-LM --decoder-first-pipeline-num-layers
    last_stage_layers: int | None = None  # Megatron-LM --decoder-last-pipeline-num-layers
    gemm_precision: str = "bf16"  # time_model.GEMM_PRECISIONS: the linear layers' GEMM rate

    def checked(self) -> tuple[F.Precision, tuple[int, ...], tuple[tuple[str, int], ...]]:
        """(precision preset, ZeRO stages, recompute modes) of a well-formed request; ValueError
        names the first malformed field (non-positive number, unknown preset, stage or mode)."""
        checked: tuple[tuple[str, float | None], ...] = (
            ("nodes", self.nodes),
            ("seq", self.seq),
            ("capacity_factor", self.capacity_factor),
        )
        for name, val in checked:
            if val is None or val <= 0:
                raise ValueError(f"{name} must be positive, got {val}")
        for name, val in (
            ("global batch", self.global_batch),
            ("micro-batches", self.micro_batches),
            ("first stage layers", self.first_stage_layers),
            ("last stage layers", self.last_stage_layers),
        ):
            if val is not None and val <= 0:
                raise ValueError(f"{name} must be positive, got {val}")
        if self.dispatcher not in E.DISPATCHERS:
            raise ValueError(
                f"dispatcher must be one of {', '.join(E.DISPATCHERS)}, got {self.dispatcher!r}"
            )
        T.gemm_rate_platform(self.platform, self.gemm_precision)  # ValueError names a bad one
        if not 0 <= self.memory_margin < 1:
            raise ValueError(f"memory margin must be in [0, 1), got {self.memory_margin}")
        MT.check_kind(self.memory_kind)
        settable = MT.MemorySettings.__dataclass_fields__.keys() - {"facts", "dispatcher"}
        unknown = [k for k, _ in self.memory_settings if k not in settable]
        if unknown:
            raise ValueError(
                f"unknown memory setting(s) {', '.join(unknown)}; known: {', '.join(sorted(settable))}"
            )
        prec = F.precision(self.precision)
        zeros = tuple(ZERO_STAGES if self.zero is None else self.zero)
        for z in zeros:
            if z not in ZERO_STAGES:
                raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {z}")
        modes = parse_recompute(RECOMPUTE if self.recompute is None else self.recompute)
        return prec, zeros, modes


def plan_parallel(
    m: MoEModel,
    p: Platform,
    nodes: int,
    seq: int = 4096,
    global_batch: int | None = None,
    precision: str = "bf16-adam",
    zero: tuple[int, ...] | None = None,
    recompute: tuple[str, ...] | None = None,
    tp: int | None = None,
    pp: int | None = None,
    ep: int | None = None,
    cp: int | None = None,
    vpp: int | None = None,
    micro_batches: int | None = None,
    sp: bool | None = None,
    flash_attention: bool = True,
    dropout: bool = False,
    capacity_factor: float = 1.0,
    etp: int | None = None,
    overlap_dp: bool = True,
    fused_grad_accumulation: bool = True,
    overlap_tp: bool = True,
    dispatcher: str = "alltoall",
    overlap_ep: bool = False,
    memory_kind: str | None = None,
    memory_margin: float = 0.0,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
    gemm_precision: str = "bf16",
    memory_settings: dict | None = None,
) -> ParallelPlan:
    """Search and rank (module docstring). ``zero`` / ``recompute`` restrict the stages / modes
    tried (``recompute`` also takes ``"full:N"``: Megatron's block method with N fixed; ``"block"``
    searches the smallest N that fits); ``tp``, ``pp``, ``ep``, ``cp``, ``vpp``, ``etp`` fix a degree (a fixed degree that breaks a rule
    is reported among the rejected, not raised); ``sp`` fixes sequence parallelism for TP > 1;
    ``micro_batches`` fixes M; ``flash_attention`` (default) keeps no attention scores;
    ``dropout`` adds Korthikanti's dropout masks; ``capacity_factor`` scales routed copies and
    all-to-all bytes; ``overlap_dp=False``: ZeRO 0/1 reduce (and gather) once per step after the
    last backward, exposed (Megatron-LM before --overlap-grad-reduce: train_step calls
    allreduce_gradients() after forward_backward_func returns); ``fused_grad_accumulation=False``:
    every micro-batch's weight gradients are added to the held gradients in a separate
    HBM-bound pass (Megatron-LM's DDP hook ``main_grad.add_(grad)`` without
    --gradient-accumulation-fusion; PyTorch's AccumulateGrad); ``overlap_tp=False``: the
    backward's TP all-reduces are exposed too (Megatron-LM before its asynchronous tensor-parallel
    all-reduce of 2021-09-02); ``dispatcher``: the EP token dispatcher whose dispatch time the
    EP term takes (ep_time.DISPATCHERS; default Megatron-core's alltoall); ``overlap_ep``: the EP
    time hides behind the stage's compute of another micro-batch and only its excess is exposed
    (Megatron-core --overlap-moe-expert-parallel-comm, DualPipe; default exposed);
    ``first_stage_layers`` / ``last_stage_layers`` fix the layers of the first / last pipeline
    stage (Megatron-LM's --decoder-first/last-pipeline-num-layers; the stages between share the
    rest evenly, :func:`split_options`); ``gemm_precision`` ``"fp8"`` runs the linear layers'
    GEMMs at the profile's FP8 rate (time_model.gemm_rate_platform); ``memory_settings``: the
    memory_terms.MemorySettings fields of the framework that will run the plan (how it
    allocates: its optimizer, loss, SwiGLU form, selective checkpointing, allocator settings).
    ValueError for malformed input (non-positive numbers, unknown preset,
    stage or mode). The arguments are a :class:`PlanRequest`'s fields; :func:`plan` answers it."""
    return plan(
        PlanRequest(
            m,
            p,
            nodes,
            seq=seq,
            global_batch=global_batch,
            precision=precision,
            zero=zero,
            recompute=recompute,
            tp=tp,
            pp=pp,
            ep=ep,
            cp=cp,
            vpp=vpp,
            micro_batches=micro_batches,
            sp=sp,
            flash_attention=flash_attention,
            dropout=dropout,
            capacity_factor=capacity_factor,
            etp=etp,
            overlap_dp=overlap_dp,
            fused_grad_accumulation=fused_grad_accumulation,
            overlap_tp=overlap_tp,
            dispatcher=dispatcher,
            overlap_ep=overlap_ep,
            memory_kind=memory_kind,
            memory_margin=memory_margin,
            first_stage_layers=first_stage_layers,
            last_stage_layers=last_stage_layers,
            gemm_precision=gemm_precision,
            memory_settings=tuple(sorted((memory_settings or {}).items())),
        )
    )


def plan(req: PlanRequest) -> ParallelPlan:
    """The plan for ``req``: check the request, build the context (shapes, rates, bandwidths),
    filter each degree on its own (:func:`_degree_options`), search the layouts they combine into
    (:func:`_search`, each evaluated for memory and time by ``_evaluate``), rank what fits."""
    t0 = time.perf_counter()
    m, p = req.model, req.platform
    prec, zeros, modes = req.checked()
    ctx = _context(req, prec, zeros, modes)
    if req.vpp is not None and req.vpp <= 0:
        raise ValueError(f"vpp must be positive, got {req.vpp}")
    rej = _Rejections()
    degrees = _degree_options(req, ctx, rej)
    memory = LayerMemory(
        m,
        req.seq,
        prec,
        req.flash_attention,
        req.dropout,
        req.capacity_factor,
        req.memory_kind,
        MT.MemorySettings(
            facts=MT.device_facts(p), dispatcher=req.dispatcher, **dict(req.memory_settings)
        ),
    )
    kept, layouts, evaluated = _search(req, ctx, degrees, memory, rej)

    # ties (to 4 significant digits) go to less communication, then less memory
    kept.sort(
        key=lambda x: (float(f"{x.step_s:.4g}"), sum(x.comm_bytes.values()), x.memory["total"])
    )
    misses = sorted(rej.closest_misses(), key=lambda x: x.memory.get("total", 0.0))
    assumptions = _assumptions(req, ctx)
    pc = param_counts(m)
    return ParallelPlan(
        model=m.key,
        platform=p.name,
        nodes=req.nodes,
        gpus_per_node=ctx.g,
        gpus=ctx.G,
        seq=req.seq,
        global_batch=ctx.B,
        precision=req.precision if isinstance(req.precision, str) else "custom",
        params={"total": pc.total, "active": pc.active},
        flops_per_token={
            "forward": F.forward_flops_per_token(m, req.seq, "causal"),
            "training": F.train_flops_per_token(m, req.seq, "causal", "none"),
            "training_6n": 6.0 * F.parameters(m)["matmul_active"],
        },
        hbm_bytes=ctx.hbm,
        candidates=kept + misses,
        rejected=rej.lines(ctx.hbm),
        assumptions=assumptions,
        search={
            "layouts": layouts,
            "evaluated": evaluated,
            "feasible": len(kept),
            "seconds": time.perf_counter() - t0,
        },
    )


def _context(req: PlanRequest, prec: F.Precision, zeros: tuple, modes: tuple) -> "PlanContext":
    """What every layout's evaluation reads: the GPUs, the batch, the layer shapes, the platform's
    rates, bandwidths and latencies."""
    m, p, seq = req.model, req.platform, req.seq
    g = p.gpus_per_node
    G = req.nodes * g
    B = req.global_batch if req.global_batch is not None else default_global_batch(seq, G)
    peak_given = "peak_tflops" in p.raw.get("gpu", {}) and p.peak_flops > 0
    peak = p.peak_flops if peak_given else p.gemm_flops
    V = m.vocab or 0
    d = m.d_model
    model_flops_step = F.train_flops_per_token(m, seq, "causal", "none") * B * seq
    return PlanContext(
        m,
        T.gemm_rate_platform(p, req.gemm_precision),
        seq,
        G,
        g,
        B,
        prec,
        zeros,
        modes,
        req.flash_attention,
        V,
        d,
        F.kv_width(m),
        peak,
        model_flops_step,
        p.hbm_bytes * (1 - req.memory_margin),
        req.capacity_factor,
        m.d_ffn,
        req.dropout,
        req.overlap_dp,
        req.fused_grad_accumulation,
        req.overlap_tp,
        req.dispatcher,
        m.key,
        req.overlap_ep,
        req.gemm_precision,
    )


@dataclass
class _Degrees:
    """Each degree's options on its own (a fixed one that breaks a rule is left out, with its
    reason among the rejected); ``etp_ok`` checks an ETP per layout (its default follows TP)."""

    tps: list[int]
    cps: list[int]
    eps: list[int]
    pps_fixed: list[int] | None
    etps_fixed: list[int] | None
    etp_ok: Callable[..., bool]


def _degree_options(req: PlanRequest, ctx: "PlanContext", rej: _Rejections) -> _Degrees:
    """The constraints of the module docstring that a degree meets or breaks alone."""
    m, seq, G, g = req.model, req.seq, ctx.G, ctx.g
    L, E = m.layers, m.n_experts
    is_moe = m.n_moe_layers > 0
    H = m.heads
    kv = m.n_kv_heads or H
    ffns = sorted(
        {
            f
            for f in (
                m.d_ffn_dense if m.n_dense_layers else None,
                (m.d_ffn_shared or m.d_ffn) if m.n_shared and is_moe else None,
                m.d_ffn_residual,
            )
            if f
        }
    )

    def tp_ok(t: int) -> bool:
        why = []
        if t > g:
            why.append(f"TP {t} > {g} GPUs per node")
        if H % t:
            why.append(f"TP {t} does not divide {H} heads")
        elif kv % t:
            why.append(f"TP {t} does not divide {kv} KV heads")
        why += [f"TP {t} does not divide FFN width {f}" for f in ffns if f % t][:1]
        for w_ in why:
            rej.add(w_)
        return not why

    def cp_ok(c: int) -> bool:
        if c > 1 and seq % (2 * c):
            rej.add(f"CP {c}: sequence {seq} is not divisible by 2 x CP (load-balanced causal CP)")
            return False
        return True

    def ep_ok(e: int) -> bool:
        if e > 1 and not is_moe:
            rej.add(f"EP {e} on a dense model ({m.key} has no experts)")
            return False
        if E % e:
            rej.add(f"EP {e} does not divide {E} experts")
            return False
        return True

    def pp_ok(q: int) -> bool:  # asked only of a PP degree the user fixed
        if q > L:
            rej.add(f"PP {q} > {L} layers")
            return False
        if G % q:
            rej.add(f"PP {q} does not divide the {G} GPUs")
            return False
        return True

    def etp_ok(x: int, record: bool = True) -> bool:
        why = ""
        if x > 1 and not is_moe:
            why = f"ETP {x} on a dense model ({m.key} has no experts)"
        elif x > g or g % x:
            why = f"ETP {x} does not divide the {g} GPUs per node"
        elif is_moe and m.d_ffn % x:
            why = f"ETP {x} does not divide the expert FFN width {m.d_ffn}"
        if why and record:
            rej.add(why)
        return not why

    long_seq = seq >= CP_FROM_SEQ
    etps_fixed = None if req.etp is None else [x for x in _options("etp", req.etp, []) if etp_ok(x)]
    tps = [t for t in _options("tp", req.tp, divisors(g)) if tp_ok(t)]
    cps = [
        c
        for c in _options(
            "cp", req.cp, [1] + ([c for c in CP_DEGREES if G % c == 0] if long_seq else [])
        )
        if cp_ok(c)
    ]
    eps = [e for e in _options("ep", req.ep, divisors(E) if is_moe else [1]) if ep_ok(e)]
    pps_fixed = None if req.pp is None else [q for q in _options("pp", req.pp, []) if pp_ok(q)]
    if req.vpp is not None and req.vpp > 1 and req.pp == 1:
        rej.add(f"VPP {req.vpp} needs PP > 1")
    return _Degrees(tps, cps, eps, pps_fixed, etps_fixed, etp_ok)


def _search(
    req: PlanRequest, ctx: "PlanContext", deg: _Degrees, memory: LayerMemory, rej: _Rejections
) -> tuple[list[ParallelCandidate], int, int]:
    """Every layout the degree options combine into (:func:`_layouts`), each evaluated for every
    ZeRO stage and recompute mode; returns (the candidates that fit, layouts, evaluations)."""
    kept: list[ParallelCandidate] = []
    layouts = evaluated = 0
    for lay, stages in _layouts(req, ctx, deg, rej):
        layouts += 1
        evaluated += _evaluate(lay, stages, ctx, memory, rej, kept)
    return kept, layouts, evaluated


def _layouts(
    req: PlanRequest, ctx: "PlanContext", deg: _Degrees, rej: _Rejections
) -> Iterator[tuple[Layout, list[Stage]]]:
    """The layouts (CP, TP, PP, VPP, EP x ETP, micro-batch, SP) the degree options combine into,
    each with its representative pipeline stages; a combination that breaks a rule is counted
    among the rejected."""
    m, G = req.model, ctx.G
    stage_cache: dict[tuple, list[Stage]] = {}
    for c in deg.cps:
        for t in deg.tps:
            if G % (t * c):
                rej.add(f"TP x PP x CP does not divide the {G} GPUs", f"TP {t} x CP {c}")
                continue
            rest = G // (t * c)
            pps = (
                deg.pps_fixed
                if deg.pps_fixed is not None
                else [x for x in range(1, min(m.layers, rest) + 1) if rest % x == 0]
            )
            for q in pps:
                if rest % q:
                    rej.add(
                        f"TP x PP x CP does not divide the {G} GPUs", f"TP {t} x PP {q} x CP {c}"
                    )
                    continue
                dp = rest // q
                for v, first, last in split_options(req, q, rej):
                    key = (q, v, first, last)
                    if key not in stage_cache:
                        stage_cache[key] = split_stages(m, q, v, first, last)
                    for e, et in _expert_options(req, deg, t, dp, c, rej):
                        for mb, M in _micro_batch_options(req, ctx, dp, q, v, rej):
                            for s_p in _sp_options(req, t, rej):
                                lay = Layout(t, s_p, q, v, c, e, dp, mb, M, et, first, last)
                                yield lay, stage_cache[key]


def ends_split(L: int, pp: int, v: int) -> tuple[int, int] | None:
    """The uneven split tried when L layers do not fill PP x VPP equal chunks: the middle stages
    hold ceil(L / (PP x VPP)) layers per chunk, the first and the last stage share the rest (the
    last, which also holds the output head, the smaller half), as Megatron-LM's
    --decoder-first/last-pipeline-num-layers express it. (first, last), or None where the rest
    leaves an end stage empty. Equal to the even split when the chunks divide."""
    if pp < 2:
        return None
    middle = -(-L // (pp * v)) * v
    rest = L - (pp - 2) * middle
    last = rest // 2
    first = rest - last
    return (first, last) if last >= 1 else None


def split_options(req: PlanRequest, q: int, rej: _Rejections) -> list[tuple[int, int, int]]:
    """(VPP, first-stage layers, last-stage layers) for PP = q; 0 layers: the even split.
    Fixed first/last (the request's): kept where they leave every stage a layer (and VPP 1
    unless the model chunks are asked too). Otherwise VPP 1 with the even split, and (unless
    VPP is fixed) every VPP_DEGREES value: the even split where PP x VPP chunks divide the
    layers (Megatron-core's interleaving), else :func:`ends_split`."""
    L, vpp = req.model.layers, req.vpp
    fixed = req.first_stage_layers is not None or req.last_stage_layers is not None
    if vpp is not None and vpp > 1 and q == 1:
        return []
    vs = [1, *(VPP_DEGREES if q > 1 else ())] if vpp is None else [vpp]
    if fixed:
        if q == 1:
            rej.add("first/last stage layers need PP > 1")
            return []
        first, last = req.first_stage_layers, req.last_stage_layers
        try:
            sizes = stage_sizes(L, q, first, last)
        except ValueError as e:
            rej.add(f"uneven split: {e}")
            return []
        # a searched VPP keeps a decoder layer in every chunk; a fixed one may leave a chunk
        # empty (Megatron's embedding- or loss-only chunk)
        return [(v, sizes[0], sizes[-1]) for v in vs if vpp is not None or min(sizes) >= v]
    out = []
    for v in vs:
        if v == 1 or L % (q * v) == 0:
            out.append((v, 0, 0))
            continue
        ends = ends_split(L, q, v)
        if ends is None:
            rej.add(f"VPP {v}: {L} layers leave an end stage empty at PP {q}")
            continue
        out.append((v, *ends))
    return out


def _expert_options(
    req: PlanRequest, deg: _Degrees, t: int, dp: int, c: int, rej: _Rejections
) -> Iterator[tuple[int, int]]:
    """(EP, ETP) pairs for a layout of TP t, DP dp, CP c: ETP fixed, or Megatron-core's default
    ETP = TP and ETP 1; EP x ETP must divide DP x CP x TP (a generator: rejections are
    counted in the order the layouts are met)."""
    if deg.etps_fixed is not None:
        ets = deg.etps_fixed
    elif req.model.n_moe_layers > 0:
        ets = [x for x in sorted({1, t}) if deg.etp_ok(x, record=False)]
    else:
        ets = [1]
    for e, et in ((e, et) for e in deg.eps for et in ets):
        if (dp * c * t) % (e * et):
            rej.add(
                "EP x ETP does not divide DP x CP x TP (Megatron-core "
                "initialize_model_parallel: world % (ETP x EP x PP) != 0)",
                f"EP {e} x ETP {et}, DP x CP x TP = {dp} x {c} x {t}",
            )
            continue
        yield e, et


def _micro_batch_options(
    req: PlanRequest, ctx: "PlanContext", dp: int, q: int, v: int, rej: _Rejections
) -> Iterator[tuple[int, int]]:
    """(sequences per micro-batch, micro-batches M) with DP x micro-batch x M = the global batch:
    M fixed, or each of MICRO_BATCHES that divides; interleaving needs M divisible by PP."""
    B, micro_batches = ctx.B, req.micro_batches
    if micro_batches is not None:
        if B % (dp * micro_batches):
            rej.add(
                f"global batch {B} is not divisible by DP x M (M = {micro_batches})", f"DP {dp}"
            )
            return
        mbs = [B // (dp * micro_batches)]
    else:
        mbs = [b for b in MICRO_BATCHES if B % (dp * b) == 0]
        if not mbs:
            rej.add(f"global batch {B} is not divisible by DP x micro-batch", f"DP {dp}")
            return
    for mb in mbs:
        M = B // (dp * mb)
        if v > 1 and M % q:
            rej.add(
                "VPP > 1 needs M divisible by PP (Megatron-core's interleaved schedule)",
                f"PP {q}, M {M}",
            )
            continue
        yield mb, M


def _sp_options(req: PlanRequest, t: int, rej: _Rejections) -> tuple[bool, ...]:
    """Sequence parallelism for TP t: none at TP 1; required on an MoE model (Megatron-core);
    both, or the fixed one, on a dense model."""
    sp = req.sp
    if t == 1:
        return (False,)
    if req.model.n_moe_layers > 0:
        if sp is False:
            rej.add("SP off with TP > 1 on an MoE model (Megatron-core requires SP)")
            return ()
        return (True,)
    return (False, True) if sp is None else (sp,)


def parse_recompute(modes) -> tuple[tuple[str, int], ...]:
    """Recompute modes as (kind, N), lightest first: none, selective, block (the smallest N that
    fits, searched), full:N (N fixed, ascending), full (every layer). ValueError names a bad one."""
    out = set()
    for r in modes:
        r = str(r).strip()
        if r in ("none", "selective"):
            out.add((r, 0))
        elif r == "block":
            out.add(("block", 0))
        elif r == "full":
            out.add(("full", ALL_LAYERS))
        elif r.startswith("full:") and r[5:].isdigit() and int(r[5:]) > 0:
            out.add(("full", int(r[5:])))
        else:
            raise ValueError(
                f"recompute must be one of {', '.join(RECOMPUTE)} or full:N (N > 0 layers "
                f"per stage), got {r!r}"
            )
    order = {"none": 0, "selective": 1, "block": 2, "full": 3}
    return tuple(sorted(out, key=lambda x: (order[x[0]], x[1])))


def _evaluate(
    lay: Layout,
    stages: list[Stage],
    ctx: PlanContext,
    memory: LayerMemory,
    rej: _Rejections,
    kept: list,
) -> int:
    """Evaluate one layout for every ZeRO stage; keep, per stage, the lightest recompute mode
    that fits (heavier ones fit too and are slower; memory_model.LayoutMemory.lightest_fit), or
    record the closest miss. Returns how many (zero, mode) were tried."""
    lv = layout_view(lay, stages, ctx, memory)
    tried = 0
    for z in ctx.zeros:
        fit, last_bad, n = lv.mem.lightest_fit(z, ctx.modes, ctx.hbm)
        tried += n
        if fit is not None:
            mode, i = fit
            kept.append(_candidate(ctx, lv, z, mode, i, feasible=True))
        elif last_bad is not None:
            _record_miss(ctx, lv, z, last_bad, rej)
    return tried


def _record_miss(
    ctx: PlanContext, lv: LayoutView, z: int, last_bad: tuple, rej: _Rejections
) -> None:
    """A layout that fits under no mode at ZeRO ``z``: counted under its largest memory term;
    its candidate is built only if it is the closest miss of its group."""
    mode, i, total = last_bad
    sm = lv.mem.stage(z, mode[0], mode[1], i)
    term = sm.binding_term()

    def miss() -> ParallelCandidate:
        cand = _candidate(ctx, lv, z, mode, i, feasible=False)
        cand.why_not = (
            f"stage {cand.memory_stage} needs {sm.total / GiB:.1f} GiB > "
            f"{ctx.hbm / GiB:.1f} GiB HBM usable (largest term: {term} "
            f"{getattr(sm, term) / GiB:.1f} GiB)"
        )
        return cand

    rej.add_memory(z, term, total, miss)


def _candidate(
    ctx: PlanContext, lv: LayoutView, z: int, mode: tuple[str, int], i: int, feasible: bool
) -> ParallelCandidate:
    """The layout at ZeRO ``z`` and recompute ``mode``, bound by stage index ``i``: its memory,
    step time by part, bytes sent and MFU."""
    lay, mem = lv.lay, lv.mem
    memory = mem.stage(z, mode[0], mode[1], i).to_dict()
    slot = slot_time(lv, ctx, *mode)
    grad_b, ag_b, dp_s = dp_time(ctx, lv, z, slot)
    _, bubble = T.pipeline_step(slot.total, lay.M, lay.q, lay.v)  # parts add up to busy + bubble
    # Gradient accumulation (unfused) and the optimizer step: HBM-bound passes over the state of
    # the stage that holds the most, stage r (module docstring, "Step time")
    state = memory["weights"] + memory["grads"] + memory["optimizer"]
    accumulate = (
        0.0
        if ctx.fused_grad_accumulation
        else lay.M * T.hbm_time(ctx.p, sum(mem.params[i]) * T.BYTES_PER_VALUE + 2 * memory["grads"])
    )
    M = lay.M
    parts = {
        "compute": M * slot.compute,
        "tp": M * slot.tp,
        "ep": M * slot.ep,
        "etp": M * slot.etp,
        "cp": M * slot.cp,
        "pp": M * slot.pp,
        "bubble": bubble,
        "dp": dp_s,
        "grad_accum": accumulate,
        "optimizer": T.hbm_time(ctx.p, 2 * state),
    }
    step = sum(parts.values())
    comm = {k: M * b for k, b in slot.bytes.items()}
    comm["dp"] = {0: grad_b, 1: grad_b + ag_b, 2: M * grad_b + ag_b, 3: M * (2 * ag_b + grad_b)}[z]
    label = lv.label(*mode)
    return ParallelCandidate(
        dp=lay.dp,
        tp=lay.t,
        sp=lay.sp,
        pp=lay.q,
        vpp=lay.v,
        ep=lay.e,
        cp=lay.c,
        zero=z,
        recompute=label[0],
        micro_batch=lay.mb,
        micro_batches=M,
        memory=memory,
        memory_stage=mem.stages[i].r,
        step_s=step,
        parts=parts,
        comm_bytes=comm,
        mfu=ctx.model_flops_step / (ctx.G * ctx.peak * step),
        tflops_per_gpu=ctx.model_flops_step / ctx.G / step / 1e12,
        feasible=feasible,
        layers_per_stage=_layer_note(ctx.m, lay.q, lay.v, lay.first, lay.last),
        etp=lay.et,
        recompute_layers=label[1],
        chunk_layers=mem.nmax,
        first_stage_layers=lay.first,
        last_stage_layers=lay.last,
        gemm_precision=ctx.gemm_precision,
    )


def _assumptions(req: PlanRequest, ctx: PlanContext) -> list[str]:
    """What the plan assumes, in words with the numbers used (``ParallelPlan.assumptions``):
    the batch and mesh, memory, compute, communication and search rules, then what was asked
    beyond the defaults."""
    return [
        *_layout_assumptions(req, ctx),
        *_memory_assumptions(req, ctx),
        *time_assumptions(req.platform, req.flash_attention),
        _ep_assumption(req, ctx),
        *_asked_assumptions(req),
    ]


def _layout_assumptions(req: PlanRequest, ctx: PlanContext) -> list[str]:
    B, G, seq, micro_batches = ctx.B, ctx.G, req.seq, req.micro_batches
    batch_given = req.global_batch is not None
    return [
        f"global batch {B} sequences of {seq} tokens ({B * seq / 1e6:.2f}M tokens"
        + ("" if batch_given else f"; default: ~4M tokens rounded up to a multiple of the {G} GPUs")
        + (
            "); micro-batches of 1, 2, 4 or 8 sequences"
            if micro_batches is None
            else f"); M = {micro_batches} micro-batches per step"
        ),
        "mesh: world = DP x TP x PP x CP, rank order tp-cp-dp-pp; MoE layers folded as ETP x EP x EDP "
        "(Megatron-core MoE parallel folding, initialize_model_parallel: world % (ETP x EP x PP) == 0): "
        "EP x ETP divides DP x CP x TP, experts data-parallel over EDP = DP x CP x TP / (EP x ETP); "
        "ETP (1 or TP unless fixed) divides the expert FFN width and the GPUs per node; MoE with "
        "TP > 1 uses sequence parallelism",
    ]


def _memory_assumptions(req: PlanRequest, ctx: PlanContext) -> list[str]:
    p, prec, preset = req.platform, ctx.prec, req.precision
    dropout, cf, flash = req.dropout, req.capacity_factor, req.flash_attention
    return [
        f"memory: precision {preset} ({prec.weights:g} B weights + {prec.grads:g} B grads + "
        f"{prec.master:g} B master + {prec.optimizer:g} B optimizer per parameter"
        f"{', optimizer on the host' if prec.offload_optimizer else ''}); ZeRO shards the dense "
        "state over DP x CP and the expert state over EDP (formulas.model_state_bytes); matrices "
        "split over TP, norms, MLA down-projections and the router replicated over TP; input "
        "embedding on stage 0, output head (a copy when tied and PP > 1) and final norm on the last",
        "activations: formulas.moe_activation_bytes_per_layer (Korthikanti 2022 with real widths), "
        f"bf16 values, {'dropout masks' if dropout else 'no dropout'}, capacity factor {cf:g}; "
        + (
            "FlashAttention: no attention scores kept, so 'none' stores what 'selective' stores (and "
            "selective only adds recompute); "
            if flash
            else "attention scores materialised; "
        )
        + "1F1B stage r holds min(PP - r, M) micro-batches, interleaved min(M v, 2(PP-r-1) + "
        "(v-1)PP + 1) chunks of L/(PP v) layers (Megatron-core warm-up + 1); + fp32 logits of one "
        "micro-batch / TP on the last stage; full recompute keeps each layer's input plus one "
        "layer's full working set; full:N (Megatron --recompute-method block --recompute-num-layers N) "
        "does so for the first N layers of each stage (model chunk) and keeps the rest whole; ETP "
        "multiplies the dispatched expert input by ETP (all-gathered); every stage is checked, the "
        "binding one is reported",
        (
            f"buffers: framework overhead {p.overhead_bytes / 1e9:g} GB from the profile"
            if req.memory_kind is None
            else f"memory kind {req.memory_kind}: the sourced terms of memory_terms in place of the "
            "profile's framework overhead (repro plan --explain-memory lists them)"
            + (
                "; the framework's settings: "
                + ", ".join(f"{k} {v}" for k, v in req.memory_settings)
                if req.memory_settings
                else ""
            )
        )
        + "; ZeRO-3 adds two layers' gathered bf16 weights (prefetch); HBM "
        f"{p.hbm_bytes / 1e9:g} GB = {p.hbm_bytes / GiB:.1f} GiB per GPU"
        + (
            f", {req.memory_margin:.0%} of it kept free: {ctx.hbm / GiB:.1f} GiB usable"
            if req.memory_margin
            else ""
        ),
    ]


def _ep_assumption(req: PlanRequest, ctx: PlanContext) -> str:
    """The EP term's dispatcher, routing and overlap (ep_time), in words."""
    groups = E.ROUTING_GROUPS.get(req.model.key)
    limit = (
        f"node-limited routing ({req.model.key}): a token picks {groups[1]} of {groups[0]} expert "
        "groups laid on the EP group's nodes, then its top-k experts uniformly inside them"
        if groups
        else "uniform top-k routing over the EP group"
    )
    return (
        f"EP: dispatcher {req.dispatcher} ({E.DISPATCHERS[req.dispatcher]}); one dispatch and one "
        f"combine per MoE layer forward, both again backward, each timed by ep_time (the network "
        f"simulator's EP model in closed form), {limit}; "
        + (
            "overlapped (asked): each micro-batch's EP time hides behind the stage's compute of "
            "another (Megatron-core --overlap-moe-expert-parallel-comm, DualPipe); only the excess "
            "is exposed, warm-up and cool-down not set apart"
            if req.overlap_ep
            else "exposed, not overlapped with compute (Megatron-core's default: "
            "--overlap-moe-expert-parallel-comm off)"
        )
    )


def _asked_assumptions(req: PlanRequest) -> list[str]:
    """The settings asked for beyond the defaults (CP not offered at a short sequence, DP or TP
    not overlapped, gradient accumulation not fused)."""
    out = []
    if req.seq < CP_FROM_SEQ and req.cp is None:
        out.append(f"CP not offered: sequence {req.seq} < {CP_FROM_SEQ} (pass --cp to ask)")
    if not req.overlap_dp:
        out.append(
            "DP (asked): ZeRO-0/1 gradient reduction and weight all-gather run once per step "
            "after the last backward, not overlapped (Megatron-LM before --overlap-grad-reduce)"
        )
    if not req.overlap_tp:
        out.append(
            "TP (asked): the backward's all-reduces are exposed, not overlapped with the "
            "weight-gradient GEMMs (Megatron-LM before --async-tensor-model-parallel-allreduce)"
        )
    if not req.fused_grad_accumulation:
        out.append(
            "gradient accumulation (asked): not fused into the weight-gradient GEMMs; each "
            "micro-batch reads its new gradients and reads and writes the held ones (Megatron-LM's "
            "main_grad.add_ hook without --gradient-accumulation-fusion)"
        )
    return out
