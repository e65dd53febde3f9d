"""Every benchmark suite: its name, one line on what it measures, and whether it starts ranks.

``distributed`` is True for suites that run over several real processes (their Suite names
``world_params``); a test checks it against the suites themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class SuiteEntry:
    """What one suite is, for listings and the site, without importing the suite."""

    name: str
    description: str
    distributed: bool  # multi-process: one real world of ranks per distinct world parameter
    # What a run at the defaults needs, shown on the page of a suite never run: the hardware in
    # words, and the minutes `repro bench NAME` took at its defaults on a 2-core CPU machine
    # (wall time of one run, rounded up to a tenth, on an otherwise idle machine; None: not
    # measured yet).
    needs: str = ""
    minutes: float | None = None


_SUITES = (
    SuiteEntry(
        "allreduce",
        distributed=True,
        description=(
            "All-reduce of a float32 buffer across real local ranks (gloo or "
            "MPI): latency, algorithm and bus bandwidth, #wrong."
        ),
        needs="local processes (real gloo ranks) on the CPU; 2+ cores",
        minutes=0.2,
    ),
    SuiteEntry(
        "alltoall",
        distributed=True,
        description=(
            "MoE dispatch all-to-all over real ranks with emulated nodes: flat, "
            "HALO (Piper Alg. 1) and RBD (X-MoE Sec. 4.2); time, algbw/busbw, "
            "inter-node bytes actually sent, #wrong."
        ),
        needs="local processes (real gloo ranks) on the CPU; 2+ cores",
        minutes=0.1,
    ),
    SuiteEntry(
        "alltoall-validation",
        distributed=True,
        description=(
            "The all-to-all simulator against real local runs: flat, HALO and RBD "
            "over 2-16 ranks and 1 KiB-16 MiB per rank, over gloo and MPI, measured vs "
            "predicted on a profile fitted to other (flat, world- and node-wide) runs, "
            "error per cell and median per backend and algorithm, and how much of each "
            "prediction is the dispatch's profiled host work."
        ),
        needs="local processes (real gloo and MPI ranks) on the CPU; 2+ cores",
        minutes=2.5,
    ),
    SuiteEntry(
        "attention",
        distributed=False,
        description=(
            "Causal SDPA attention throughput vs sequence length per zoo model "
            "shape (Piper Fig. 3)."
        ),
        needs="one process on this machine's device (CPU, or a GPU where there is one)",
        minutes=0.2,
    ),
    SuiteEntry(
        "dispatch-stages",
        distributed=True,
        description=(
            "Per-stage time of one MoE dispatch, flat vs RBD, over real ranks "
            "with emulated nodes, and the bytes each sends across nodes (X-MoE "
            "Fig. 12)."
        ),
        needs="local processes (real gloo ranks) on the CPU; 2+ cores",
        minutes=0.1,
    ),
    SuiteEntry(
        "eplb-policy",
        distributed=False,
        description=(
            "DeepSeek EPLB replica policies, global vs hierarchical (groups packed "
            "onto nodes): inter-node dispatch bytes and max/mean GPU load on "
            "synthetic and group-limited (DeepSeek-V3) routing traces."
        ),
        needs="one process on this machine's device (CPU, or a GPU where there is one)",
        minutes=0.1,
    ),
    SuiteEntry(
        "expert-gemm",
        distributed=False,
        description=(
            "Grouped expert GEMM (sequential, padded_bmm, grouped_mm) vs an "
            "equal-FLOPs dense GEMM, throughput vs tokens per expert and expert "
            "shape (Piper Fig. 4)."
        ),
        needs="one process on this machine's device (CPU, or a GPU where there is one)",
        minutes=0.5,
    ),
    SuiteEntry(
        "feplb-balancer",
        distributed=False,
        description=(
            "FEPLB greedy per-micro-batch balancer: CPU decision time (goal <= "
            "20 us median for 128 experts, EP=8, dyn=4)."
        ),
        needs="one process on this machine's device (CPU, or a GPU where there is one)",
        minutes=0.1,
    ),
    SuiteEntry(
        "gemm",
        distributed=False,
        description=(
            "Dense GEMM (torch.mm) throughput vs square matrix size: the device's ceiling."
        ),
        needs="one process on this machine's device (CPU, or a GPU where there is one)",
        minutes=0.1,
    ),
    SuiteEntry(
        "imbalance",
        distributed=True,
        description=(
            "Every registered balancer on every routing workload (the eight "
            "standard token-imbalance workloads, our synthetic trace, real-count "
            "OLMoE workloads) at EP 2-16: stragglers, max/mean, bytes moved, "
            "decision time, #wrong against the exact oracle; stats, real gloo "
            "ranks, or simulated."
        ),
        needs="local processes (real gloo ranks) on the CPU; 2+ cores",
    ),
    SuiteEntry(
        "llep-layer",
        distributed=True,
        description=(
            "Least-loaded EP vs plain EP MoE layer, forward+backward on skewed "
            "routing over real ranks: busiest-rank rows, time, difference from "
            "plain EP."
        ),
        needs="local processes (real gloo ranks) on the CPU; 2+ cores",
        minutes=0.1,
    ),
    SuiteEntry(
        "memcopy",
        distributed=False,
        description=(
            "Memory bandwidth of one large float32 tensor copy (read + write), "
            "the calibration copy ceiling."
        ),
        needs="one process on this machine's device (CPU, or a GPU where there is one)",
        minutes=0.1,
    ),
    SuiteEntry(
        "moe-dispatch",
        distributed=False,
        description=(
            "Padding-free (pft) vs capacity-padded dispatch: time and peak "
            "memory of gating, buffer dispatch and buffer combine (X-MoE Sec. "
            "5.4.1); with the peers extra, Megatron-core and DeepSpeed beside."
        ),
        needs="one process on this machine's device (CPU, or a GPU where there is one)",
        minutes=3.3,
    ),
    SuiteEntry(
        "moe-layer",
        distributed=True,
        description=(
            "MoE layer forward breakdown (gating, buffer dispatch, dispatch "
            "all-to-all, expert, combine all-to-all, buffer combine), pft vs "
            "padded, real EP ranks; with the peers extra Megatron-core and "
            "DeepSpeed, their own expert-parallel layers on several ranks "
            "(forward + backward with --backward 1)."
        ),
        needs="local processes (real gloo ranks) on the CPU; 2+ cores",
        minutes=0.6,
    ),
    SuiteEntry(
        "pp-ep-train",
        distributed=True,
        description=(
            "PP x EP pipelined training over real ranks: step time, bubble, "
            "per-stage activation memory and in-flight micro-batches, loss per "
            "step."
        ),
        needs="local processes (real gloo ranks) on the CPU; 2+ cores",
        minutes=0.1,
    ),
    SuiteEntry(
        "rank-layout-traffic",
        distributed=True,
        description=(
            "EP-first vs DP-first rank layout over real ranks with emulated "
            "nodes: bytes of the token all-to-all and the expert-gradient ring "
            "all-reduce per link class."
        ),
        needs="local processes (real gloo ranks) on the CPU; 2+ cores",
        minutes=0.1,
    ),
    SuiteEntry(
        "ssmb-memory",
        distributed=True,
        description=(
            "MoE-block activation bytes kept for backward per rank, with and "
            "without sequence sharding (SSMB), over real TP = EP ranks (X-MoE "
            "Fig. 13)."
        ),
        needs="local processes (real gloo ranks) on the CPU; 2+ cores",
        minutes=0.2,
    ),
    SuiteEntry(
        "vocab-loss",
        distributed=True,
        description=(
            "Sharded vocabulary projection + exact cross-entropy over P real "
            "ranks vs the dense one: peak resident memory per rank, time, "
            "difference from dense."
        ),
        needs="local processes (real gloo ranks) on the CPU; 2+ cores",
        minutes=1.8,
    ),
)

SUITES: MappingProxyType[str, SuiteEntry] = MappingProxyType({s.name: s for s in _SUITES})
