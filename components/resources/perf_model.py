"""Compute and communication model: FLOPs, all-to-all (Piper Eq. 6), P2P, bubble, MFU (Eq. 12).

FLOPs: training FLOPs per token = 6 N_active + attention (N_active: parameters in a matmul,
output head included, input embedding excluded, the same count as
components.resources.formulas); the causal mask is not halved unless ``causal=True``; model
FLOPs (the MFU numerator) never count recompute.
Communication, bytes per GPU: the dispatch and combine all-to-alls (Piper Eq. 6's lower bound,
as printed), pipeline P2P (Piper III-B2), and the gradient all-reduce of the weights replicated
over the EP group.
Time (an estimate, not a simulation): every second comes from components.resources.time_model;
4 all-to-alls per MoE layer (6 with full activation checkpointing, X-MoE Sec. 4.3) and P2P, not
overlapped; the step takes (M + PP - 1) slots of the slowest stage, plus the EP group's
gradient all-reduce.

Why: Piper's PP x EP planner (planner.py) needs one step-time estimate per candidate layout,
stated in the paper's own conventions (public tools count FLOPs differently, so the convention
is stated). The conventions and formulas in full: see docs/planner.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moe_repro.components.resources import formulas as F
from moe_repro.components.resources import time_model as T
from moe_repro.components.model.pipeline_split import stage_layers
from moe_repro.components.model.params import layer_params, param_counts
from moe_repro.components.network.platform import Platform
from moe_repro.components.model.zoo import MoEModel

ACT_BYTES = 2


def _positive(**values) -> None:
    for name, v in values.items():
        if v is None or v <= 0:
            raise ValueError(f"{name} must be positive, got {v}")


def head_dims(m: MoEModel) -> tuple[int, int]:
    """(d_qk, d_v) per head: MLA uses nope+rope for q/k and v_head_dim for v."""
    if m.attn_params == "mla" and m.mla is not None:
        return m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim, m.mla.v_head_dim
    hd = m.head_dim or m.d_model // m.heads
    return hd, hd


def attention_core_flops_per_token(m: MoEModel, seq: int, causal: bool = False) -> float:
    """Training FLOPs of QK^T and AV per token, all layers (see docs/planner.md)."""
    dqk, dv = head_dims(m)
    fwd = 2 * seq * m.heads * (dqk + dv) * m.layers
    return 3 * fwd * (0.5 if causal else 1.0)


def _mla_latent_norms(m: MoEModel) -> int:
    """MLA's two latent RMSNorm weights per layer (q_lora_rank + kv_lora_rank), which
    params.attention_params counts with the attention weights."""
    if m.attn_params != "mla" or m.mla is None:
        return 0
    return m.layers * ((m.mla.q_lora_rank or 0) + m.mla.kv_lora_rank)


def matmul_active_params(m: MoEModel) -> int:
    """Active weights that take part in a matmul: all active weights less the embeddings as
    params counts them (V d, or 2 V d untied), plus the output head's V d (tied or not), less
    the norm weights (docs/planner.md)."""
    pc = param_counts(m)
    head = m.vocab * m.d_model if m.vocab else 0
    return pc.active - pc.embeddings + head - pc.norms - _mla_latent_norms(m)


def train_flops_per_token(m: MoEModel, seq: int, causal: bool = False) -> float:
    """6 N_active + attention core (docs/planner.md)."""
    return 6 * matmul_active_params(m) + attention_core_flops_per_token(m, seq, causal)


# ---------------------------------------------------------------- communication


def alltoall_lower_bound_eq6(
    b: float, s: int, k: int, d: int, EP: int, nic_bytes_per_s: float
) -> float:
    """Piper Eq. 6 as printed: T_a2a >= 4 b s k d / (EP B_NIC) seconds (dispatch + combine, fp16)."""
    _positive(EP=EP, nic_bytes_per_s=nic_bytes_per_s)
    return 4 * b * s * k * d / (EP * nic_bytes_per_s)


def alltoall_bytes_per_gpu(
    tokens: float, k: int, d: int, EP: int, gpus_per_node: int
) -> tuple[float, float]:
    """(bytes to other GPUs of the node, bytes off the node) one GPU sends in one dispatch.

    tokens: tokens local to this GPU; the EP group fills whole nodes when EP > g."""
    _positive(EP=EP, gpus_per_node=gpus_per_node)
    per_peer = ACT_BYTES * tokens * k * d / EP
    on_node_peers = min(EP, gpus_per_node) - 1
    return per_peer * on_node_peers, per_peer * max(0, EP - gpus_per_node)


def alltoall_time(tokens: float, k: int, d: int, EP: int, p: Platform) -> float:
    """One dispatch (or combine) of ``tokens`` local tokens over an EP group (time_model.alltoall_time)."""
    if EP == 1:
        return 0.0
    on, off = alltoall_bytes_per_gpu(tokens, k, d, EP, p.gpus_per_node)
    return T.alltoall_time(p, on, off)


def p2p_bytes_per_gpu(micro_batch: float, seq: int, d: int) -> float:
    """Activations one GPU sends to the next stage per micro-batch (Piper III-B2): 2 b s d."""
    return ACT_BYTES * micro_batch * seq * d


def bubble_fraction(PP: int, M: int) -> float:
    """Idle fraction of a 1F1B or GPipe step: (PP-1) / (M + PP - 1) (Piper III-D, GPipe)."""
    _positive(PP=PP, M=M)
    return T.bubble_fraction(PP, M)


def mfu_eq12(
    model_flops: float, peak_flops: float, gpus: int, t_compute: float, t_step: float
) -> dict:
    """Piper Eq. 12: MFU = F / (pi G t_compute) x t_compute / t_step.

    Eq. 12 prints the compute fraction as 1 - b t_comm/t_step; with t_step = t_compute + t_comm
    the 'b' cannot be a batch size (the fraction would not be dimensionless in general), so we
    read it as 1 - t_comm/t_step, where t_comm here includes the pipeline bubble."""
    hw = model_flops / (peak_flops * gpus * t_compute)
    frac = t_compute / t_step
    return {"hardware_efficiency": hw, "compute_fraction": frac, "mfu": hw * frac}


# ---------------------------------------------------------------- compute


def layer_forward_time(
    m: MoEModel, moe: bool, tokens: float, seq: int, EP: int, p: Platform, flash: bool = True
) -> dict:
    """Forward compute seconds of one layer on one GPU holding ``tokens`` local tokens
    (time_model.layer_forward): attention = projections + core, ffn = experts, router, shared
    and dense FFNs, hbm = the non-GEMM kernels."""
    t = T.layer_forward(m, moe, p, tokens, seq, ep=EP, flash=flash, dropout=m.dropout)
    proj = T.gemms_time(p, T.attention_gemms(m, tokens))
    return {"attention": proj + t.attention, "ffn": t.gemm - proj, "hbm": t.hbm, "compute": t}


@dataclass
class Estimate:
    PP: int
    EP: int
    M: int
    micro_batch: float
    seq: int
    gpus: int
    tokens_per_step: float
    model_flops: float
    compute_s: float  # per micro-batch, slowest stage, forward + backward (+ recompute)
    alltoall_s: float  # per micro-batch, slowest stage (recompute's forward all-to-alls included)
    p2p_s: float  # per micro-batch
    allreduce_s: float  # per step
    step_s: float
    bubble: float
    mfu: float
    tflops_per_gpu: float
    hardware_efficiency: float
    compute_fraction: float
    eq6_bound_s: float  # Eq. 6 lower bound for one MoE layer's forward all-to-all
    slowest_stage: int

    def to_dict(self) -> dict:
        return asdict(self)


def estimate(
    m: MoEModel,
    p: Platform,
    PP: int,
    EP: int,
    micro_batch: float,
    seq: int,
    M: int,
    checkpointing: bool = False,
    causal: bool = False,
    flash: bool = True,
) -> Estimate:
    """Step time and MFU of a PP x EP mesh (docs/planner.md). ``micro_batch``: sequences per GPU.
    Every second comes from components.resources.time_model."""
    _positive(PP=PP, EP=EP, micro_batch=micro_batch, seq=seq, M=M)
    if m.n_experts % EP:
        raise ValueError(f"EP={EP} does not divide the expert count E={m.n_experts} (Eq. 8)")
    tokens = micro_batch * seq
    first_moe = m.layers - m.n_moe_layers
    a2a_one = alltoall_time(tokens, m.top_k, m.d_model, EP, p)
    same_node_next = EP < p.gpus_per_node and p.gpus_per_node % EP == 0
    p2p = (
        T.transfer_time(
            p,
            2 * p2p_bytes_per_gpu(micro_batch, seq, m.d_model),
            off_node=not same_node_next,
            messages=2,
        )
        if PP > 1
        else 0.0
    )
    layer_fwd = {
        moe: T.layer_forward(m, moe, p, tokens, seq, ep=EP, flash=flash, dropout=m.dropout)
        for moe in (False, True)
    }

    worst: tuple[int, float, float, int] | None = None
    for i, layers in enumerate(stage_layers(m.layers, PP)):
        fwd = T.Compute()
        a2a = 0.0
        replicated = 0
        for layer in layers:
            moe = layer >= first_moe
            fwd += layer_fwd[moe]
            a2a += (6 if checkpointing else 4) * a2a_one if moe else 0.0
            replicated += layer_params(m, moe)[0]
        recomputed = fwd if checkpointing else T.Compute()  # the layers re-run; the head never is
        if i == PP - 1:
            fwd += T.head_forward(m, p, tokens)
        compute = T.train_time(fwd, recomputed)
        if worst is None or compute + a2a > worst[1] + worst[2]:
            worst = (i, compute, a2a, replicated)
    assert worst is not None  # PP >= 1 stages
    slowest, compute, a2a, replicated = worst
    off_node = EP > p.gpus_per_node
    grad_s = (
        T.transfer_time(p, F.ring_allreduce_bytes(ACT_BYTES * replicated, EP), off_node, messages=0)
        if EP > 1
        else 0.0
    )
    allreduce = T.exposed_dp_time(
        grad_s, 0.0, zero=0, micro_batches=M, forward_s=0.0, backward_s=0.0, overlap=False
    )  # after the last backward, as Piper leaves it

    slot = compute + a2a + p2p
    busy, bubble = T.pipeline_step(slot, M, PP)
    step = busy + bubble + allreduce
    gpus = PP * EP
    tokens_step = tokens * EP * M
    flops = train_flops_per_token(m, seq, causal) * tokens_step
    eq12 = mfu_eq12(flops, p.peak_flops, gpus, M * compute, step)
    return Estimate(
        PP=PP,
        EP=EP,
        M=M,
        micro_batch=micro_batch,
        seq=seq,
        gpus=gpus,
        tokens_per_step=tokens_step,
        model_flops=flops,
        compute_s=compute,
        alltoall_s=a2a,
        p2p_s=p2p,
        allreduce_s=allreduce,
        step_s=step,
        bubble=bubble_fraction(PP, M),
        mfu=eq12["mfu"],
        tflops_per_gpu=flops / gpus / step / 1e12,
        hardware_efficiency=eq12["hardware_efficiency"],
        compute_fraction=eq12["compute_fraction"],
        eq6_bound_s=alltoall_lower_bound_eq6(
            micro_batch * EP, seq, m.top_k, m.d_model, EP, p.nic_bytes_per_s
        ),
        slowest_stage=slowest,
    )
