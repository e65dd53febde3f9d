"""The Blackwell platform profiles (dgx-b200, dgx-b300, gb200-nvl72, gb300-nvl72) against the
NVIDIA data sheets' system totals, and the FP8 GEMM rate (time_model.gemm_rate_platform)."""

import pytest

from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources import time_model as T

# (profile, GPUs the data sheet's totals cover, BF16 sparse PFLOPS, FP8 sparse PFLOPS, HBM
# total TB, HBM TB/s total, NIC Gb/s per GPU): DGX B200 / DGX B300 data sheets (8 GPUs; the
# DGX B300 FP8 and the HGX B200 BF16 totals), GB200 / GB300 NVL72 specifications (72 GPUs)
SHEETS = [
    ("dgx-b200", 8, 36.0, 72.0, 1.44, 64.0, 400),
    ("dgx-b300", 8, 36.0, 72.0, 2.3, 64.0, 800),
    ("gb200-nvl72", 72, 360.0, 720.0, 13.4, 576.0, 400),
    ("gb300-nvl72", 72, 360.0, 720.0, 21.0, 576.0, 800),
]


@pytest.mark.parametrize("name,gpus,bf16,fp8,hbm_tb,hbm_tbs,nic_gbit", SHEETS)
def test_per_gpu_fields_are_the_data_sheet_totals_per_gpu(
    name, gpus, bf16, fp8, hbm_tb, hbm_tbs, nic_gbit
):
    p = load_builtin(name)
    g = p.raw["gpu"]
    assert g["peak_tflops"] == pytest.approx(bf16 * 1000 / gpus / 2)  # sparse -> dense
    assert g["peak_fp8_tflops"] == pytest.approx(fp8 * 1000 / gpus / 2)
    assert p.hbm_bytes / 1e12 == pytest.approx(hbm_tb / gpus, rel=0.03)
    assert p.hbm_bytes_per_s / 1e12 == pytest.approx(hbm_tbs / gpus)
    assert p.nic_bytes_per_s_per_gpu == pytest.approx(nic_gbit / 8 * 1e9)
    # NVLink 5: 1.8 TB/s per GPU both ways, 900 GB/s each way (x the app-level efficiency)
    assert p.raw["node"]["intra_node"]["GBps_per_gpu"] == 900.0
    if name.startswith("gb"):
        assert p.gpus_per_node == 72  # one NVL72 domain
    # every number the profile carries is named in its sources or listed as approximate
    text = " ".join(p.raw["sources"])
    for field in ("peak_tflops", "peak_fp8_tflops", "achievable_gemm_tflops", "nic_GBps"):
        assert field in text, (name, field)


def test_achievable_rates_are_dgx_h100s_fractions_of_peak():
    h100 = load_builtin("dgx-h100")
    for name, *_ in SHEETS:
        p = load_builtin(name)
        assert p.gemm_flops / p.peak_flops == pytest.approx(
            h100.gemm_flops / h100.peak_flops, abs=1e-3
        )
        assert p.attention_flops / p.peak_flops == pytest.approx(
            h100.attention_flops / h100.peak_flops, abs=1e-3
        )


def test_fp8_gemm_rate_scales_the_ceiling_by_the_data_sheets_fp8_over_bf16():
    p = load_builtin("dgx-h100")
    assert T.gemm_rate_platform(p, "bf16") is p
    fp8 = T.gemm_rate_platform(p, "fp8")
    assert fp8.gemm_flops == pytest.approx(700e12 * 1979 / 989)
    assert fp8.attention_flops == p.attention_flops and fp8.hbm_bytes_per_s == p.hbm_bytes_per_s
    assert T.gemm_time(fp8, 8192, 8192, 8192) < T.gemm_time(p, 8192, 8192, 8192)
    with pytest.raises(ValueError, match="peak_fp8_tflops"):
        T.gemm_rate_platform(load_builtin("dgx-a100"), "fp8")
    with pytest.raises(ValueError, match="GEMM precision"):
        T.gemm_rate_platform(p, "fp4")
