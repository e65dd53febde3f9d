"""piper-table4: worst-case expert-migration send size and latency per GPU (Piper Table IV).

Computed from the model zoo and components.balance.migration_cost (48 E d_model d_ffn / G bytes, G = 8,
50 GB/s). The column header says GB; we report decimal GB (10^9 bytes) and, where a printed
value only follows from the formula in GiB (2^30 bytes), say so per cell: Table IV mixes units.
"""

from __future__ import annotations

from moe_repro.components.balance.migration_cost import (PIPER_N_MAT, migration_latency_s,
                                                 worst_case_send_bytes_per_gpu)
from moe_repro.components.model.zoo import get_model
from moe_repro.reproductions.spec import PaperValue, Reproduction, Result

SIZE = "Send Size / GPU"
LATENCY = "Latency"
_SRC = "Piper Table IV"

# Model key in the zoo -> (row label as printed, send size GB, latency ms), as printed.
_PRINTED = {
    "switch-base": ("Switch-Base", "1.21", "24.2"),
    "mixtral-8x7b": ("Mixtral 8x7B", "2.63", "52.6"),
    "mixtral-8x22b": ("Mixtral 8x22B", "4.50", "90.0"),
    "grok-1": ("Grok-1", "9.00", "180.0"),
    "glam-1.2t": ("GLaM (1.2T)", "102.88", "2057.6"),
    "deepseek-v2": ("DeepSeek-V2", "7.04", "140.8"),
    "deepseek-v3": ("DeepSeek-V3", "21.00", "420.0"),
}

PAPER_VALUES = [v for row, size, lat in _PRINTED.values() for v in (
    PaperValue(row, SIZE, size, "GB", _SRC),
    PaperValue(row, LATENCY, lat, "ms", _SRC),
)]

GB, GIB = 1e9, 2.0 ** 30


def _unit_note(printed: PaperValue, nbytes: float, scale: float, what: str) -> tuple[bool, str]:
    """Test the other byte unit against the printed value of a deviating cell: (True, why) when
    the printed value is the formula's in GiB (a unit convention, found by this test), else
    (False, what was tried).

    ``scale`` converts bytes of the quantity into the printed unit given a byte unit (1 for a
    size in GB, 1e3/bandwidth for a latency in ms)."""
    in_gb, in_gib = nbytes * scale / GB, nbytes * scale / GIB
    half = printed.half_unit
    if abs(in_gib - printed.value) <= half:
        return True, (f"the printed {printed.printed} is the formula's {what} in GiB-based units "
                      f"({in_gib:.3f}), not GB ({in_gb:.3f}); Table IV's header says GB and other rows "
                      f"use GB, so the table mixes units")
    closest, label = min(((in_gb, "GB"), (in_gib, "GiB")), key=lambda t: abs(t[0] - printed.value))
    return False, (f"the printed {printed.printed} follows from the formula in neither GB ({in_gb:.3f}) "
                   f"nor GiB ({in_gib:.3f}); closest is {label}, off by "
                   f"{(printed.value - closest) / closest:+.2%}")


def compute(repro: Reproduction, params: dict) -> Result:
    gpus, bw_gbps = int(params["gpus"]), float(params["bandwidth_GBps"])
    if gpus <= 0 or bw_gbps <= 0:
        raise ValueError("gpus and bandwidth_GBps must be positive")
    bandwidth = bw_gbps * GB
    cells, inputs = [], []
    for key, (row, _, _) in _PRINTED.items():
        m = get_model(key)
        nbytes = worst_case_send_bytes_per_gpu(m.n_experts, m.d_model, m.d_ffn, gpus)
        latency_s = migration_latency_s(nbytes, bandwidth)
        inputs.append({"model": row, "E": m.n_experts, "d_model": m.d_model, "d_ffn": m.d_ffn,
                       "n_mat_formula": PIPER_N_MAT, "n_mat_model": m.n_mat, "send_bytes": nbytes})

        size_cell = repro.compare(row, SIZE, nbytes / GB, "GB")
        if size_cell.verdict == "deviates":
            found, why = _unit_note(repro.paper_value(row, SIZE), nbytes, 1.0, "size")
            if found:
                size_cell.explain("unit-convention", why)
            else:
                size_cell.note = why
        if m.n_mat != PIPER_N_MAT:
            real = nbytes * m.n_mat / PIPER_N_MAT / GB
            extra = (f"{m.name}'s expert FFN has {m.n_mat} matrices, the formula charges "
                     f"{PIPER_N_MAT}: with its real FFN the send size is {real:.2f} GB")
            size_cell.note = f"{size_cell.note}; {extra}" if size_cell.note else extra
        cells.append(size_cell)

        lat_cell = repro.compare(row, LATENCY, latency_s * 1e3, "ms")
        if lat_cell.verdict == "deviates":
            printed_lat = repro.paper_value(row, LATENCY)
            found, why = _unit_note(printed_lat, nbytes, 1e3 / bw_gbps, "latency")
            from_printed = repro.paper_value(row, SIZE).value / bw_gbps * 1e3
            if abs(from_printed - printed_lat.value) <= printed_lat.half_unit:
                why += (f"; it equals the printed size / {bw_gbps:g} GB/s "
                        f"({from_printed:.1f} ms), so it inherits the size's unit")
                # the size was printed in GiB (found above), so the latency inherits that cause
                found = found or size_cell.cause == "unit-convention"
            if found:
                lat_cell.explain("unit-convention", why)
            else:
                lat_cell.note = why
        cells.append(lat_cell)

    assumptions = [
        f"Worst case: every expert of one layer is reassigned; each of G = {gpus} GPUs sends E/G experts.",
        "Per expert: 3 x d_model x d_ffn parameters x 16 bytes (master copy, optimizer states, "
        "gradients), Piper Sec. VI-A, applied to every model as the paper does.",
        f"Latency = send size / {bw_gbps:g} GB/s, no per-message latency term (as the caption).",
        "GB = 10^9 bytes (the caption's unit); cells explain where a printed value needs GiB.",
    ]
    return Result(cells=cells, assumptions=assumptions, extra={"inputs": inputs})


REPRODUCTION = Reproduction(
    id="piper-table4",
    paper_values=PAPER_VALUES,
    compute=compute,
    defaults={"gpus": 8, "bandwidth_GBps": 50.0},
)
