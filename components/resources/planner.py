"""PP x EP planner (Piper Sec. III-C and IV-C): enumerate, check Eq. 7-11, rank by estimated MFU.

For n nodes of g GPUs, every factorisation PP x EP = n g (Eq. 7) is considered:
  Eq. 8  EP | E                  (experts split evenly)
  Eq. 9  PP <= L                 (at least one layer per stage)
  Eq. 10 EP <= g N_h             (the EP group stays inside one switch group)
  Eq. 11 M_peak <= C_GPU         (Piper checks stage 0, the 1F1B worst case; we check every
                                  stage, since the last one also holds the output head and
                                  logits, and say which stage binds)
Structural violations (Eq. 8-10) are listed as rejected with the equation named; the others are
candidates, memory-feasible or not (with the binding memory term named). A candidate that only
fits with full activation checkpointing is marked so. Feasible candidates are ranked by the MFU
of components.resources.perf_model.estimate.

Batch: the global batch B (sequences) is fixed across candidates: each of the M micro-batches
gives every GPU of a stage B / (M EP) sequences. Default: 1 sequence per GPU per micro-batch and
M = alpha PP with alpha = 4 (Piper Table II), i.e. B = 4 n g.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moe_repro.components.resources.memory_model import MemoryOptions, StageMemory, all_stages
from moe_repro.components.resources.perf_model import Estimate, estimate
from moe_repro.components.network.platform import Platform
from moe_repro.components.model.zoo import MoEModel

GB = 1e9


@dataclass
class Candidate:
    pp: int
    ep: int
    feasible: bool
    why_not: str = ""
    checkpointing: bool = False
    micro_batch: float = 0.0
    micro_batches: int = 0
    peak_bytes: float = 0.0
    peak_stage: int = 0
    stage_bytes: list[float] = field(default_factory=list)
    binding_term: str = ""
    estimate: Estimate | None = None

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "estimate"}
        d["estimate"] = None if self.estimate is None else self.estimate.to_dict()
        return d


@dataclass
class Plan:
    model: str
    platform: str
    nodes: int
    gpus: int
    seq: int
    global_batch: int
    candidates: list[Candidate]  # satisfy Eq. 7-10; sorted: feasible by MFU, then infeasible
    rejected: list[dict]  # {"pp", "ep", "why_not"} for Eq. 8-10 violations
    assumptions: list[str]

    @property
    def best(self) -> Candidate | None:
        return next((c for c in self.candidates if c.feasible), None)

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "platform": self.platform,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "seq": self.seq,
            "global_batch": self.global_batch,
            "candidates": [c.to_dict() for c in self.candidates],
            "rejected": self.rejected,
            "assumptions": self.assumptions,
        }


def divisors(n: int) -> list[int]:
    """Divisors of n in increasing order, by trial division up to sqrt(n) (fast for any cluster)."""
    small, large = [], []
    x = 1
    while x * x <= n:
        if n % x == 0:
            small.append(x)
            if x != n // x:
                large.append(n // x)
        x += 1
    return small + large[::-1]


def memory_check(
    m: MoEModel,
    p: Platform,
    PP: int,
    EP: int,
    micro_batch: int,
    seq: int,
    M: int,
    opts: MemoryOptions,
    schedule: str = "1f1b",
) -> tuple[bool, list[StageMemory], str]:
    """(fits, stages, reason) with the largest term of the binding stage named when it does not
    (memory_model.all_stages: the memory model the parallelism planner uses)."""
    stages = all_stages(m, PP, EP, micro_batch, seq, M, schedule, opts)
    peak = max(stages, key=lambda s: s.total)
    if peak.total <= p.hbm_bytes:
        return True, stages, ""
    term = peak.binding_term()
    return (
        False,
        stages,
        (
            f"stage {peak.stage} needs {peak.total / GB:.1f} GB > {p.hbm_bytes / GB:g} GB HBM "
            f"(Eq. 11); largest term: {term} {getattr(peak, term) / GB:.1f} GB"
        ),
    )


def plan(
    m: MoEModel,
    p: Platform,
    nodes: int,
    seq: int = 4096,
    global_batch: int | None = None,
    micro_batches: int | None = None,
    alpha: int = 4,
    zero_stage: int = 0,
    flash: bool = True,
    allow_checkpointing: bool = True,
    causal: bool = False,
    schedule: str = "1f1b",
    max_ep: int | None = None,
    layout: tuple[int, int] | None = None,
) -> Plan:
    """Enumerate and rank PP x EP layouts (module docstring). ``layout=(PP, EP)`` evaluates that one
    layout only and raises ValueError if it breaks Eq. 7-9 (Eq. 10 is reported, not raised, so a
    user can ask what a wider EP group would cost)."""
    for name, v in (("nodes", nodes), ("seq", seq), ("alpha", alpha)):
        if v is None or v <= 0:
            raise ValueError(f"{name} must be positive, got {v}")
    if global_batch is not None and global_batch <= 0:
        raise ValueError(f"global batch must be positive, got {global_batch}")
    if micro_batches is not None and micro_batches <= 0:
        raise ValueError(f"micro-batches must be positive, got {micro_batches}")
    G = nodes * p.gpus_per_node
    if layout is not None:
        lp, le = layout
        if lp is None or le is None or lp <= 0 or le <= 0:
            raise ValueError(f"pp and ep must both be given and positive, got pp={lp} ep={le}")
        if lp * le != G:
            raise ValueError(
                f"PP x EP = {lp} x {le} = {lp * le} is not the {G} GPUs of {nodes} nodes (Eq. 7)"
            )
        if m.n_experts % le:
            raise ValueError(f"EP={le} does not divide the expert count E={m.n_experts} (Eq. 8)")
        if lp > m.layers:
            raise ValueError(f"PP={lp} exceeds the layer count L={m.layers} (Eq. 9)")
    B = global_batch if global_batch is not None else alpha * G
    ep_limit = max_ep if max_ep is not None else p.gpus_per_node * p.switch_group_nodes
    candidates, rejected = [], []
    for EP in divisors(G) if layout is None else [layout[1]]:
        PP = G // EP
        why = []
        if m.n_experts % EP:
            why.append(f"EP={EP} does not divide E={m.n_experts} (Eq. 8)")
        if PP > m.layers:
            why.append(f"PP={PP} > L={m.layers} layers (Eq. 9)")
        if EP > ep_limit:
            why.append(f"EP={EP} > g N_h = {ep_limit} (Eq. 10: EP group beyond one switch group)")
        if why:
            rejected.append({"pp": PP, "ep": EP, "why_not": "; ".join(why)})
            continue
        M = micro_batches if micro_batches is not None else alpha * PP
        micro = B / (M * EP)
        if micro < 1 or micro != int(micro):
            candidates.append(
                Candidate(
                    PP,
                    EP,
                    False,
                    micro_batches=M,
                    micro_batch=micro,
                    why_not=f"global batch {B} is not a multiple of M x EP = {M * EP} "
                    "(each GPU needs a whole number of sequences per micro-batch)",
                )
            )
            continue
        c = None
        for ckpt in (False, True) if allow_checkpointing else (False,):
            opts = MemoryOptions(
                flash_attention=flash,
                checkpointing=ckpt,
                zero_stage=zero_stage,
                overhead_bytes=p.overhead_bytes,
            )
            fits, stages, reason = memory_check(m, p, PP, EP, int(micro), seq, M, opts, schedule)
            peak = max(stages, key=lambda s: s.total)
            c = Candidate(
                PP,
                EP,
                fits,
                reason,
                ckpt,
                micro,
                M,
                peak.total,
                peak.stage,
                [s.total for s in stages],
                peak.binding_term(),
            )
            if fits:
                c.estimate = estimate(
                    m, p, PP, EP, micro, seq, M, checkpointing=ckpt, causal=causal
                )
                break
        assert c is not None  # the loop above runs at least once
        candidates.append(c)
    candidates.sort(
        key=lambda c: (not c.feasible, -(c.estimate.mfu if c.estimate else 0), c.peak_bytes)
    )
    assumptions = [
        f"global batch {B} sequences of {seq} tokens; M = {micro_batches or f'{alpha} x PP'} "
        f"micro-batches; {'1F1B' if schedule == '1f1b' else 'GPipe'} schedule",
        f"memory (memory_model.LayoutMemory, shared with the parallelism planner): 16 B/param "
        f"(bf16 weight+grad, fp32 master+Adam), ZeRO-{zero_stage} (attention and dense layers "
        f"sharded over the EP group), activations per formulas.moe_activation_terms_per_layer, "
        f"{'FlashAttention' if flash else 'materialised attention scores'}, framework overhead "
        f"{p.overhead_bytes / GB:g} GB, embeddings on stage 0, output head + fp32 logits on the last stage",
        f"compute (time_model, shared with the parallelism planner): each GEMM at its own shape, a roofline "
        f"of the achievable {p.gemm_flops / 1e12:g} TFLOPS"
        + (f" x tile and wave quantization on {p.sm_count} SMs" if p.sm_count else "")
        + f" and HBM {p.hbm_bytes_per_s / GB:g} GB/s; attention "
        f"{p.attention_flops / 1e12:g} TFLOPS; non-GEMM kernels at HBM bandwidth; MFU against "
        f"{p.peak_flops / 1e12:g} TFLOPS peak",
        f"communication: intra-node all-to-all {p.intra_node_a2a_bytes_per_s / GB:g} GB/s per GPU, "
        f"inter-node {p.nic_bytes_per_s_per_gpu / GB:g} GB/s per GPU x efficiency {p.network_efficiency:g}; "
        "balanced routing; no compute/communication overlap; 4 all-to-alls per MoE layer and step, 6 with "
        "activation checkpointing (the recomputed forward re-runs dispatch and combine)",
        f"FLOPs: 6 x active matmul params + attention {'with' if causal else 'without'} causal halving",
    ]
    return Plan(m.key, p.name, nodes, G, seq, B, candidates, rejected, assumptions)
