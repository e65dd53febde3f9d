"""mop-table2: which contexts fit, MoP vs the best FSDP2 plan (MoP Tables 2-3: the OOM pattern).

For each model, node count and context of Table 2 we estimate per-rank memory of MoP's plan
(components.resources.memory_model.mop_rank_memory, D = W, P = 8) and of the FSDP-best configuration of
Table 3 (fsdp_rank_memory) and compare 'fits in 141 GB' with the table: a printed throughput
means it fit (1), 'OOM' that it did not (0). Throughputs themselves are not estimated.
"""

from __future__ import annotations

from moe_repro.components.resources.memory_model import fsdp_rank_memory, mop_rank_memory
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.model.zoo import get_model
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


def compute(repro: Reproduction, params: dict) -> Result:
    P = int(params["P"])
    p = load_builtin("h200")
    cells = []
    for key, (label, nodes, (fsdp, ep, cp, tp, off), rows) in _TABLE.items():
        m = get_model(key)
        W = nodes * p.gpus_per_node
        if fsdp * cp * tp != W:
            raise ValueError(f"{label}: Table 3's FSDP x CP x TP = {fsdp * cp * tp} is not {W} GPUs")
        for ctx in rows:
            S = CTX[ctx]
            mop = sum(mop_rank_memory(m, W, W, P, S, p.overhead_bytes).values())
            fs = fsdp_rank_memory(m, fsdp, ep, cp, tp, off, S, p.overhead_bytes)
            fsdp_total = sum(fs.values())
            row = f"{label} @ {ctx}"
            cells.append(repro.compare(row, "MoP fits", float(mop <= p.hbm_bytes), "fits",
                                       note=f"{mop / 1e9:.1f} GB per rank (estimate)"))
            top = max(fs, key=fs.get)
            cells.append(repro.compare(row, "FSDP-best fits", float(fsdp_total <= p.hbm_bytes), "fits",
                                       note=f"{fsdp_total / 1e9:.1f} GB per rank (estimate; largest term "
                                            f"{top} {fs[top] / 1e9:.1f} GB); FSDP {fsdp} x CP {cp} x TP {tp}, "
                                            f"EP {ep}, {'optimizer offloaded' if off else 'no offload'}"))
    assumptions = [
        "One sequence per step; H200 141 GB per GPU, 8 per node; framework overhead "
        f"{p.overhead_bytes / 1e9:g} GB.",
        f"MoP: D = W, P = {P}, optimizer on the host, full activation checkpointing, un-chunked MoE buffers "
        "(an upper bound: MoP's memory-efficient LLEP is smaller by an unpublished factor).",
        "FSDP-best: Table 3's degrees; 16 B/param sharded over all ranks (4 B with CPU offload), two layers "
        "of all-gather buffers, full activation checkpointing, sequence parallelism inside TP, fp32 + bf16 "
        "logits split over TP. TorchTitan's exact checkpointing policy is not stated; it moves the borders.",
        "Architectures are stand-ins (MoP publishes sizes only); see the zoo entries mop-120b/600b/1t.",
    ]
    return Result(cells=cells, assumptions=assumptions)


REPRODUCTION = Reproduction(
    id="mop-table2",
    paper_values=PAPER_VALUES, compute=compute, defaults={"P": 8},
)
