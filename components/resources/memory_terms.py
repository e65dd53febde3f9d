"""What a training process holds on one GPU besides its live tensors, term by term, each from a
public source (docs/planner.md, "Memory kinds and terms").

memory_model.LayoutMemory counts weights, gradients, optimizer state and saved activations (the
live tensors Megatron's theoretical formula counts). Asked for a memory *kind*, it adds these:

- ``allocated`` (torch.cuda.max_memory_allocated): + the step's transients (MoE dispatch copies,
  fp32 logits and loss, gradient-reduction buffers, optimizer-step temporaries) + cuBLAS
  workspaces, which PyTorch takes from its caching allocator;
- ``reserved`` (torch.cuda.max_memory_reserved): + the caching allocator's segment rounding and
  its fragmentation gap;
- ``device`` (nvidia-smi): + the CUDA context, NCCL's buffers and DeepEP's buffers, which are
  allocated outside the caching allocator.

Constants cite the file and version they come from; a platform profile's optional ``memory``
block overrides the per-GPU facts (:func:`device_facts`).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("allocated", "reserved", "device")
MiB = 2**20

# --------------------------------------------------------------------------------------------
# Sources, one per term name (the five live-tensor terms of memory_model.StageMemory included)
# --------------------------------------------------------------------------------------------

SOURCES: dict[str, str] = {
    "weights": "formulas.model_state_bytes: working weights at the precision preset, / TP, "
    "experts / (EP x ETP), sharded at ZeRO-3 (ZeRO Sec. 5.1)",
    "grads": "formulas.model_state_bytes: gradients at the preset's bytes, sharded at ZeRO-2/3",
    "optimizer": "formulas.model_state_bytes: fp32 master weights + Adam moments, sharded at "
    "ZeRO >= 1 (Megatron theoretical_memory_usage.py: 6 + 12/DP B/param)",
    "activations": "formulas.moe_activation_terms_per_layer (Korthikanti 2022 with real widths) x "
    "micro-batches in flight + the last stage's fp32 logits of one micro-batch",
    "buffers": "ZeRO-3: two layers' gathered bf16 weights (FSDP prefetch); without a memory kind "
    "also the profile's framework_overhead_GB constant",
    "cuBLAS workspaces": "PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp "
    "(parseChosenWorkspaceSize, v2.3+): 4096 KiB x 8 = 32 MiB per (handle, stream) on sm90, "
    "4096 KiB x 2 + 16 KiB x 8 otherwise, from the caching allocator; cuBLASLt shares it "
    "(TORCH_CUBLASLT_UNIFIED_WORKSPACE, default on); two handles: the Python thread's and the "
    "autograd engine's device thread (thread-local handle pool)",
    "MoE dispatch transient": "Megatron-core token_dispatcher.py MoEAlltoAllTokenDispatcher: "
    "permute() copies the routed tokens (k x tokens x h) before the all-to-all, whose output is a "
    "second buffer of the same size; one MoE layer at a time, capacity factor applied (dropless "
    "worst case: every token of the EP group routed here)",
    "fp32 logits and loss transient": "Megatron-core tensor_parallel/cross_entropy.py "
    "(VocabParallelCrossEntropy): forward, logits.float() beside the bf16 logits; backward, the "
    "fp32 gradient (in place on the softmax) beside its bf16 cast: 2 B per logit over the 4 B "
    "kept; torch F.cross_entropy on pred.float() (torchtitan loss): forward bf16 logits + fp32 "
    "copy + log_softmax output, backward saved output + nll_loss and log_softmax gradients (fp32): "
    "8 B per logit over the 4 B kept; compiled (torch.compile of that loss, Inductor): the bf16 "
    "logits and per-row max and log-sum-exp saved, the bf16 gradient written: 2 B over 2 B kept; "
    "under TP, torch's loss_parallel (tensor/parallel/loss.py _log_softmax and "
    "_nll_loss_and_log_softmax_backward): 12 B over the 4 B kept",
    "gradient reduction buffers": "Megatron-core distributed/param_and_grad_buffer.py: buckets "
    "(bucket_size = max(40M, 1M x DP) params, distributed_data_parallel.py) are views into the "
    "contiguous grad buffer: 0 B extra; FSDP2 torch/distributed/fsdp/_fully_shard/"
    "_fsdp_collectives.py foreach_reduce: the layer's unsharded bf16 gradients + the "
    "reduce-scatter input in the reduce dtype (torchtitan mixed_precision_reduce: float32)",
    "optimizer-step temporaries": "torch/optim/adamw.py _multi_tensor_adamw (foreach): "
    "torch._foreach_sqrt(exp_avg_sqs) allocates one fp32 copy of the local moments; fused "
    "(torch fused=True, Megatron's TE/apex FusedAdam): none. Counted only above the backward's "
    "transient peak (activations are freed at the step)",
    "allocator: segment rounding": "PyTorch c10/cuda/CUDACachingAllocator.cpp: sizes rounded to "
    "512 B; requests <= 1 MiB from 2 MiB segments, < 10 MiB from 20 MiB segments, larger ones "
    "rounded up to 2 MiB (kMinBlockSize, kSmallSize, kSmallBuffer, kLargeBuffer, kMinLargeAlloc, "
    "kRoundLarge); applied to the modelled transient buffers",
    "allocator: fragmentation": "PyTorch CUDACachingAllocator: freed blocks stay reserved and a "
    "cached block > 1 MiB is split for smaller requests, so the largest transient may need a "
    "fresh segment at its next allocation: reserved - allocated <= one largest transient; 0 with "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch docs, CUDA memory management)",
    "CUDA context": "PyTorch issue 107667 (ptrblck, 2023-08-28): the CUDA context takes ~300 MB "
    "with lazy module loading (CUDA >= 11.7, default on Linux since 12.2), > 1000 MB before",
    "NCCL buffers": "NCCL src/init.cc: per channel and connection LL 512 KiB (8 lines x 512 "
    "threads x 8 steps x 16 B) + LL128 4.6875 MiB (120 x 640 x 8 x 8 B) + SIMPLE 4 MiB "
    "(DEFAULT_BUFFSIZE, NCCL_BUFFSIZE); collectives: one ring connection per channel; send/recv "
    "(EP all-to-all, PP, CP): channels per NVLink peer, NCCL_NCHANNELS_PER_NET_PEER = 2 per "
    "off-node peer; one communicator per TP, CP, DP, PP, EP, EDP, ETP group",
    "DeepEP buffers": "deepseek-ai/DeepEP csrc/config.hpp get_nvl_buffer_size_hint / "
    "get_rdma_buffer_size_hint with deep_ep/buffer.py get_dispatch_config / get_combine_config "
    "(num_sms 20), as Megatron-core fusions/fused_a2a.py get_buffer sizes them; cudaMalloc / "
    "NVSHMEM, outside the caching allocator",
}

# The short citation of each term (a table column; SOURCES has the rule)
CITATIONS: dict[str, str] = {
    "weights": "formulas.model_state_bytes",
    "grads": "formulas.model_state_bytes",
    "optimizer": "formulas.model_state_bytes",
    "activations": "formulas.moe_activation_terms_per_layer",
    "buffers": "FSDP prefetch (ZeRO-3); profile overhead",
    "cuBLAS workspaces": "PyTorch ATen/cuda/CublasHandlePool.cpp",
    "MoE dispatch transient": "Megatron-core token_dispatcher.py",
    "fp32 logits and loss transient": "Megatron-core cross_entropy.py; torch cross_entropy",
    "gradient reduction buffers": "Megatron-core param_and_grad_buffer.py; FSDP2 foreach_reduce",
    "optimizer-step temporaries": "torch optim/adamw.py (foreach)",
    "allocator: segment rounding": "PyTorch c10/cuda/CUDACachingAllocator.cpp",
    "allocator: fragmentation": "PyTorch c10/cuda/CUDACachingAllocator.cpp",
    "CUDA context": "pytorch/pytorch issue 107667",
    "NCCL buffers": "NCCL src/init.cc, src/include/device.h",
    "DeepEP buffers": "DeepEP csrc/config.hpp, deep_ep/buffer.py",
}

KIND_OF: dict[str, str] = {
    "cuBLAS workspaces": "allocated",
    "MoE dispatch transient": "allocated",
    "fp32 logits and loss transient": "allocated",
    "gradient reduction buffers": "allocated",
    "optimizer-step temporaries": "allocated",
    "allocator: segment rounding": "reserved",
    "allocator: fragmentation": "reserved",
    "CUDA context": "device",
    "NCCL buffers": "device",
    "DeepEP buffers": "device",
}


@dataclass(frozen=True)
class Term:
    """One memory term of one GPU: bytes counted toward the total, the kind that first includes
    it, and its source."""

    name: str
    bytes: float
    kind: str

    @property
    def source(self) -> str:
        return SOURCES[self.name]


def check_kind(kind: str | None) -> str | None:
    """``kind`` if it is None (the live-tensor model with the profile's overhead) or one of
    KINDS; ValueError otherwise."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"memory kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return kind


def includes(kind: str, term_kind: str) -> bool:
    """Whether memory of ``kind`` counts a term first included by ``term_kind``."""
    return KINDS.index(term_kind) <= KINDS.index(kind)


# --------------------------------------------------------------------------------------------
# Per-GPU facts (context, workspace, NCCL channels)
# --------------------------------------------------------------------------------------------

# PyTorch CublasHandlePool.cpp parseChosenWorkspaceSize: ":4096:8" on sm90, ":4096:2:16:8" else
CUBLAS_WORKSPACE_SM90 = 4096 * 1024 * 8
CUBLAS_WORKSPACE_OTHER = 4096 * 1024 * 2 + 16 * 1024 * 8
# PyTorch CublasHandlePool.cpp parseCUDABlasLtWorkspaceSize on ROCm: "Use 76 MB for hipBLASLt"
HIPBLASLT_WORKSPACE = 76 * 1024 * 1024
CUBLAS_HANDLES = 2  # the Python thread's and the autograd engine's device thread
CUDA_CONTEXT_BYTES = 300e6  # PyTorch issue 107667: ~300 MB with lazy loading
NCCL_CHANNELS = 16  # NVIDIA/nccl issue 892 (8 x H800 NVSwitch, NCCL 2.18): "16 coll channels,
# 16 p2p channels, 16 p2p channels per peer"
NCCL_NET_CHANNELS_PER_PEER = 2  # NCCL docs, NCCL_NCHANNELS_PER_NET_PEER default

# NCCL src/init.cc and src/include/device.h: the three protocols' buffers per connection
NCCL_STEPS = 8
NCCL_LL_BUFFSIZE = 8 * 512 * NCCL_STEPS * 16  # LINES_PER_THREAD x LL_MAX_NTHREADS x steps x 16 B
NCCL_LL128_BUFFSIZE = 120 * 640 * NCCL_STEPS * 8  # ELEMS_PER_THREAD x LL128_MAX_NTHREADS x 8 B
NCCL_SIMPLE_BUFFSIZE = 1 << 22  # DEFAULT_BUFFSIZE, 4 MiB
NCCL_CONNECTION_BYTES = NCCL_LL_BUFFSIZE + NCCL_LL128_BUFFSIZE + NCCL_SIMPLE_BUFFSIZE


@dataclass(frozen=True)
class DeviceFacts:
    """What one GPU of a platform holds outside the model: CUDA context, one cuBLAS workspace,
    NCCL channels per collective and per NVLink send/recv peer; ``note`` says where they came
    from."""

    cuda_context_bytes: float = CUDA_CONTEXT_BYTES
    cublas_workspace_bytes: float = CUBLAS_WORKSPACE_SM90
    nccl_channels: int = NCCL_CHANNELS
    nccl_channels_per_nvl_peer: int = NCCL_CHANNELS
    gpus_per_node: int = 8
    note: str = "defaults (sm90)"


def _arch(gpu_name: str) -> str:
    name = gpu_name.upper()
    if any(x in name for x in ("MI2", "MI3", "AMD")):
        return "rocm"
    if any(x in name for x in ("H100", "H200", "H800", "H20", "GH200")):
        return "sm90"
    return "other"


def device_facts(p) -> DeviceFacts:
    """The platform's facts: the profile's ``memory`` block (cuda_context_MB,
    cublas_workspace_MiB, nccl_channels, nccl_channels_per_nvl_peer) where given, else the
    defaults above by GPU architecture (sm90: 32 MiB workspace; ROCm: hipBLASLt's 76 MiB beside
    the 8 MiB one; others: 8 MiB + 128 KiB). ValueError on a malformed block."""
    raw = getattr(p, "raw", {}) or {}
    arch = _arch(str(raw.get("gpu", {}).get("name", "")))
    ws = {
        "sm90": CUBLAS_WORKSPACE_SM90,
        "rocm": CUBLAS_WORKSPACE_OTHER + HIPBLASLT_WORKSPACE,
        "other": CUBLAS_WORKSPACE_OTHER,
    }[arch]
    block = raw.get("memory", {})
    if not isinstance(block, dict):
        raise ValueError("platform profile: memory must be an object")

    def number(key: str, default: float) -> float:
        v = block.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"platform profile: memory.{key} must be a number >= 0, got {v!r}")
        return float(v)

    channels = int(number("nccl_channels", NCCL_CHANNELS))
    return DeviceFacts(
        cuda_context_bytes=number("cuda_context_MB", CUDA_CONTEXT_BYTES / 1e6) * 1e6,
        cublas_workspace_bytes=number("cublas_workspace_MiB", ws / MiB) * MiB,
        nccl_channels=channels,
        nccl_channels_per_nvl_peer=int(number("nccl_channels_per_nvl_peer", channels)),
        gpus_per_node=int(getattr(p, "gpus_per_node", 8)),
        note="profile memory block" if block else f"defaults ({arch})",
    )


# --------------------------------------------------------------------------------------------
# The terms, each a small function of the quantities its source names
# --------------------------------------------------------------------------------------------


def cublas_workspaces(facts: DeviceFacts, handles: int = CUBLAS_HANDLES) -> float:
    """One workspace per (cuBLAS handle, stream): ``handles`` x the per-GPU workspace."""
    return handles * facts.cublas_workspace_bytes


def moe_dispatch_transient(
    tokens: float,
    hidden: int,
    top_k: int,
    capacity_factor: float = 1.0,
    etp: int = 1,
    ep: int = 1,
    local_experts: int = 1,
    worst_case: bool = False,
    bytes_per_value: float = 2,
) -> float:
    """Bytes of the alltoall dispatcher's permuted copy of one MoE layer's routed tokens beyond
    what the layer saves: ``tokens`` x k copies x h (x capacity factor, x ETP after the expert-TP
    all-gather). Dropless worst case: the EP group's ``ep`` x tokens all routed to this rank's
    experts, each copy at most min(k, local experts) times."""
    copies = top_k * capacity_factor
    if worst_case:
        copies = ep * min(top_k, local_experts)
    return tokens * copies * hidden * bytes_per_value * etp


# per logit over the 4 B fp32 logits kept, the larger of forward and backward (SOURCES)
LOSS_EXTRA_BYTES = {
    "vocab-parallel": 2.0,
    "torch": 8.0,
    "torch-compiled": 2.0,
    # torch's loss_parallel (a TP-sharded vocabulary, torch/distributed/tensor/parallel/loss.py):
    # _log_softmax holds x, shifted and exp(shifted); the fused nll/log_softmax backward holds
    # the saved output, zeros_like(x), exp(x) and their sum: 12 B beside the 4 B kept
    "torch-loss-parallel": 12.0,
}
# torch.compile (Inductor) of ``cross_entropy(pred.float(), labels)`` saves the bf16 logits and two
# fp32 values per row (max, log-sum-exp), never an fp32 copy, and its backward writes the bf16
# gradient directly (docs/planner.md, "Memory kinds and terms"); eager keeps fp32 logits
LOGITS_KEPT_BYTES = {"torch-compiled": 2.0}


def logits_kept_bytes(loss: str) -> float:
    """Bytes per logit the activations keep on the last stage: fp32, or bf16 if compiled."""
    return LOGITS_KEPT_BYTES.get(loss, 4.0)


def logits_loss_transient(tokens: float, vocab: int, tp: int = 1, loss: str = "vocab-parallel"):
    """Bytes the loss allocates beside the logits the activations keep (logits_kept_bytes), one
    micro-batch of ``tokens`` on the last stage, vocabulary split over TP."""
    if loss not in LOSS_EXTRA_BYTES:
        raise ValueError(f"loss must be one of {', '.join(LOSS_EXTRA_BYTES)}, got {loss!r}")
    return LOSS_EXTRA_BYTES[loss] * tokens * vocab / tp


def grad_reduction_buffers(
    framework: str,
    layer_params: float,
    local_params: float,
    grad_bytes: float,
    reduce_bytes: float = 4.0,
) -> float:
    """Bytes of gradient-reduction buffers: Megatron DDP 0 (bucket views of the contiguous grad
    buffer); FSDP2 the largest layer's unsharded gradients (``grad_bytes``) + the reduce-scatter
    input in the reduce dtype (``reduce_bytes``: torchtitan's mixed_precision_reduce default
    float32); torch DDP without gradient_as_bucket_view a bucket copy of every local gradient
    (torch DDP docs: the saving of gradient_as_bucket_view 'will be equal to the total gradients
    size')."""
    if framework == "megatron":
        return 0.0
    if framework == "fsdp2":
        return layer_params * (grad_bytes + reduce_bytes)
    if framework == "torch-ddp":
        return local_params * grad_bytes
    raise ValueError(f"framework must be megatron, fsdp2 or torch-ddp, got {framework!r}")


def optimizer_step_temporaries(local_params: float, moment_bytes: float, impl: str) -> float:
    """Bytes torch's foreach AdamW allocates at the step (one copy of the second moments, by
    ``_foreach_sqrt``); fused implementations allocate none."""
    if impl == "fused":
        return 0.0
    if impl == "foreach":
        return local_params * moment_bytes
    raise ValueError(f"optimizer must be fused or foreach, got {impl!r}")


# c10/cuda/CUDACachingAllocator.cpp constants
K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 * MiB
K_SMALL_BUFFER = 2 * MiB
K_LARGE_BUFFER = 20 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB


def round_size(size: float) -> int:
    """The allocator's block size for a request: at least 512 B, a multiple of 512 B."""
    s = int(-(-size // 1))
    return K_MIN_BLOCK if s < K_MIN_BLOCK else K_MIN_BLOCK * -(-s // K_MIN_BLOCK)


def segment_size(size: float) -> int:
    """The segment the allocator reserves from the driver for a request that finds no cached
    block (get_allocation_size): 2 MiB for <= 1 MiB, 20 MiB below 10 MiB, else rounded up to a
    multiple of 2 MiB."""
    s = round_size(size)
    if s <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if s < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * -(-s // K_ROUND_LARGE)


def segment_rounding(allocations: list[float]) -> float:
    """Reserved bytes beyond the requests, each allocation in a segment of its own."""
    return float(sum(segment_size(a) - a for a in allocations if a > 0))


def fragmentation(largest_transient: float, expandable_segments: bool = False) -> float:
    """The reserved-vs-allocated gap: one segment of the largest transient (none with expandable
    segments)."""
    if expandable_segments or largest_transient <= 0:
        return 0.0
    return float(segment_size(largest_transient))


def nccl_collective(size: int, facts: DeviceFacts) -> float:
    """A collective communicator of ``size`` ranks: one ring connection per channel."""
    return facts.nccl_channels * NCCL_CONNECTION_BYTES if size > 1 else 0.0


def nccl_p2p(nvl_peers: int, net_peers: int, facts: DeviceFacts) -> float:
    """Send/recv connections: channels per NVLink peer, NCCL_NCHANNELS_PER_NET_PEER per off-node
    peer, each a connection's buffers."""
    ch = nvl_peers * facts.nccl_channels_per_nvl_peer + net_peers * NCCL_NET_CHANNELS_PER_PEER
    return ch * NCCL_CONNECTION_BYTES


# DeepEP deep_ep/buffer.py (num_sms 20) and csrc/config.hpp
DEEPEP_NUM_SMS = 20
NUM_MAX_NVL_PEERS = 8
# num_ranks -> (nvl send, nvl recv, rdma send, rdma recv) chunked tokens: deep_ep/buffer.py
# get_dispatch_config / get_combine_config
DEEPEP_DISPATCH = {
    2: (24, 256, 6, 128),
    4: (6, 256, 6, 128),
    8: (6, 256, 6, 128),
    16: (36, 288, 20, 128),
    24: (32, 288, 8, 128),
    32: (32, 288, 8, 128),
    48: (32, 288, 8, 128),
    64: (32, 288, 8, 128),
    96: (20, 480, 12, 128),
    128: (20, 560, 12, 128),
    144: (32, 720, 12, 128),
    160: (28, 720, 12, 128),
}
DEEPEP_COMBINE = {
    2: (10, 256, 6, 128),
    4: (9, 256, 6, 128),
    8: (4, 256, 6, 128),
    16: (4, 288, 12, 128),
    24: (1, 288, 8, 128),
    32: (1, 288, 8, 128),
    48: (1, 288, 8, 128),
    64: (1, 288, 8, 128),
    96: (1, 480, 8, 128),
    128: (1, 560, 8, 128),
    144: (2, 720, 8, 128),
    160: (2, 720, 8, 128),
}
_K_MAX_TOPK = 128  # config.hpp kNumMaxTopK
_K_MAX_SCALES = 128  # config.hpp kNumMaxScales
_SOURCE_META = 8  # internode SourceMeta: two ints


def _deepep_config(ranks: int, table: dict) -> tuple[int, int, int, int]:
    key = min((k for k in table if k >= ranks), default=max(table))
    return table[key]


def deepep_nvl_bytes(hidden_bytes: int, ranks: int, recv_tokens: int) -> int:
    """Config::get_nvl_buffer_size_hint."""
    rdma = max(ranks // NUM_MAX_NVL_PEERS, 1)
    nvl = min(ranks, NUM_MAX_NVL_PEERS)
    ch = DEEPEP_NUM_SMS // 2
    n = ch * nvl * (2 * rdma + 3) * 4
    per_token = hidden_bytes + _SOURCE_META + _K_MAX_TOPK * 8 + _K_MAX_TOPK * 4 + _K_MAX_SCALES * 4
    n += ch * nvl * recv_tokens * per_token
    return -(-n // 128) * 128


def deepep_rdma_bytes(hidden_bytes: int, ranks: int, recv_tokens: int) -> int:
    """Config::get_rdma_buffer_size_hint: 0 within one node; send + receive halves otherwise."""
    if ranks <= NUM_MAX_NVL_PEERS:
        return 0
    rdma = ranks // NUM_MAX_NVL_PEERS
    ch = DEEPEP_NUM_SMS // 2
    n = ch * rdma * (NUM_MAX_NVL_PEERS * 2 + 2) * 2 * 4
    per_token = (
        hidden_bytes + _SOURCE_META + _K_MAX_TOPK * 8 + _K_MAX_TOPK * 4 + _K_MAX_SCALES * 4 + 16
    )  # ... + sizeof(int4)
    n += ch * rdma * recv_tokens * per_token * 2
    return -(-n // 128) * 128


def deepep_buffers(hidden: int, ranks: int, bytes_per_value: int = 2) -> float:
    """Megatron-core fused_a2a.get_buffer: the larger of the dispatch and combine configs' NVL
    and RDMA hints for hidden_bytes = h x max(element size, 2)."""
    if ranks <= 1:
        return 0.0
    hb = hidden * max(bytes_per_value, 2)
    nvl = rdma = 0
    for table in (DEEPEP_DISPATCH, DEEPEP_COMBINE):
        _, nvl_recv, rdma_send, rdma_recv = _deepep_config(ranks, table)
        rdma_recv = -(-rdma_recv // rdma_send) * rdma_send  # Config(): aligned up to the send chunk
        nvl = max(nvl, deepep_nvl_bytes(hb, ranks, nvl_recv))
        rdma = max(rdma, deepep_rdma_bytes(hb, ranks, rdma_recv))
    return float(nvl + rdma)


# --------------------------------------------------------------------------------------------
# Settings of the framework whose memory is predicted
# --------------------------------------------------------------------------------------------

FRAMEWORKS = ("auto", "megatron", "fsdp2", "torch-ddp")
MLP_FORMS = ("fused", "eager")
SELECTIVE_FORMS = ("korthikanti", "torchtitan-op")


@dataclass(frozen=True)
class MemorySettings:
    """How the run being predicted allocates: ``framework`` (auto: FSDP2 at ZeRO-3, Megatron-core
    otherwise), ``loss`` (auto: torch's cross-entropy with FSDP2, vocab-parallel otherwise),
    ``optimizer`` (fused: Megatron's FusedAdam and torchtitan's default; foreach: torch's
    default), ``dispatcher`` (ep_time.DISPATCHERS), ``expandable_segments``
    (PYTORCH_CUDA_ALLOC_CONF), ``dropless_worst_case`` (every token of the EP group routed to
    one rank), ``mlp`` (fused: Megatron-core's SwiGLU keeps n_mat d_ffn per token; eager:
    torchtitan's ``w2(silu(w1 x) * w3 x)`` keeps w1 x, silu, w3 x and the product, one d_ffn
    more), ``selective`` (korthikanti: Megatron's selective recompute; torchtitan-op:
    torchtitan's per-op policy, memory_model.torchtitan_op_sac_bytes) and the platform's
    :class:`DeviceFacts`."""

    facts: DeviceFacts = DeviceFacts()
    framework: str = "auto"
    loss: str = "auto"
    optimizer: str = "fused"
    dispatcher: str = "alltoall"
    expandable_segments: bool = False
    dropless_worst_case: bool = False
    mlp: str = "fused"
    selective: str = "korthikanti"

    def __post_init__(self) -> None:
        if self.mlp not in MLP_FORMS:
            raise ValueError(f"mlp must be one of {', '.join(MLP_FORMS)}, got {self.mlp!r}")
        if self.selective not in SELECTIVE_FORMS:
            raise ValueError(
                f"selective must be one of {', '.join(SELECTIVE_FORMS)}, got {self.selective!r}"
            )

    def framework_at(self, zero: int) -> str:
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}")
        if self.framework != "auto":
            return self.framework
        return "fsdp2" if zero == 3 else "megatron"

    def loss_at(self, zero: int) -> str:
        if self.loss != "auto":
            return self.loss
        return "torch" if self.framework_at(zero) == "fsdp2" else "vocab-parallel"
