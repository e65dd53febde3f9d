"""Compute and communication model: FLOPs, all-to-all (Piper Eq. 6), P2P, bubble, MFU (Eq. 12).

FLOPs convention (stated because public tools differ):
  training FLOPs per token = 6 N_active + attention,
  N_active = active parameters that take part in a matmul (the input embedding table is a lookup
  and is excluded; the output head's V d is included whether or not it is tied to the input table,
  since a tied head still runs the [tokens x d] @ [d x V] matmul; norm weights, MLA's latent norms
  included, are not matmuls), the same count as components.resources.formulas;
  attention = 3 x 2 x 2 x s x H (d_qk + d_v) / 2 per layer and token, i.e. forward QK^T and AV
  (2 FLOPs per multiply-add) times 3 for forward + backward. With ``causal=False`` (default, the
  PaLM / Megatron-LM convention: 6N + 12 L H d_h s) the causal mask is NOT halved; with
  ``causal=True`` it is (what FlashAttention's causal kernels execute). Model FLOPs (the MFU
  numerator) never count activation-checkpointing recompute.

Communication, bytes per GPU (bf16 activations, 2 bytes per element):
  dispatch all-to-all: a GPU with T local tokens sends 2 T k d (EP-1)/EP bytes to the others of
  its EP group (balanced routing), of which 2 T k d (EP-g)/EP leave the node when EP > g;
  combine is the same volume back. Eq. 6 lower bound, as printed: T_a2a >= 4 b s k d / (EP B_NIC)
  (b s = the EP group's tokens, so per-GPU volume 2 b s k d / EP each way, self-share ignored).
  Pipeline P2P: 2 b s d bytes per GPU per micro-batch forward (activations) and the same backward
  (gradients); Piper III-B2: 2 EP b s d between two stages.
  Gradient all-reduce of the weights replicated over the EP group (ring): 2 (n-1)/n x 2 bytes x
  params (Piper leaves this out; it is small for MoE models).

Time model (an estimate, not a simulation): per micro-batch and stage, compute (attention at the
achievable attention rate; projections, router, shared/dense FFNs and every expert GEMM by a
roofline max(FLOPs / achievable GEMM rate, bytes / HBM bandwidth)), backward = 2 x forward,
plus all-to-all (4 per MoE layer: dispatch+combine, forward+backward; 6 with full activation
checkpointing, whose recomputed forward re-runs dispatch and combine, X-MoE Sec. 4.3: "a total of
6 alltoalls per layer") and P2P, not overlapped.
The step takes (M + PP - 1) slots of the slowest stage (1F1B and GPipe have the same bubble).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moe_repro.components.resources import formulas as F
from moe_repro.components.resources.memory_model import stage_layers
from moe_repro.components.model.params import attention_params, layer_params, param_counts
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
    """Training FLOPs of QK^T and AV per token, all layers (see the module docstring)."""
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
    the norm weights (module docstring)."""
    pc = param_counts(m)
    head = m.vocab * m.d_model if m.vocab else 0
    return pc.active - pc.embeddings + head - pc.norms - _mla_latent_norms(m)


def train_flops_per_token(m: MoEModel, seq: int, causal: bool = False) -> float:
    """6 N_active + attention core (module docstring)."""
    return 6 * matmul_active_params(m) + attention_core_flops_per_token(m, seq, causal)


# ---------------------------------------------------------------- communication

def alltoall_lower_bound_eq6(b: float, s: int, k: int, d: int, EP: int, nic_bytes_per_s: float) -> float:
    """Piper Eq. 6 as printed: T_a2a >= 4 b s k d / (EP B_NIC) seconds (dispatch + combine, fp16)."""
    _positive(EP=EP, nic_bytes_per_s=nic_bytes_per_s)
    return 4 * b * s * k * d / (EP * nic_bytes_per_s)


def alltoall_bytes_per_gpu(tokens: float, k: int, d: int, EP: int, gpus_per_node: int) -> tuple[float, float]:
    """(bytes to other GPUs of the node, bytes off the node) one GPU sends in one dispatch.

    tokens: tokens local to this GPU; the EP group fills whole nodes when EP > g."""
    _positive(EP=EP, gpus_per_node=gpus_per_node)
    per_peer = ACT_BYTES * tokens * k * d / EP
    on_node_peers = min(EP, gpus_per_node) - 1
    return per_peer * on_node_peers, per_peer * max(0, EP - gpus_per_node)


def link_bytes_per_s(p: Platform, off_node: bool) -> float:
    """Per-GPU bandwidth of a transfer: the intra-node all-to-all rate (NVLink) inside a node;
    across nodes nics x B_NIC / g x network efficiency. The one link rule both planners time
    communication with (this model and parallel_planner)."""
    return p.nic_bytes_per_s_per_gpu * p.network_efficiency if off_node else p.intra_node_a2a_bytes_per_s


def alltoall_time(tokens: float, k: int, d: int, EP: int, p: Platform) -> float:
    """One dispatch (or combine): intra- and inter-node parts proceed concurrently; the slower
    bounds it. Inter-node per-GPU bandwidth = nics x B_NIC / g x network efficiency."""
    if EP == 1:
        return 0.0
    on, off = alltoall_bytes_per_gpu(tokens, k, d, EP, p.gpus_per_node)
    t_on = on / link_bytes_per_s(p, off_node=False)
    t_off = off / link_bytes_per_s(p, off_node=True) if off else 0.0
    latency = _latency_s(p, off > 0)
    return max(t_on, t_off) + latency


def _latency_s(p: Platform, off_node: bool) -> float:
    if not p.links:
        return 0.0
    cls = [lk for lk in p.links if ("nic" in lk["class"]) == off_node] or list(p.links)
    return max(lk.get("latency_us", 0.0) for lk in cls) * 1e-6


def p2p_bytes_per_gpu(micro_batch: float, seq: int, d: int) -> float:
    """Activations one GPU sends to the next stage per micro-batch (Piper III-B2): 2 b s d."""
    return ACT_BYTES * micro_batch * seq * d


def ring_allreduce_time(nbytes: float, n: int, bw: float) -> float:
    """Ring all-reduce: each rank sends 2 (n-1)/n x nbytes (nccl-tests busbw convention), counted
    by formulas.ring_allreduce_bytes as the parallelism planner counts its DP reduction."""
    return 0.0 if n <= 1 else F.ring_allreduce_bytes(nbytes, n) / bw


def bubble_fraction(PP: int, M: int) -> float:
    """Idle fraction of a 1F1B or GPipe step: (PP-1) / (M + PP - 1) (Piper III-D, GPipe)."""
    _positive(PP=PP, M=M)
    return (PP - 1) / (M + PP - 1)


def mfu_eq12(model_flops: float, peak_flops: float, gpus: int, t_compute: float, t_step: float) -> dict:
    """Piper Eq. 12: MFU = F / (pi G t_compute) x t_compute / t_step.

    Eq. 12 prints the compute fraction as 1 - b t_comm/t_step; with t_step = t_compute + t_comm
    the 'b' cannot be a batch size (the fraction would not be dimensionless in general), so we
    read it as 1 - t_comm/t_step, where t_comm here includes the pipeline bubble."""
    hw = model_flops / (peak_flops * gpus * t_compute)
    frac = t_compute / t_step
    return {"hardware_efficiency": hw, "compute_fraction": frac, "mfu": hw * frac}


# ---------------------------------------------------------------- compute

def _gemm_time(tokens: float, d_in: int, d_out: int, p: Platform) -> float:
    """Roofline time of one [tokens x d_in] @ [d_in x d_out] GEMM, bf16 operands."""
    if tokens <= 0:
        return 0.0
    flops = 2 * tokens * d_in * d_out
    nbytes = ACT_BYTES * (tokens * d_in + d_in * d_out + tokens * d_out)
    return max(flops / p.gemm_flops, nbytes / p.hbm_bytes_per_s)


def _ffn_time(tokens: float, m: MoEModel, d_ffn: int, p: Platform) -> float:
    # n_mat - 1 input matrices (d -> d_ffn) and one output matrix (d_ffn -> d).
    return (m.n_mat - 1) * _gemm_time(tokens, m.d_model, d_ffn, p) + _gemm_time(tokens, d_ffn, m.d_model, p)


def layer_forward_time(m: MoEModel, moe: bool, tokens: float, seq: int, EP: int, p: Platform) -> dict:
    """Forward compute seconds of one layer on one GPU holding ``tokens`` local tokens."""
    dqk, dv = head_dims(m)
    proj = 2 * tokens * attention_params(m) / p.gemm_flops
    core = 2 * tokens * seq * m.heads * (dqk + dv) * 0.5 / p.attention_flops  # causal kernels
    ffn = 0.0
    if moe:
        local_experts = m.n_experts // EP
        tokens_per_expert = tokens * m.top_k * EP / m.n_experts  # balanced routing
        ffn += local_experts * _ffn_time(tokens_per_expert, m, m.d_ffn, p)
        ffn += 2 * tokens * m.d_model * m.n_experts / p.gemm_flops  # router
        if m.n_shared:
            ffn += m.n_shared * _ffn_time(tokens, m, m.d_ffn_shared or m.d_ffn, p)
    elif m.d_ffn_dense:
        ffn += _ffn_time(tokens, m, m.d_ffn_dense, p)
    if m.d_ffn_residual:
        ffn += _ffn_time(tokens, m, m.d_ffn_residual, p)
    return {"attention": proj + core, "ffn": ffn}


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


def estimate(m: MoEModel, p: Platform, PP: int, EP: int, micro_batch: float, seq: int, M: int,
             checkpointing: bool = False, causal: bool = False) -> Estimate:
    """Step time and MFU of a PP x EP mesh (module docstring). ``micro_batch``: sequences per GPU."""
    _positive(PP=PP, EP=EP, micro_batch=micro_batch, seq=seq, M=M)
    if m.n_experts % EP:
        raise ValueError(f"EP={EP} does not divide the expert count E={m.n_experts} (Eq. 8)")
    tokens = micro_batch * seq
    first_moe = m.layers - m.n_moe_layers
    a2a_one = alltoall_time(tokens, m.top_k, m.d_model, EP, p)
    same_node_next = EP < p.gpus_per_node and p.gpus_per_node % EP == 0
    p2p_bw = link_bytes_per_s(p, off_node=not same_node_next)
    p2p = 2 * p2p_bytes_per_gpu(micro_batch, seq, m.d_model) / p2p_bw if PP > 1 else 0.0

    worst = None
    for i, layers in enumerate(stage_layers(m.layers, PP)):
        fwd = a2a = 0.0
        replicated = 0
        for layer in layers:
            moe = layer >= first_moe
            t = layer_forward_time(m, moe, tokens, seq, EP, p)
            fwd += t["attention"] + t["ffn"]
            a2a += (6 if checkpointing else 4) * a2a_one if moe else 0.0
            replicated += layer_params(m, moe)[0]
        if i == PP - 1 and m.vocab:
            fwd += _gemm_time(tokens, m.d_model, m.vocab, p)  # output head
        compute = fwd * (4 if checkpointing else 3)  # backward = 2 x forward; recompute = 1
        if worst is None or compute + a2a > worst[1] + worst[2]:
            worst = (i, compute, a2a, replicated)
    slowest, compute, a2a, replicated = worst
    ar_bw = link_bytes_per_s(p, off_node=EP > p.gpus_per_node)
    allreduce = ring_allreduce_time(ACT_BYTES * replicated, EP, ar_bw)

    slot = compute + a2a + p2p
    step = (M + PP - 1) * slot + allreduce
    gpus = PP * EP
    tokens_step = tokens * EP * M
    flops = train_flops_per_token(m, seq, causal) * tokens_step
    eq12 = mfu_eq12(flops, p.peak_flops, gpus, M * compute, step)
    return Estimate(
        PP=PP, EP=EP, M=M, micro_batch=micro_batch, seq=seq, gpus=gpus, tokens_per_step=tokens_step,
        model_flops=flops, compute_s=compute, alltoall_s=a2a, p2p_s=p2p, allreduce_s=allreduce,
        step_s=step, bubble=bubble_fraction(PP, M), mfu=eq12["mfu"], tflops_per_gpu=flops / gpus / step / 1e12,
        hardware_efficiency=eq12["hardware_efficiency"], compute_fraction=eq12["compute_fraction"],
        eq6_bound_s=alltoall_lower_bound_eq6(micro_batch * EP, seq, m.top_k, m.d_model, EP, p.nic_bytes_per_s),
        slowest_stage=slowest,
    )
