"""mop-table2: which contexts fit, MoP vs the best FSDP2 plan (MoP Tables 2-3: the OOM pattern).

For each model, node count and context of Table 2 we estimate the per-rank memory of MoP's plan
(mop-table1's ``mop_plan_bytes``: D = W, P = 8) and of Table 3's FSDP-best configuration
(``fsdp_best_bytes`` here) from the public formulas (components/resources/formulas.py) and compare
'fits in 141 GB' with the table: a printed throughput means it fit (1), 'OOM' that it did not
(0). Throughputs themselves are not estimated.

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
"""

from __future__ import annotations

from moe_repro.components.model.params import layer_params
from moe_repro.components.model.zoo import MoEModel, get_model
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources import formulas as F
from moe_repro.reproductions.mop_table1 import (ACT_BYTES, MOP_SETTINGS, PLATFORM, PRECISION, largest_dense_layer,
                                                mop_plan_bytes, settings_lines)
from moe_repro.reproductions.spec import PaperValue, Reproduction, Result

_SRC = "MoP Table 2 (a printed throughput = fits: 1; OOM = 0)"
CTX = {"64K": 65536, "128K": 131072, "256K": 262144, "512K": 524288, "1M": 1048576}
# model key -> label, nodes, Table 3 (fsdp, ep, cp, tp, offload), {context: (MoP, FSDP-best) as printed}
_TABLE = {
    "mop-120b": ("120B", 2, (1, 16, 16, 1, False),
                 {"128K": ("1043", "223"), "256K": ("681", "OOM"), "512K": ("424", "OOM"), "1M": ("393", "OOM")}),
    "mop-600b": ("600B", 8, (16, 8, 2, 2, True),
                 {"64K": ("236", "39"), "128K": ("220", "OOM"), "256K": ("225", "OOM"), "512K": ("213", "OOM"),
                  "1M": ("213", "OOM")}),
    "mop-1t": ("1T", 12, (3, 96, 4, 8, True),
               {"128K": ("166", "25"), "256K": ("140", "17"), "512K": ("108", "OOM"), "1M": ("100", "OOM")}),
}
PAPER_VALUES = [PaperValue(f"{label} @ {ctx}", col, "0" if v == "OOM" else "1", "fits", _SRC)
                for label, _, _, rows in _TABLE.values() for ctx, pair in rows.items()
                for col, v in zip(("MoP fits", "FSDP-best fits"), pair)]
FSDP_ZERO_STAGE = 3  # MoP Sec. 2.3: "ZeRO-3 / FSDP-FULL_SHARD"
LOGIT_BYTES = 2 + 4  # bf16 logits and the fp32 copy the loss reads (not stated)

# What MoP states about its FSDP-best baseline (used value, what the paper says, where).
FSDP_SETTINGS: list[dict[str, str]] = [
    {"setting": "framework", "used": "FSDP2 (TorchTitan) with TP, CP, EP and optimizer CPU offload, "
                                     "Table 3's degrees per model",
     "paper": "'a strong, fully featured FSDP2 baseline as implemented in TorchTitan ... Megatron-style "
              "tensor (TP), context (CP), and expert (EP) parallelism [13, 5], as well as CPU offloading "
              "of the optimizer state [12]'; Table 3: FSDP/EP/CP/TP/offload per model",
     "source": "Sec. 4 (Baselines), Table 3"},
    {"setting": "ZeRO stage", "used": "3 (FSDP FULL_SHARD): dense weights / TP sharded over FSDP x CP, "
                                      "experts / EP sharded over W / EP",
     "paper": "'ZeRO-3 / FSDP-FULL_SHARD additionally shards the parameters ... 16Θ/W bytes per rank'; "
              "how TorchTitan folds CP and EP into the shard group is not stated",
     "source": "Sec. 2.3 Eq. 2"},
    {"setting": "precision", "used": "16 B/param (bf16 weights and grads, fp32 master + AdamW m, v; "
                                     "formulas preset 'mop' with the offload flag of Table 3)",
     "paper": "not stated for the baseline; Eq. 1's 16Θ is stated for mixed-precision AdamW training",
     "source": "Sec. 2.1 Eq. 1"},
    {"setting": "optimizer offload", "used": "Table 3: 120B no; 600B and 1T yes (12 B/param on the host, "
                                             "weights and grads 4 B/param stay on the GPU)",
     "paper": "'CPU offloading of the optimizer state'", "source": "Sec. 4, Table 3"},
    {"setting": "TP / SP", "used": "Table 3's TP with sequence parallelism (activations / TP)",
     "paper": "Megatron-style TP with [5] (sequence parallelism, Sec. 2.2) named beside it; SP not "
              "stated per configuration", "source": "Sec. 4, Sec. 2.2, Table 3"},
    {"setting": "CP", "used": "Table 3's CP: N = S / CP tokens per rank", "paper": "Table 3 degrees",
     "source": "Table 3"},
    {"setting": "recompute", "used": "full activation checkpointing (each layer's input kept, one layer "
                                     "recomputed); the notes give the total without checkpointing",
     "paper": "not stated", "source": "Sec. 4, Table 3"},
    {"setting": "attention kernel", "used": "FlashAttention (no S x S scores)", "paper": "not stated",
     "source": "Sec. 4"},
    {"setting": "FSDP prefetch and logits", "used": "two layers' gathered bf16 weights; bf16 + fp32 "
                                                    "logits of N V / TP (loss parallel)",
     "paper": "not stated", "source": "Sec. 4"},
    {"setting": "batch and sequence lengths", "used": "one sequence per CP x TP group per step; Table 2's "
                                                      "contexts (64K-1M)",
     "paper": "contexts stated; the baseline's batch is not", "source": "Table 2"},
]


def _activations(m: MoEModel, seq: int, tp: int, cp: int, recompute: str) -> dict[str, float]:
    """Checkpointed layer inputs and the working set of the layer being recomputed (``"full"``), or
    every layer's activations kept (``"none"``; FlashAttention keeps no scores, which formulas
    counts as recompute="selective")."""
    sp = tp > 1
    act = lambda moe, mode: F.moe_activation_bytes_per_layer(m, seq, 1, moe=moe, t=tp, sp=sp, cp=cp,
                                                             recompute=mode, bytes_per_value=ACT_BYTES)
    kinds = [(True, m.n_moe_layers), (False, m.n_dense_layers)]
    if recompute == "full":
        return {"checkpointed activations": sum(n * act(moe, "full") for moe, n in kinds if n),
                "layer working set": max(act(moe, "selective") for moe, n in kinds if n)}
    if recompute == "none":
        return {"activations (no checkpointing)": sum(n * act(moe, "selective") for moe, n in kinds if n)}
    raise ValueError(f"recompute must be 'full' or 'none', got {recompute!r}")


def fsdp_best_bytes(m: MoEModel, fsdp: int, ep: int, cp: int, tp: int, offload: bool, seq: int,
                    overhead_bytes: float = 0.0, recompute: str = "full") -> dict[str, float]:
    """Per-rank device bytes of one FSDP-best configuration (module docstring)."""
    W = fsdp * cp * tp
    if W % ep:
        raise ValueError(f"EP {ep} does not divide FSDP x CP x TP = {W}")
    par = F.parameters(m)
    experts = par["routed_experts"]
    dense = par["total"] - experts
    state = lambda n, over: F.model_state_bytes(n, over, FSDP_ZERO_STAGE, PRECISION,
                                                offload_optimizer=offload)["total"]
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


def compute(repro: Reproduction, params: dict) -> Result:
    P = int(params["P"])
    if P <= 0:
        raise ValueError("P must be positive")
    p = load_builtin(PLATFORM)
    hbm = p.hbm_bytes
    cells, extra = [], {}
    for key, (label, nodes, (fsdp, ep, cp, tp, off), rows) in _TABLE.items():
        m = get_model(key)
        W = nodes * p.gpus_per_node
        if fsdp * cp * tp != W:
            raise ValueError(f"{label}: Table 3's FSDP x CP x TP = {fsdp * cp * tp} is not {W} GPUs")
        for ctx in rows:
            S = CTX[ctx]
            mop = mop_plan_bytes(m, W, W, P, S, p.overhead_bytes)
            mop_total = sum(mop.values())
            fs = fsdp_best_bytes(m, fsdp, ep, cp, tp, off, S, p.overhead_bytes)
            fs_total = sum(fs.values())
            no_ckpt = sum(fsdp_best_bytes(m, fsdp, ep, cp, tp, off, S, p.overhead_bytes, "none").values())
            row = f"{label} @ {ctx}"
            extra[row] = {"mop_bytes": mop, "fsdp_bytes": fs, "fsdp_bytes_no_checkpointing": no_ckpt}
            cells.append(repro.compare(row, "MoP fits", float(mop_total <= hbm), "fits",
                                       note=f"{mop_total / 1e9:.1f} GB per rank (public formulas, mop-table1's "
                                            f"plan: D = W = {W}, P = {P}); {_margin(mop_total, hbm)}"))
            top = max(fs, key=fs.get)
            sp = " (SP)" if tp > 1 else ""
            cells.append(repro.compare(
                row, "FSDP-best fits", float(fs_total <= hbm), "fits",
                note=f"{fs_total / 1e9:.1f} GB per rank (public formulas; largest term {top} "
                     f"{fs[top] / 1e9:.1f} GB); {_margin(fs_total, hbm)}; without activation "
                     f"checkpointing {no_ckpt / 1e9:.0f} GB; FSDP {fsdp} x CP {cp} x TP {tp}{sp}, EP {ep}, "
                     f"{'optimizer offloaded' if off else 'no offload'}"))
    assumptions = [
        f"H200 {hbm / 1e9:g} GB per GPU, 8 per node; framework overhead {p.overhead_bytes / 1e9:g} GB "
        "(h200 platform profile, an assumption). Per-rank bytes from components/resources/formulas.py "
        "(model_state_bytes, moe_activation_bytes_per_layer) under the settings below.",
        "A deviation here has no found cause: what the baseline's unstated settings (checkpointing "
        "policy, logits precision, buffers) and the stand-in architectures do to the borders is not "
        "established; each note gives our margin to HBM and the total without checkpointing.",
        "Architectures are stand-ins (MoP publishes sizes only); see the zoo entries mop-120b/600b/1t.",
        *settings_lines("MoP", MOP_SETTINGS),
        *settings_lines("FSDP-best", FSDP_SETTINGS),
    ]
    return Result(cells=cells, assumptions=assumptions,
                  extra={**extra, "paper_settings": {"mop": MOP_SETTINGS, "fsdp-best": FSDP_SETTINGS}})


def _margin(total: float, hbm: float) -> str:
    gap = (hbm - total) / 1e9
    return f"{gap:.1f} GB under HBM" if gap >= 0 else f"{-gap:.1f} GB over HBM"


REPRODUCTION = Reproduction(
    id="mop-table2",
    paper_values=PAPER_VALUES, compute=compute, defaults={"P": 8},
)
