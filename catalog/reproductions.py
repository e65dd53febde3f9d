"""Every reproduction of the DESIGN.md inventory, implemented or planned, with its description.

One entry per id: which paper and which element of it, how our numbers are made (HOW), a title
and a short line for listings, the longer description shown on its report, and the issue that
builds it. ``implemented`` is True exactly for the ids that have a spec module in
reproductions/ (a test checks both directions), so `repro list` can say what runs without
importing any spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from moe_repro.catalog.papers import PAPERS

HOW = {"A": "analytic", "M": "Monte Carlo", "R": "real measurement", "S": "simulated"}
# What each letter means, for the index and every page (issue 16: A, R and S explained). A cell's
# letters are not typed: the code that measured, simulated or sampled says so when it runs
# (components/provenance.py); a number made while none of them ran is A.
HOW_MEANING = {
    "A": "closed-form arithmetic (paper equations, the resource model, counting) evaluated "
    "exactly; nothing measured, simulated or sampled",
    "M": "an expectation estimated from seeded random samples (e.g. redundancy over sampled "
    "routings): deterministic per seed",
    "R": "run for real on this machine: kernels or collectives timed over real processes, "
    "memory read from counters, a model trained",
    "S": "the flow-level network simulator or a replay of balancers on a routing trace, "
    "predicting what a machine or a training run this is not would do; every simulated "
    "number says so and carries its assumptions",
}


@dataclass(frozen=True)
class ReproductionEntry:
    """What one reproduction is: everything about it except how it computes."""

    id: str
    paper: str  # key of PAPERS
    element: str  # the paper element as the paper names it: "Table IV", "Fig. 8", "Sec. 3.4"
    # Letters of HOW joined with "+", e.g. "A", "R+S": what the cells' how (derived by the code,
    # components/provenance.py) add up to; listed here for `repro list` and `--how` before any
    # run, and checked against a run by tests/test_provenance.py.
    how: str
    title: str
    what: str  # one short line for listings
    description: str
    implemented: bool
    issue: int | None = None  # the issue that builds it
    # What a run at the defaults needs, shown on the page of one not run yet: the hardware in
    # words, and the minutes `repro run ID` takes at its defaults on a 2-core CPU machine, rounded
    # up to a tenth (None: not measured yet): wall time of one run on an idle machine, with no
    # cached FEPLB traces (MOE_REPRO_CACHE) where the reproduction draws them. Where no idle
    # machine was to be had, the CPU time (user + system) of that run stands in for it, with the
    # date and load beside the entry. `repro run --all --budget` runs what fits by these.
    needs: str = ""
    minutes: float | None = None
    # The same for `repro run ID --full`, where its full run is longer (None: not measured).
    full_minutes: float | None = None

    @property
    def paper_element(self) -> str:
        """The element with the paper's short name in front: "Piper Table IV"."""
        return f"{PAPERS[self.paper].short} {self.element}"

    @property
    def how_letters(self) -> set[str]:
        """The HOW letters named: "R+S" -> {"R", "S"}; "A (+R scaled)" -> {"A", "R"}."""
        return {part.strip()[:1] for part in self.how.split("+") if part.strip()[:1] in HOW}


_REPRODUCTIONS = (
    # Piper
    ReproductionEntry(
        id="piper-table1",
        paper="piper",
        element="Table I",
        how="A",
        title="Total and active parameters of state-of-the-art MoE models",
        what="total/active parameters of the SOTA MoE configs from architecture",
        description=(
            "Parameter counts computed from each model's architecture (public configs) "
            "beside Piper Table I, with the table's configuration columns checked "
            "against the configs."
        ),
        implemented=True,
        issue=3,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="piper-table4",
        paper="piper",
        element="Table IV",
        how="A",
        title="Per-layer worst-case expert-migration send size and latency per GPU",
        what="worst-case expert-migration send size and latency per GPU",
        description=(
            "Bytes each GPU sends when all experts of one layer are reassigned over 8 "
            "GPUs, and the time that takes at 50 GB/s, from the model zoo and the "
            "migration cost model."
        ),
        implemented=True,
        issue=2,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="piper-fig3",
        paper="piper",
        element="Fig. 3",
        how="R",
        title="Attention throughput vs sequence length per model shape",
        what="attention throughput vs sequence length per model shape",
        description=(
            "Causal SDPA attention TFLOP/s vs sequence length for zoo model head "
            "shapes, measured on this machine (scaled head count)."
        ),
        implemented=True,
        issue=6,
        needs="one process; times attention on this machine's device (CPU or GPU)",
        minutes=0.2,
    ),
    ReproductionEntry(
        id="piper-fig4",
        paper="piper",
        element="Fig. 4",
        how="R",
        title="Expert GEMM throughput vs tokens per expert",
        what="expert GEMM throughput vs tokens per expert",
        description=(
            "Grouped expert GEMM variants and an equal-FLOPs dense GEMM, TFLOP/s vs "
            "tokens per expert per model shape, measured on this machine."
        ),
        implemented=True,
        issue=6,
        needs="one process; times grouped expert GEMMs on this machine's device (CPU or GPU)",
        minutes=0.4,
    ),
    ReproductionEntry(
        id="piper-fig5",
        paper="piper",
        element="Fig. 5",
        how="R+S",
        title="All-to-all bandwidth vs message size, 2-64 GPUs on 1-8 nodes",
        what="all-to-all bandwidth vs message size, 2-64 GPUs on 1-8 nodes",
        description=(
            "Simulated flat all-to-all busbw on the Frontier profile for 2-64 GCDs, and "
            "real runs here beside the simulator calibrated on them."
        ),
        implemented=True,
        issue=5,
        needs="2+ CPU cores: real all-to-all over local gloo ranks, then the network simulator",
        minutes=0.2,
    ),
    ReproductionEntry(
        id="piper-fig8",
        paper="piper",
        element="Fig. 8",
        how="S",
        title="HALO vs flat all-to-all latency on Frontier, 1-512 nodes (simulated)",
        what="HALO vs flat latency, 16-512 nodes",
        description=(
            "Flow-level simulation of the shared flat and HALO schedules on the "
            "Frontier profile; predicted speedups beside the paper's stated 1.1x-9x "
            "range."
        ),
        implemented=True,
        issue=5,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="piper-fig9",
        paper="piper",
        element="Fig. 9",
        how="R",
        title="Expert load distribution over a real small training run without balancing loss",
        what="expert load distribution over a real (small) training run",
        description=(
            "Trains a 16-expert MoE on stdlib source on CPU with no aux loss and "
            "records per-layer expert loads at every step."
        ),
        implemented=True,
        issue=7,
        needs="one process: trains a small MoE on this machine's device (CPU or GPU)",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="piper-alg2",
        paper="piper",
        element="Alg. 2",
        how="R",
        title="Hill-climbing expert migration: imbalance before/after, swaps, overhead",
        what="imbalance before/after hill-climbing migration, swaps, overhead",
        description=(
            "Threshold-triggered Alg. 2 replayed over the real routing of piper-fig9's "
            "CPU run and a synthetic trace; migration cost from Piper's cost model."
        ),
        implemented=True,
        issue=7,
        needs="one process: trains a small MoE on this machine's device (CPU or GPU)",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="piper-fig10",
        paper="piper",
        element="Fig. 10",
        how="A",
        title="Per-GPU memory vs node count and strategy; minimum nodes",
        what="per-GPU memory vs nodes and strategy; minimum nodes",
        description=(
            "Per-GPU peak memory of the Super model under expert-data parallelism, "
            "GPipe and 1F1B pipelined expert parallelism, against the 64 GB HBM line."
        ),
        implemented=True,
        issue=3,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="piper-fig11",
        paper="piper",
        element="Fig. 11",
        how="A",
        title="Single-layer throughput ceiling per model on one node",
        what="single-layer throughput ceiling per model",
        description=(
            "Estimated TFLOPS/GPU of one MoE layer of each model under expert-data "
            "parallelism on one node, beside Piper's measurements."
        ),
        implemented=True,
        issue=3,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="piper-fig12",
        paper="piper",
        element="Fig. 12",
        how="A",
        title="Full-model TFLOPS and MFU of SOTA MoE models (estimates vs Piper)",
        what="full-model TFLOPS/MFU per model",
        description=(
            "Resource-model estimates of per-GPU TFLOPS and MFU for the models of Fig. "
            "12 at the smallest feasible node count on the Frontier profile."
        ),
        implemented=True,
        issue=3,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="piper-fig13",
        paper="piper",
        element="Fig. 13",
        how="A",
        title="Piper vs frameworks on Small/Medium/Large/Super (estimates)",
        what="Piper vs frameworks on Small/Medium/Large/Super",
        description=(
            "Resource-model estimates of Piper's per-GPU TFLOPS on the caption's GPU "
            "counts; the other frameworks' measured columns are marked not reproduced."
        ),
        implemented=True,
        issue=3,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="piper-fig14",
        paper="piper",
        element="Fig. 14",
        how="A",
        title="M10B family: sizes, estimated TFLOPS per GPU and weak-scaling efficiency",
        what="M10B family: sizes, TFLOPS, weak-scaling efficiency",
        description=(
            "Parameter counts of the M10B family from its architecture, and the "
            "resource model's TFLOPS/GPU estimate at the paper's node counts on the "
            "Frontier profile."
        ),
        implemented=True,
        issue=3,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="piper-eq4",
        paper="piper",
        element="Eq. 4-5",
        how="R",
        title="Per-stage activation memory of the 1F1B PP x EP trainer vs Eq. 4-5",
        what="measured per-stage memory skew of the 1F1B trainer vs the model",
        description=(
            "Real PP x EP training runs measure, per stage, the peak activation bytes "
            "held for backward and the micro-batches in flight at that peak, against "
            "Eq. 4's (PP - i) under 1F1B and Eq. 3's M under GPipe."
        ),
        implemented=True,
        issue=8,
        needs="4 local processes (gloo ranks, pipeline stages) on CPU",
        minutes=0.2,
    ),
    ReproductionEntry(
        id="piper-bubble",
        paper="piper",
        element="Sec. III-D",
        how="R",
        title="Measured pipeline bubble of the PP x EP trainer vs (PP-1)/(M+PP-1); convergence",
        what="measured pipeline bubble vs (PP-1)/(M+PP-1)",
        description=(
            "Real PP x EP 1F1B training runs for several micro-batch counts: the "
            "measured idle fraction of each stage against (PP-1)/(M+PP-1), and the loss "
            "curve of the longest run on real text."
        ),
        implemented=True,
        issue=8,
        needs="2 local processes (gloo ranks, pipeline stages) on CPU",
        minutes=0.2,
    ),
    # X-MoE
    ReproductionEntry(
        id="xmoe-table2",
        paper="xmoe",
        element="Table 2",
        how="A",
        title="Activation sizes of conventional vs fine-grained MoE layers",
        what="activation sizes of conventional vs fine-grained MoE",
        description=(
            "A_dispatch, A_combine and the FFN intermediates of M_conv and M_spec from "
            "the activation model, in the table's units."
        ),
        implemented=True,
        issue=3,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="xmoe-table3",
        paper="xmoe",
        element="Table 3",
        how="A",
        title="Parameter counts of X-MoE's Small/Medium/Large/Super models",
        what="parameter counts of Small/Medium/Large/Super",
        description="Total and activated parameters computed from Table 3's H, H_FFN, E, k and L.",
        implemented=True,
        issue=3,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="xmoe-table4",
        paper="xmoe",
        element="Table 4",
        how="A+R",
        title="Activation memory per MoE layer (Large model): theory vs measured",
        what="activation memory per MoE layer: theory and measured (scaled)",
        description=(
            "The theoretical activation memory of one padding-free MoE layer from the "
            "activation model, and a scaled Large layer measured here "
            "(saved-for-backward bytes and forward peak, padding-free vs "
            "capacity-padded) beside the theory at the same config; the full-size "
            "Frontier columns are marked not reproduced."
        ),
        implemented=True,
        issue=3,
        needs="one process: measures activation memory on this machine's device",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="xmoe-fig3",
        paper="xmoe",
        element="Fig. 3",
        how="A+R",
        title="Memory distribution of one conventional vs fine-grained MoE layer",
        what="memory distribution of one conventional vs fine-grained layer",
        description=(
            "Per-GPU model-state and activation memory of one M_conv and one M_spec "
            "layer from the memory model, and both layers' activations measured here at "
            "a scaled config beside the theory at that config."
        ),
        implemented=True,
        issue=3,
        needs="one process: measures activation memory on this machine's device",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="xmoe-fig4",
        paper="xmoe",
        element="Fig. 4",
        how="A+M",
        title="Redundancy rate of dispatched tokens vs EP size (256 experts, top-8)",
        what="redundancy rate of dispatched tokens vs EP size",
        description=(
            "Share of inter-node token copies that only repeat a token already sent to "
            "that node, per EP size: closed form for uniform routing, and counted by "
            "RBD's pilot selection on uniform and skewed routing."
        ),
        implemented=True,
        issue=4,
        needs="one process on the CPU (seeded sampling), no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="xmoe-fig11",
        paper="xmoe",
        element="Fig. 11",
        how="R",
        title=(
            "MoE layer forward time breakdown: padding-free (X-MoE) vs capacity-padded "
            "(DeepSpeed-MoE)"
        ),
        what="MoE layer time breakdown, padding-free vs padded",
        description=(
            "Gating, buffer dispatch, dispatch all-to-all, expert, combine all-to-all "
            "and buffer combine times of one MoE layer forward over real EP ranks on "
            "this machine, pft vs padded, beside the speedups X-MoE reports for its "
            "Small model."
        ),
        implemented=True,
        issue=6,
        needs="2 local processes (gloo ranks) on CPU; times the MoE layer stages",
        minutes=0.8,
        full_minutes=15.0,
    ),
    ReproductionEntry(
        id="xmoe-fig12",
        paper="xmoe",
        element="Fig. 12",
        how="R+S",
        title="Dispatch time with and without redundancy-bypassing dispatch (RBD)",
        what="dispatch time with and without RBD",
        description=(
            "Per-stage dispatch times of flat and RBD dispatch over real ranks with "
            "emulated nodes and the inter-node bytes each sends (real); the paper's "
            "32-GPU point simulated on the Frontier profile."
        ),
        implemented=True,
        issue=4,
        needs="4 local processes (gloo ranks, 2 emulated nodes) on CPU, then the simulator",
        minutes=0.5,
    ),
    ReproductionEntry(
        id="xmoe-fig13",
        paper="xmoe",
        element="Fig. 13",
        how="A+R",
        title="SSMB: MoE activation memory vs TP degree, with and without sequence sharding",
        what="SSMB memory vs TP degree",
        description=(
            "Activation bytes of the MoE block per rank for TP = 1, 2, 4 with and "
            "without SSMB: measured over real ranks at a scaled config, and from "
            "X-MoE's activation model for the Large model."
        ),
        implemented=True,
        issue=10,
        needs="up to 4 local processes (gloo ranks, TP = 1, 2, 4) on CPU",
        minutes=0.2,
    ),
    ReproductionEntry(
        id="xmoe-fig17",
        paper="xmoe",
        element="Fig. 17",
        how="A",
        title="SSMB vs TED memory-saving advantage regions",
        what="SSMB vs TED advantage regions",
        description=(
            "Which of SSMB and TED saves more memory per model and sequence length, "
            "from X-MoE's App. C.2 trade-off."
        ),
        implemented=True,
        issue=3,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="xmoe-fig19",
        paper="xmoe",
        element="Fig. 19",
        how="S",
        title="All-to-all time vs GPU count, 8-1024 GCDs (simulated)",
        what="all-to-all time vs GPU count 8-1024",
        description=(
            "Flow-level simulation of the MoE dispatch all-to-all on the Frontier "
            "profile from 8 to 1024 GCDs, beside X-MoE's three observed regions."
        ),
        implemented=True,
        issue=5,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="xmoe-appc1",
        paper="xmoe",
        element="App. C.1",
        how="A+R",
        title=(
            "EP-first vs DP-first placement: all-to-all and gradient all-reduce bytes per "
            "link class"
        ),
        what="EP-first vs DP-first placement communication volumes",
        description=(
            "Bytes per link class of the token all-to-all and the expert-gradient "
            "all-reduce under both placements: counted from real small runs and from "
            "the formula at full scale."
        ),
        implemented=True,
        issue=10,
        needs="4 local processes (gloo ranks, 2 emulated nodes) on CPU",
        minutes=0.1,
    ),
    # FEPLB: minutes are the CPU time (user + system) of one cold run (MOE_REPRO_CACHE=off) on
    # the 2-core machine, rounded up to a tenth of a minute: no idle machine was available, and
    # CPU time is what an idle one would take as wall time. The runs: docs/measurement-log.md.
    ReproductionEntry(
        id="feplb-table2",
        paper="feplb",
        element="Table 2",
        how="S",
        title="Per-layer MoE forward/backward time per method",
        what="per-layer forward/backward time per method",
        description=(
            "Table 2's printed H100 timings beside our modelled grouped-GEMM makespan per "
            "method on synthetic traces (not-comparable: a part of the layer, not the "
            "layer), and the forward saving of each balancer over Before LB, which the "
            "paper's differences give, graded over 5 seeds; Triton Dist., Tutel and the "
            "backward columns are not reproduced here."
        ),
        implemented=True,
        issue=7,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=4.0,
    ),
    ReproductionEntry(  # how: the balancers replay synthetic routing
        id="feplb-table3",
        paper="feplb",
        element="Table 3",
        how="S",
        title="Token straggler (max - mean) per PP/EP: Before LB, FasterMoE, FEPLB",
        what="token straggler per PP/EP and method",
        description=(
            "Synthetic GLM-5-shaped routing replayed through no balancing, FasterMoE "
            "shadow experts and FEPLB's greedy per-micro-batch balancer; token "
            "straggler per FEPLB Sec. 3.1."
        ),
        implemented=True,
        issue=7,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=8.1,
    ),
    ReproductionEntry(  # how: the balancers replay synthetic routing
        id="feplb-table4",
        paper="feplb",
        element="Table 4",
        how="S",
        title="GEMM straggler (max - mean, ms) per PP/EP: Before LB, FasterMoE, FEPLB",
        what="GEMM straggler per PP/EP and method",
        description=(
            "Synthetic GLM-5-shaped routing replayed through the balancers; per-device "
            "grouped-GEMM time modelled on an H100 roofline; GEMM straggler per FEPLB "
            "Sec. 3.1."
        ),
        implemented=True,
        issue=7,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=6.2,
    ),
    ReproductionEntry(
        id="feplb-fig4",
        paper="feplb",
        element="Fig. 4",
        how="S",
        title="EP communication per method at EP = 8: extra dispatch/combine time",
        what="EP communication overhead per method (modelled time)",
        description=(
            "Deduplicated EP rows from per-token synthetic routing for Before LB, "
            "FasterMoE pipe=1/2 and FEPLB, replayed on the flow simulator as dispatch "
            "and combine time (the paper's quantity); copy-path bytes reported apart."
        ),
        implemented=True,
        issue=7,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=5.0,
    ),
    ReproductionEntry(  # how: the balancers replay synthetic routing
        id="feplb-fig6",
        paper="feplb",
        element="Fig. 6",
        how="S",
        title="Token straggler vs dynamic expert count dyn = 2, 4, 8",
        what="token straggler vs dyn = 2, 4, 8",
        description=(
            "FEPLB's greedy balancer on the synthetic traces of feplb-table3 with dyn = 2, 4, 8."
        ),
        implemented=True,
        issue=7,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=4.3,
    ),
    # MoP
    ReproductionEntry(
        id="mop-table1",
        paper="mop",
        element="Table 1",
        how="A",
        title="Per-rank memory per component under MoP",
        what="per-rank memory per component",
        description=(
            "MoP Table 1's per-component per-rank memory evaluated in GB for the three model sizes."
        ),
        implemented=True,
        issue=3,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="mop-table2",
        paper="mop",
        element="Tables 2-3",
        how="A",
        title="Which contexts fit: MoP vs FSDP-best (the OOM pattern of Table 2)",
        what="which contexts fit (MoP vs FSDP-best), the OOM pattern",
        description=(
            "Per-rank memory estimates of MoP and of Table 3's FSDP-best configurations "
            "against 141 GB, compared with Table 2's fits/OOM pattern."
        ),
        implemented=True,
        issue=3,
        needs="any machine: one process on the CPU, no accelerator",
        minutes=0.1,
    ),
    ReproductionEntry(
        id="mop-vocab",
        paper="mop",
        element="Sec. 3.4",
        how="R",
        title="Sharded vocabulary loss: exact, peak memory O(NV/P)",
        what="sharded vocabulary loss: exact, peak memory O(NV/P)",
        description=(
            "Peak resident memory of one forward+backward of the sharded vocabulary "
            "projection + loss over P real ranks, beside the dense projection + "
            "cross-entropy, and the largest loss/gradient difference from the dense "
            "one."
        ),
        implemented=True,
        issue=10,
        needs="up to 4 local processes (gloo ranks) on CPU",
        minutes=0.8,
    ),
    ReproductionEntry(
        id="mop-llep",
        paper="mop",
        element="Sec. 3.3",
        how="R",
        title="Least-loaded EP vs plain EP on skewed routing (real gloo ranks)",
        what="least-loaded EP vs plain EP on skewed routing",
        description=(
            "LLEP and plain EP layers on the same skewed routing over real ranks: "
            "busiest-rank rows, layer time, exactness."
        ),
        implemented=True,
        issue=7,
        needs="2 local processes (gloo ranks) on CPU",
        minutes=0.1,
    ),
)

REPRODUCTIONS: MappingProxyType[str, ReproductionEntry] = MappingProxyType(
    {r.id: r for r in _REPRODUCTIONS}
)
