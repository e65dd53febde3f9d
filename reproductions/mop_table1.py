"""mop-table1: per-rank memory per component under MoP (MoP Table 1), evaluated in bytes.

Table 1 is symbolic (Theta_dns/W, O(NH), Theta_exp/W, << O(NkH), Theta_voc/P, O(NV/P), host
optimizer); we evaluate components.resources.memory_model.mop_rank_memory for MoP's three model sizes on
their node counts (8 x H200 per node) at one context. MoP does not publish its architectures or
its D and P: the zoo's stand-ins (mop-120b, mop-600b, mop-1t) and D = W, P = 8 are assumptions.
"""

from __future__ import annotations

from moe_repro.components.resources.memory_model import mop_partition, mop_rank_memory
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.model.zoo import get_model
from moe_repro.reproductions.spec import PaperValue, Reproduction, Result

MODELS = {"mop-120b": ("120B", 2), "mop-600b": ("600B", 8), "mop-1t": ("1T", 12)}
FORMULA = {"dense weights": "Theta_dns/W", "attention activations": "O(NH)", "expert weights": "Theta_exp/W",
           "MoE activations (bound)": "<< O(NkH)", "vocabulary weights": "Theta_voc/P",
           "vocabulary logits": "O(NV/P)", "optimizer state (device)": "host-resident",
           "framework overhead": "-"}
PAPER_VALUES: list[PaperValue] = []


def compute(repro: Reproduction, params: dict) -> Result:
    seq, P = int(params["context"]), int(params["P"])
    p = load_builtin("h200")
    cells, extra = [], {}
    for key, (label, nodes) in MODELS.items():
        m = get_model(key)
        W = nodes * p.gpus_per_node
        mem = mop_rank_memory(m, W, W, P, seq, p.overhead_bytes)
        for comp, v in mem.items():
            cells.append(repro.compare(f"{label} ({W} GPUs)", comp, v / 1e9, "GB",
                                       note=f"Table 1: {FORMULA[comp]}"))
        total = sum(mem.values())
        cells.append(repro.compare(f"{label} ({W} GPUs)", "total", total / 1e9, "GB",
                                   note=f"vs {p.hbm_bytes / 1e9:g} GB HBM: {'fits' if total <= p.hbm_bytes else 'OOM'}"))
        part = mop_partition(m)
        extra[key] = {**part, "expert_share": part["exp"] / sum(part.values()), "W": W}
    assumptions = [
        f"Context {seq} tokens, one sequence, D = W (sequence parallel over all ranks), P = {P} "
        "(MoP: 8-16x vocabulary reduction 'at the sub-group sizes we use').",
        "Architectures are stand-ins (MoP publishes sizes only): gpt-oss-120b, DeepSeek-V3 with 224 "
        "experts, Kimi K2; the expert share of parameters is in extra (MoP: ~98-99% for 1T models).",
        "bf16 weights and gradients on device; optimizer host-resident; full activation checkpointing; "
        f"framework overhead {p.overhead_bytes / 1e9:g} GB; H200 141 GB.",
    ]
    return Result(cells=cells, assumptions=assumptions, extra=extra)


REPRODUCTION = Reproduction(
    id="mop-table1",
    paper_values=PAPER_VALUES, compute=compute, defaults={"context": 131072, "P": 8},
)
