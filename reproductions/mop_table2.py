"""mop-table2: which contexts fit, MoP vs the best FSDP2 plan (MoP Tables 2-3: the OOM pattern).

For each model, node count and context of Table 2 we estimate the per-rank memory of MoP's plan
(mop-table1's ``mop_plan_bytes``: D = W, P = 8) and of Table 3's FSDP-best configuration
(``fsdp_best_bytes`` here) from the public formulas (components/resources/formulas.py). Each cell
of Table 2 is a statement in words, quoted as printed: a throughput says the configuration ran,
"OOM" that it ran out of device memory. The policy reads "OOM" as "over 141 GB" per rank and a
printed throughput as "at most 141 GB" (grading.read_claim) and grades our per-rank bytes
against that. Throughputs themselves are not estimated.

FSDP-best per rank, W = FSDP x CP x TP GPUs, EP carved out of them (Table 3):

- model state: ``formulas.model_state_bytes`` at ZeRO stage 3 (MoP Sec. 2.3 Eq. 2: ZeRO-3 =
  FSDP FULL_SHARD) with MoP Eq. 1's 16 B/param (preset ``"mop"``), the optimizer on the host
  where Table 3 says "CPU offload": the dense weights split by TP and sharded over FSDP x CP, the
  routed experts split by EP and sharded over the W / EP ranks left;
- activations: ``formulas.moe_activation_bytes_per_layer`` with N = S / CP tokens per rank, TP
  with sequence parallelism, FlashAttention; full activation checkpointing (every layer's input
  kept + one layer's working set; the least memory of the modes, assumed: MoP does not say);
- FSDP2's prefetch: two layers' gathered bf16 weights; bf16 + fp32 logits of N V / TP (loss
  parallel); the platform's framework overhead.

Three FSDP-best cells fit here where Table 2 prints OOM (claim-fails) (600B @ 128K, 1T @ 512K, 1T @ 1M). No
cause is established: ``WHAT_IF`` lists the candidates tested one at a time (none applied), and
``context_factor_bounds`` shows that no single factor on the context-dependent bytes fits all
three models' borders; the assumptions report both.
"""

from __future__ import annotations

from moe_repro.components.model.params import layer_params
from moe_repro.components.model.zoo import MoEModel, get_model
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources import formulas as F
from moe_repro.reproductions.mop_table1 import (
    ACT_BYTES,
    MOP_SETTINGS,
    PLATFORM,
    PRECISION,
    largest_dense_layer,
    mop_plan_bytes,
    settings_lines,
)
from moe_repro.reproductions.spec import Figure, PaperClaim, Reproduction, Result

_SRC = "MoP Table 2 (tokens/s/GPU as printed; 'OOM': out of device memory)"
CTX = {"64K": 65536, "128K": 131072, "256K": 262144, "512K": 524288, "1M": 1048576}
# model key -> label, nodes, Table 3 (fsdp, ep, cp, tp, offload), {context: (MoP, FSDP-best) as printed}
_TABLE = {
    "mop-120b": (
        "120B",
        2,
        (1, 16, 16, 1, False),
        {
            "128K": ("1043", "223"),
            "256K": ("681", "OOM"),
            "512K": ("424", "OOM"),
            "1M": ("393", "OOM"),
        },
    ),
    "mop-600b": (
        "600B",
        8,
        (16, 8, 2, 2, True),
        {
            "64K": ("236", "39"),
            "128K": ("220", "OOM"),
            "256K": ("225", "OOM"),
            "512K": ("213", "OOM"),
            "1M": ("213", "OOM"),
        },
    ),
    "mop-1t": (
        "1T",
        12,
        (3, 96, 4, 8, True),
        {
            "128K": ("166", "25"),
            "256K": ("140", "17"),
            "512K": ("108", "OOM"),
            "1M": ("100", "OOM"),
        },
    ),
}
SYSTEMS = ("MoP", "FSDP-best")
# Each cell of Table 2 is a statement in words: a printed throughput says the configuration ran
# (fit in device memory), "OOM" that it did not. Quoted as printed; graded on our per-rank bytes.
PAPER_CLAIMS = [
    PaperClaim(f"{label} @ {ctx}", col, v, _SRC)
    for label, _, _, rows in _TABLE.values()
    for ctx, pair in rows.items()
    for col, v in zip(SYSTEMS, pair)
]
FSDP_ZERO_STAGE = 3  # MoP Sec. 2.3: "ZeRO-3 / FSDP-FULL_SHARD"
LOGIT_BYTES = 2 + 4  # bf16 logits and the fp32 copy the loss reads (not stated)

# What MoP states about its FSDP-best baseline (used value, what the paper says, where).
FSDP_SETTINGS: list[dict[str, str]] = [
    {
        "setting": "framework",
        "used": "FSDP2 (TorchTitan) with TP, CP, EP and optimizer CPU offload, "
        "Table 3's degrees per model",
        "paper": "'a strong, fully featured FSDP2 baseline as implemented in TorchTitan ... Megatron-style "
        "tensor (TP), context (CP), and expert (EP) parallelism [13, 5], as well as CPU offloading "
        "of the optimizer state [12]'; Table 3: FSDP/EP/CP/TP/offload per model",
        "source": "Sec. 4 (Baselines), Table 3",
    },
    {
        "setting": "ZeRO stage",
        "used": "3 (FSDP FULL_SHARD): dense weights / TP sharded over FSDP x CP, "
        "experts / EP sharded over W / EP",
        "paper": "'ZeRO-3 / FSDP-FULL_SHARD additionally shards the parameters ... 16Θ/W bytes per rank'; "
        "how TorchTitan folds CP and EP into the shard group is not stated",
        "source": "Sec. 2.3 Eq. 2",
    },
    {
        "setting": "precision",
        "used": "16 B/param (bf16 weights and grads, fp32 master + AdamW m, v; "
        "formulas preset 'mop' with the offload flag of Table 3)",
        "paper": "not stated for the baseline; Eq. 1's 16Θ is stated for mixed-precision AdamW training",
        "source": "Sec. 2.1 Eq. 1",
    },
    {
        "setting": "optimizer offload",
        "used": "Table 3: 120B no; 600B and 1T yes (12 B/param on the host, "
        "weights and grads 4 B/param stay on the GPU)",
        "paper": "'CPU offloading of the optimizer state'",
        "source": "Sec. 4, Table 3",
    },
    {
        "setting": "TP / SP",
        "used": "Table 3's TP with sequence parallelism (activations / TP)",
        "paper": "Megatron-style TP with [5] (sequence parallelism, Sec. 2.2) named beside it; SP not "
        "stated per configuration",
        "source": "Sec. 4, Sec. 2.2, Table 3",
    },
    {
        "setting": "CP",
        "used": "Table 3's CP: N = S / CP tokens per rank",
        "paper": "Table 3 degrees",
        "source": "Table 3",
    },
    {
        "setting": "recompute",
        "used": "full activation checkpointing (each layer's input kept, one layer "
        "recomputed); the notes give the total without checkpointing",
        "paper": "not stated",
        "source": "Sec. 4, Table 3",
    },
    {
        "setting": "attention kernel",
        "used": "FlashAttention (no S x S scores)",
        "paper": "not stated",
        "source": "Sec. 4",
    },
    {
        "setting": "FSDP prefetch and logits",
        "used": "two layers' gathered bf16 weights; bf16 + fp32 logits of N V / TP (loss parallel)",
        "paper": "not stated",
        "source": "Sec. 4",
    },
    {
        "setting": "batch and sequence lengths",
        "used": "one sequence per CP x TP group per step; Table 2's contexts (64K-1M)",
        "paper": "contexts stated; the baseline's batch is not",
        "source": "Table 2",
    },
]


def _activations(m: MoEModel, seq: int, tp: int, cp: int, recompute: str) -> dict[str, float]:
    """Checkpointed layer inputs and the working set of the layer being recomputed (``"full"``), or
    every layer's activations kept (``"none"``; FlashAttention keeps no scores, which formulas
    counts as recompute="selective")."""
    sp = tp > 1
    act = lambda moe, mode: F.moe_activation_bytes_per_layer(
        m, seq, 1, moe=moe, t=tp, sp=sp, cp=cp, recompute=mode, bytes_per_value=ACT_BYTES
    )
    kinds = [(True, m.n_moe_layers), (False, m.n_dense_layers)]
    if recompute == "full":
        return {
            "checkpointed activations": sum(n * act(moe, "full") for moe, n in kinds if n),
            "layer working set": max(act(moe, "selective") for moe, n in kinds if n),
        }
    if recompute == "none":
        return {
            "activations (no checkpointing)": sum(
                n * act(moe, "selective") for moe, n in kinds if n
            )
        }
    raise ValueError(f"recompute must be 'full' or 'none', got {recompute!r}")


def fsdp_best_bytes(
    m: MoEModel,
    fsdp: int,
    ep: int,
    cp: int,
    tp: int,
    offload: bool,
    seq: int,
    overhead_bytes: float = 0.0,
    recompute: str = "full",
) -> dict[str, float]:
    """Per-rank device bytes of one FSDP-best configuration (module docstring)."""
    W = fsdp * cp * tp
    if W % ep:
        raise ValueError(f"EP {ep} does not divide FSDP x CP x TP = {W}")
    par = F.parameters(m)
    experts = par["routed_experts"]
    dense = par["total"] - experts
    state = lambda n, over: F.model_state_bytes(
        n, over, FSDP_ZERO_STAGE, PRECISION, offload_optimizer=offload
    )["total"]
    _, layer_experts = layer_params(m, moe=True)
    weights = F.precision(PRECISION).weights
    return {
        "dense state": state(dense / tp, fsdp * cp),
        "expert state": state(experts / ep, W // ep),
        "all-gather buffers": 2 * weights * (largest_dense_layer(m) / tp + layer_experts / ep),
        **_activations(m, seq, tp, cp, recompute),
        "logits": LOGIT_BYTES * seq / cp * (m.vocab or 0) / tp,
        "framework overhead": overhead_bytes,
    }


# Candidate causes tested for the FSDP-best cells where Table 2 prints OOM and we fit (none was
# established). Each adds per-rank bytes to fsdp_best_bytes; the reproduction reports which
# deviating cells each one would flip and which matching cells it would break. None is applied.
WHAT_IF = {
    # FSDP2 keeps the sharded parameters in fp32 (torch MixedPrecisionPolicy docstring: "FSDP ...
    # keeps the high-precision sharded parameters in memory anyway") and TorchTitan reduces
    # gradients in fp32 (mixed_precision_reduce = "float32"): if only Adam's m, v went to the
    # host, 4 + 4 B/param stay on the GPU instead of our 2 + 2.
    # Neither reading MoP or TorchTitan gives: MoP's optimizer state is master + m + v (Sec. 2.1,
    # 3.5: 12 B), and TorchTitan's CPU offload moves shards and grads to the host as well.
    "fp32 shards and grads on GPU": "weights + grads 8 B/param on the GPU (offloaded models; not "
    "MoP's 12 B 'optimizer state', Sec. 2.1, nor TorchTitan's offload)",
    # TorchTitan's loss casts the logits to fp32 and keeps fp32 log-probabilities; its backward
    # builds fp32 gradients: an upper reading of the loss working set, 16 B per logit (ours 6).
    "16 B per logit": "fp32 cross-entropy working set, 16 B per logit instead of 6",
    # FSDP2 backward: a layer's unsharded bf16 gradient and its fp32 copy for reduce-scatter
    # (reduce_dtype fp32), beside the two gathered layers already counted.
    "FSDP2 gradient buffers": "one layer's unsharded bf16 grads + fp32 reduce-scatter copy, 6 B/param",
    # Table 2 does not state the baseline's micro-batch; 2 sequences double every
    # context-dependent term.
    "micro-batch 2": "two sequences per step: activations and logits doubled",
    # TorchTitan's selective layer checkpointing ("every 2nd layer"): half the layers keep all.
    "checkpointing every 2nd layer": "half the layers keep their activations (no recompute)",
}


def what_if_bytes(
    m: MoEModel, fsdp: int, ep: int, cp: int, tp: int, offload: bool, seq: int
) -> dict[str, float]:
    """Bytes each WHAT_IF candidate adds to one rank of ``fsdp_best_bytes`` (no overhead term)."""
    base = fsdp_best_bytes(m, fsdp, ep, cp, tp, offload, seq)
    none = fsdp_best_bytes(m, fsdp, ep, cp, tp, offload, seq, recompute="none")
    _, layer_experts = layer_params(m, moe=True)
    layer = largest_dense_layer(m) / tp + layer_experts / ep
    ctx = base["checkpointed activations"] + base["layer working set"] + base["logits"]
    return {
        "fp32 shards and grads on GPU": base["dense state"] + base["expert state"]
        if offload
        else 0.0,
        "16 B per logit": base["logits"] * (16 / LOGIT_BYTES - 1),
        "FSDP2 gradient buffers": (2 + 4) * layer,
        "micro-batch 2": ctx,
        "checkpointing every 2nd layer": (sum(none.values()) - sum(base.values())) / 2,
    }


def context_factor_bounds(
    fits: dict[str, tuple[bool, float, float]], hbm: float
) -> tuple[float, float]:
    """(lo, hi) of a common factor r on the context-dependent bytes that reproduces one model's
    fit/OOM pattern: fits iff persistent + r ctx <= hbm. ``fits``: context -> (paper fits,
    persistent bytes, context-dependent bytes). r must exceed lo and not exceed hi."""
    lo, hi = 0.0, float("inf")
    for paper_fits, persistent, ctx in fits.values():
        r = (hbm - persistent) / ctx
        if paper_fits:
            hi = min(hi, r)
        else:
            lo = max(lo, r)
    return lo, hi


def compute(repro: Reproduction, params: dict) -> Result:
    P = int(params["P"])
    if P <= 0:
        raise ValueError("P must be positive")
    p = load_builtin(PLATFORM)
    hbm = p.hbm_bytes
    cells, extra = [], {}
    what_if: dict[str, dict[str, float]] = {}  # row -> candidate -> GB under HBM (negative: over)
    fsdp_fits: dict[str, tuple[bool, bool]] = {}  # row -> (paper fits, ours fits)
    bounds: dict[str, tuple[float, float]] = {}
    mem: dict[str, tuple[float, float, bool]] = {}  # row -> (MoP GB, FSDP-best GB, paper OOM)
    for key, (label, nodes, (fsdp, ep, cp, tp, off), rows) in _TABLE.items():
        m = get_model(key)
        W = nodes * p.gpus_per_node
        if fsdp * cp * tp != W:
            raise ValueError(
                f"{label}: Table 3's FSDP x CP x TP = {fsdp * cp * tp} is not {W} GPUs"
            )
        pattern: dict[str, tuple[bool, float, float]] = {}
        for ctx in rows:
            S = CTX[ctx]
            mop = mop_plan_bytes(m, W, W, P, S, p.overhead_bytes)
            mop_total = sum(mop.values())
            fs = fsdp_best_bytes(m, fsdp, ep, cp, tp, off, S, p.overhead_bytes)
            fs_total = sum(fs.values())
            no_ckpt = sum(
                fsdp_best_bytes(m, fsdp, ep, cp, tp, off, S, p.overhead_bytes, "none").values()
            )
            row = f"{label} @ {ctx}"
            paper_fits = rows[ctx][1] != "OOM"
            context_bytes = fs["checkpointed activations"] + fs["layer working set"] + fs["logits"]
            pattern[ctx] = (paper_fits, fs_total - context_bytes, context_bytes)
            fsdp_fits[row] = (paper_fits, fs_total <= hbm)
            what_if[row] = {
                k: (hbm - fs_total - v) / 1e9
                for k, v in what_if_bytes(m, fsdp, ep, cp, tp, off, S).items()
            }
            extra[row] = {
                "mop_bytes": mop,
                "fsdp_bytes": fs,
                "fsdp_bytes_no_checkpointing": no_ckpt,
                "fsdp_what_if_GB_under_hbm": what_if[row],
            }
            hbm_gb = f"{hbm / 1e9:g} GB"
            # "OOM" read as more than the HBM per rank; a printed throughput as at most the HBM.
            reading = lambda printed: f"over {hbm_gb}" if printed == "OOM" else f"at most {hbm_gb}"
            cells.append(
                repro.claim(
                    row,
                    "MoP",
                    None,
                    mop_total / 1e9,
                    "GB per rank",
                    reading=reading(rows[ctx][0]),
                    note=f"ours: {_words(mop_total, hbm)} (public formulas, mop-table1's "
                    f"plan: D = W = {W}, P = {P})",
                )
            )
            top = max(fs, key=fs.get)
            sp = " (SP)" if tp > 1 else ""
            cell = repro.claim(
                row,
                "FSDP-best",
                None,
                fs_total / 1e9,
                "GB per rank",
                reading=reading(rows[ctx][1]),
                note=f"ours: {_words(fs_total, hbm)}; largest term {top} {fs[top] / 1e9:.1f} GB; "
                f"FSDP {fsdp} x CP {cp} x TP {tp}{sp}, EP {ep}, "
                f"{'optimizer offloaded' if off else 'no offload'}",
            )
            cell.detail = f"Without activation checkpointing: {no_ckpt / 1e9:.0f} GB per rank."
            if paper_fits != (fs_total <= hbm):
                cell.note += "; cause not found (detail)"
                cell.detail += (
                    " Cause not found: each tested candidate leaves it fitting, breaks a "
                    "matching cell or departs from the stated setup (assumptions). GB "
                    "under HBM with each: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in what_if[row].items())
                    + "."
                )
            cells.append(cell)
            mem[row] = (mop_total / 1e9, fs_total / 1e9, rows[ctx][1] == "OOM")
        bounds[label] = context_factor_bounds(pattern, hbm)
    common = (max(lo for lo, _ in bounds.values()), min(hi for _, hi in bounds.values()))
    assumptions = [
        f"H200 {hbm / 1e9:g} GB per GPU, 8 per node; framework overhead {p.overhead_bytes / 1e9:g} GB "
        "(h200 platform profile, an assumption). Per-rank bytes from components/resources/formulas.py "
        "(model_state_bytes, moe_activation_bytes_per_layer) under the settings below.",
        "A deviation here has no found cause. Table 3's configuration is used as printed (no search); "
        "what the baseline's unstated settings (checkpointing policy, logits precision, buffers, "
        "micro-batch) and the stand-in architectures do to the borders is not established; each note "
        "gives our margin to HBM and the total without checkpointing.",
        "Candidates tested for the FSDP-best deviations, one at a time (per-row margins in "
        "extra['<row>']['fsdp_what_if_GB_under_hbm']): "
        + "; ".join(
            f"{k} ({WHAT_IF[k]}) flips {_cells(what_if, fsdp_fits, k, False)}, "
            f"breaks {_cells(what_if, fsdp_fits, k, True)}"
            for k in WHAT_IF
        )
        + ".",
        "A common factor r on our context-dependent bytes (activations + logits) that reproduces each "
        "model's fit/OOM border must lie in "
        + ", ".join(f"{label} ({lo:.2f}, {hi:.2f}]" for label, (lo, hi) in bounds.items())
        + (
            ": no value lies in all of them, which rules out one uniform under-count (micro-batch, "
            "activation precision, checkpointing policy) as the cause for every model, under our "
            "model-state reading."
            if common[0] >= common[1]
            else f": all of them hold r in ({common[0]:.2f}, {common[1]:.2f}]."
        ),
        "Not causes by direction: HBM (the data sheet's 141 GB, if GiB, leaves more room, not less); "
        "TorchTitan's CPU offload (FSDP2 CPUOffloadPolicy also moves the sharded parameters and "
        "gradients to the host: less device memory than our reading of 'offloading of the optimizer "
        "state'); loss parallel (TorchTitan shards the logits over TP, as counted).",
        "Architectures are stand-ins (MoP publishes sizes only); see the zoo entries mop-120b/600b/1t.",
        *settings_lines("MoP", MOP_SETTINGS),
        *settings_lines("FSDP-best", FSDP_SETTINGS),
    ]
    rows_ = list(mem)
    figure = Figure(
        name="mop-table2",
        title="Per-rank memory, MoP vs FSDP-best (ours); OOM where Table 2 prints OOM",
        xlabel="model @ context",
        ylabel="GB per rank (ours, public formulas)",
        form="bars",
        series=[
            {"label": "MoP (ours)", "x": rows_, "y": [mem[r][0] for r in rows_], "kind": "ours"},
            {
                "label": "FSDP-best (ours)",
                "x": rows_,
                "y": [mem[r][1] for r in rows_],
                "kind": "ours",
            },
            {
                "label": "FSDP-best, MoP Table 2",
                "x": rows_,
                "y": [None] * len(rows_),
                "kind": "paper",
                "oom": [r for r in rows_ if mem[r][2]],
            },
            {
                "label": f"H200 HBM {hbm / 1e9:g} GB (limit)",
                "x": [],
                "y": hbm / 1e9,
                "kind": "limit",
            },
        ],
    )
    return Result(
        cells=cells,
        assumptions=assumptions,
        figures=[figure],
        extra={**extra, "paper_settings": {"mop": MOP_SETTINGS, "fsdp-best": FSDP_SETTINGS}},
    )


def _cells(
    what_if: dict[str, dict[str, float]],
    fits: dict[str, tuple[bool, bool]],
    key: str,
    matching: bool,
) -> str:
    """Rows whose FSDP-best verdict the candidate ``key`` changes: cells that match now and would
    deviate (``matching``), or cells that deviate now and would match."""
    rows = [
        row
        for row, (paper, ours) in fits.items()
        if (paper == ours) == matching and (what_if[row][key] >= 0) != ours
    ]
    return "[" + ", ".join(rows) + "]" if rows else "none"


def _words(total: float, hbm: float) -> str:
    """'fits: 37.2 GB, 103.8 under HBM' or 'OOM: 163.2 GB, 22.2 over HBM'."""
    gap = (hbm - total) / 1e9
    return (
        f"fits, {total / 1e9:.1f} GB ({gap:.1f} under HBM)"
        if gap >= 0
        else f"OOM, {total / 1e9:.1f} GB ({-gap:.1f} over HBM)"
    )


REPRODUCTION = Reproduction(
    id="mop-table2",
    paper_values=[],
    paper_claims=PAPER_CLAIMS,
    compute=compute,
    defaults={"P": 8},
    grade_class="exact",  # formula bytes against the HBM: each cell is a claim read by the policy
)
