"""components.resources.time_model: each formula against a hand computation from its source
(the numbers below are worked out from the profiles' published rates, not read from the code),
and both planners timing the same work the same way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moe_repro.components.model.zoo import get_model
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources import time_model as T

A100 = load_builtin(
    "dgx-a100"
)  # 267.9 TFLOPS achievable GEMM, 1800 GB/s measured HBM (profile sources)
H100 = load_builtin("dgx-h100")


def test_gemm_roofline_compute_bound_hand_case():
    # 8192^3 square GEMM: 2 x 8192^3 = 1.099511627776e12 FLOPs at 267.9e12 FLOP/s x 512/513 (its
    # 2048 tiles of 256x128 take 19 waves of 108: 2048 / 2052) = 4.11221 ms; its bytes,
    # 3 x 8192^2 x 2 = 402.65 MB at 1800 GB/s = 0.224 ms, do not bind
    assert T.gemm_time(A100, 8192, 8192, 8192) == pytest.approx(
        1.099511627776e12 / (267.9e12 * 512 / 513), rel=1e-12
    )
    assert T.gemm_time(A100, 8192, 8192, 8192) == pytest.approx(4.11221e-3, rel=1e-5)


def test_gemm_roofline_memory_bound_hand_case():
    # an expert with 16 tokens, d 4096 -> 14336: 2 x 16 x 4096 x 14336 = 1.879e9 FLOPs (7.0 us at
    # 267.9 TFLOPS) but it reads the 4096 x 14336 weights: (16 x 4096 + 4096 x 14336 + 16 x 14336)
    # x 2 B = (65,536 + 58,720,256 + 229,376) x 2 = 118,030,336 B at 1800 GB/s (the measured
    # rate, 88% of the data sheet's 2039) = 65.572 us:
    # memory-bound (its FLOPs at the 64x256 tiles' 1/4 efficiency take 28 us)
    assert T.gemm_time(A100, 16, 4096, 14336) == pytest.approx(118_030_336 / 1800e9, rel=1e-12)
    assert T.gemm_time(A100, 0, 4096, 14336) == 0.0


def test_attention_core_hand_cases():
    # FlashAttention, causal: 2 x 4096 queries x 4096 keys x 32 heads x (128 + 128) / 2
    # = 1.37439e11 FLOPs at the attention rate (267.9 TFLOPS on this profile)
    flops = 2 * 4096 * 4096 * 32 * 256 / 2
    assert T.attention_core_time(A100, 4096, 4096, 32, 128, 128) == pytest.approx(
        flops / 267.9e12, rel=1e-12
    )
    # materialised scores: every score computed (2 x flops = 2.749e11, 1.026 ms) and 4 B per
    # score (write + read) = 4 x 4096^2 x 32 B = 2.147 GB at 1800 GB/s = 1.193 ms: the bytes bind
    assert T.attention_core_time(A100, 4096, 4096, 32, 128, 128, flash=False) == pytest.approx(
        4 * 4096 * 4096 * 32 / 1800e9, rel=1e-12
    )
    # heads of width 256: 2 x 4096^2 x 32 x 512 = 5.498e11 FLOPs, 2.052 ms: the FLOPs bind
    assert T.attention_core_time(A100, 4096, 4096, 32, 256, 256, flash=False) == pytest.approx(
        2 * 4096 * 4096 * 32 * 512 / 267.9e12, rel=1e-12
    )


def test_train_time_backward_factors():
    # backward = 2 x forward for GEMMs and attention, 1.5 x for HBM-bound kernels; recompute once
    fwd = T.Compute(gemm=1.0, attention=2.0, hbm=4.0)
    assert T.train_time(fwd) == 3 * 3.0 + 2.5 * 4.0
    assert T.train_time(fwd, fwd) == 3 * 3.0 + 2.5 * 4.0 + 7.0
    sel = T.Compute(attention=2.0, hbm=4.0, scores_hbm=1.0).attention_only()  # Korthikanti Sec. 5
    assert (sel.gemm, sel.attention, sel.hbm) == (0.0, 2.0, 1.0)


def test_pipeline_step_is_narayanan_and_piper():
    # 1F1B / GPipe: M slots + (PP - 1) idle slots = Piper's (M + PP - 1) slots; interleaving
    # divides the bubble by VPP (Narayanan et al. 2021 Sec. 2.2.2)
    assert T.pipeline_step(2.0, 8, 4) == (16.0, 6.0)
    assert T.pipeline_step(2.0, 8, 4, vpp=2) == (16.0, 3.0)
    assert T.bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert T.pipeline_step(2.0, 8, 1) == (16.0, 0.0)
    with pytest.raises(ValueError):
        T.pipeline_step(1.0, 0, 4)


def test_link_transfer_and_alltoall_hand_cases():
    # dgx-h100: NVLink 450 GB/s per GPU inside a node; 8 NICs x 50 GB/s / 8 GPUs x efficiency
    # across nodes; latencies 2 us (intra_node) and 4 us (the farthest class, inter_group)
    p = H100
    nic = (
        p.raw["node"]["nics"]
        * p.raw["node"]["nic_GBps"]
        * 1e9
        / p.raw["node"]["gpus"]
        * p.raw["efficiency"]["network"]
    )
    # NVLink: the data sheet's line rate x the application-level share (efficiency.nvlink)
    nvl = p.raw["node"]["intra_node_alltoall_GBps_per_gpu"] * 1e9 * p.raw["efficiency"]["nvlink"]
    assert T.transfer_time(p, 1e9, off_node=False, messages=3) == pytest.approx(
        1e9 / nvl + 3 * 2e-6
    )
    assert T.transfer_time(p, 1e9, off_node=True, messages=0) == pytest.approx(1e9 / nic)
    # on- and off-node parts concurrently: the slower bounds it, one off-node latency
    assert T.alltoall_time(p, 1e9, 1e8) == pytest.approx(max(1e9 / nvl, 1e8 / nic) + 4e-6)
    assert T.alltoall_time(p, 1e9, 0.0, messages=2) == pytest.approx(1e9 / nvl + 2 * 2e-6)
    assert T.alltoall_time(p, 0.0, 0.0) == 0.0


def test_exposed_dp_time_cases():
    # ZeRO 0/1 not overlapped: all of it; overlapped: what exceeds the last backward / first forward
    assert T.exposed_dp_time(3.0, 1.0, 0, 8, 0.5, 2.0, overlap=False) == 4.0
    assert T.exposed_dp_time(3.0, 1.0, 1, 8, 0.5, 2.0) == 1.0 + 0.5
    # ZeRO-2: the reduce-scatter every micro-batch; ZeRO-3 also gathers for forward and backward
    assert T.exposed_dp_time(3.0, 1.0, 2, 8, 0.5, 2.0) == 8 * 1.0 + 0.5
    assert T.exposed_dp_time(3.0, 1.0, 3, 8, 0.5, 2.0) == 8 * (0.5 + 2.0)


def test_layer_gemms_shapes_under_tp_and_ep():
    # Mixtral 8x7B (d 4096, FFN 14336, SwiGLU, 32 heads, 8 KV heads of 128), TP 2, EP 4, 4096 rows:
    # QKV 4096 -> (4096 + 2 x 1024) / 2, output 2048 -> 4096; 2 local experts, each receiving
    # 4 x 4096 x 2 / (2 x 8) = 2048 tokens (the EP group's k copies over 8 experts, / TP for SP);
    # the router on the 2048-token SP shard
    m = get_model("mixtral-8x7b")
    g = T.layer_gemms(m, True, 4096, t=2, ep=4)
    assert T.Gemm(1, 4096, 4096, 3072) in g and T.Gemm(1, 4096, 2048, 4096) in g
    assert T.Gemm(2 * 2, 2048, 4096, 14336) in g and T.Gemm(2, 2048, 14336, 4096) in g
    assert T.Gemm(1, 2048, 4096, 8) in g


def test_both_planners_give_the_same_compute_for_the_same_layout():
    # Piper's PP x EP estimate and the parallelism planner at PP 1, EP 8, TP 1, one sequence per
    # micro-batch: the same stage, the same seconds of compute per micro-batch
    from moe_repro.components.resources.parallel_planner import plan_parallel
    from moe_repro.components.resources.perf_model import estimate

    m = get_model("mixtral-8x7b")
    e = estimate(m, H100, PP=1, EP=8, micro_batch=1, seq=4096, M=4)
    pl = plan_parallel(
        m,
        H100,
        1,
        seq=4096,
        global_batch=32,
        micro_batches=4,
        tp=1,
        pp=1,
        ep=8,
        cp=1,
        zero=(3,),
        recompute=("none",),
        etp=1,
    )
    c = pl.candidates[0]
    assert (c.tp, c.pp, c.ep, c.micro_batch, c.micro_batches) == (1, 1, 8, 1, 4)
    assert c.parts["compute"] / 4 == pytest.approx(e.compute_s, rel=1e-12)


def test_no_planner_keeps_a_time_formula_of_its_own():
    # every division of work by a rate (GEMM, attention, HBM, link) is in time_model
    root = Path(__file__).resolve().parents[1] / "components" / "resources"
    rate = re.compile(
        r"/\s*\(?\s*(ctx\.)?p\.(gemm_flops|attention_flops|hbm_bytes_per_s|"
        r"intra_node_a2a_bytes_per_s|nic_bytes_per_s_per_gpu)|/\s*\w*_bw\b|link_bytes_per_s\("
    )
    for name in ("perf_model.py", "planner.py", "parallel_planner.py"):
        code = (root / name).read_text()
        assert not rate.search(code), (name, rate.search(code))


def test_gemm_efficiency_tile_and_wave_quantization_hand_cases():
    # NVIDIA Matrix Multiplication Background guide Ch. 3 on the A100's 108 SMs, 2048 x 2304 output:
    # 256x128 tiles: 8 x 18 = 144 tiles = 1.33 waves, 2 launched: 144 / 216 = 2/3;
    # 128x128: 288 tiles, 3 waves: 288 / 324 = 8/9; 64x64: 32 x 36 = 1152 tiles, 10.67 waves,
    # 11 launched: 1152 / 1188 = 32/33, the least waste of the guide's tiles
    assert A100.sm_count == 108
    assert T.gemm_efficiency(A100, 2048, 2304) == pytest.approx(1152 / 1188, rel=1e-12)
    # 300 x 128: fewer tiles than SMs (split-K fills them), so only padding: 64x128 tiles,
    # 5 tiles of 8192 for 38400 useful = 0.9375
    assert T.gemm_efficiency(A100, 300, 128) == pytest.approx(300 * 128 / (5 * 8192), rel=1e-12)
    # the ceiling's own shape (Bekman, 6912 x 16384 x 2048) quantizes without loss: 3456 tiles
    # of 256x128 = 32 whole waves
    assert T.gemm_efficiency(A100, 6912, 16384) == 1.0
    assert T.gemm_time(A100, 2048, 4096, 2304) == pytest.approx(
        2 * 2048 * 4096 * 2304 / (267.9e12 * 32 / 33), rel=1e-12
    )
    # a profile without an SM count has one rate for every shape
    assert H100.sm_count == 0 and T.gemm_efficiency(H100, 2048, 2304) == 1.0


@pytest.mark.parametrize("bad", [0, 2.5, -108, "108"])
def test_a_bad_sm_count_is_refused_with_its_field(bad):
    from moe_repro.components.network.platform import from_dict

    d = dict(A100.raw, gpu={**A100.raw["gpu"], "sm_count": bad})
    with pytest.raises(ValueError, match="gpu.sm_count"):
        from_dict(d)


def _profile(**edits):
    """dgx-a100's document with ``edits`` (dotted path -> value) applied, loaded."""
    import copy

    from moe_repro.components.network.platform import from_dict

    doc = copy.deepcopy(A100.raw)
    for path, value in edits.items():
        node = doc
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return from_dict(doc)


def test_nvlink_efficiency_scales_every_on_node_rate_and_no_nic():
    from moe_repro.components.network.platform import intra_node_of
    from moe_repro.components.network.simulator import Machine

    full, half = _profile(**{"efficiency.nvlink": 1.0}), _profile(**{"efficiency.nvlink": 0.5})
    # the data sheet's 300 GB/s NVLink: all of it, or half of it, on every reader
    assert full.intra_node_a2a_bytes_per_s == 300e9 and half.intra_node_a2a_bytes_per_s == 150e9
    assert intra_node_of(half)["bytes_per_s"] == 150e9
    assert T.transfer_time(half, 3e9, off_node=False, messages=0) == pytest.approx(0.02)
    mf, mh = Machine.from_platform(full), Machine.from_platform(half)
    assert mh.link_bytes_per_s["intra_node"] == 150e9
    # NICs and the fabric keep their rates (25 GB/s HDR per GPU)
    for cls in ("nic_injection", "switch_group", "inter_group"):
        assert mh.link_bytes_per_s[cls] == mf.link_bytes_per_s[cls] == 25e9
    assert T.transfer_time(half, 25e9, off_node=True, messages=0) == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [0, 1.5, -0.2, "0.8", True])
def test_a_bad_nvlink_efficiency_is_refused_with_its_field(bad):
    with pytest.raises(ValueError, match="efficiency.nvlink"):
        _profile(**{"efficiency.nvlink": bad})


def test_achievable_hbm_rate_replaces_the_data_sheets_where_given():
    sheet = _profile(**{"gpu.achievable_hbm_GBps": 2039.0})
    measured = _profile(**{"gpu.achievable_hbm_GBps": 1000.0})
    assert T.hbm_time(sheet, 2039e9) == pytest.approx(1.0)
    assert T.hbm_time(measured, 2e9) == pytest.approx(2e-3)
    # a memory-bound GEMM (16 rows) reads its weights at the measured rate: 2 x 4096 x 4096 B
    weights = 2 * 4096 * 4096
    assert T.gemm_time(measured, 16, 4096, 4096) == pytest.approx(
        (weights + 2 * 2 * 16 * 4096) / 1e12
    )


# --------------------------------------------------------------------------------------------
# A profile's measured layer (calibration.layer_forward)
# --------------------------------------------------------------------------------------------


def _gpt_layer(hidden=6144, heads=64):
    from moe_repro.components.model.zoo import megatron_gpt

    return megatron_gpt(1, hidden, heads, None)


def test_the_measured_layer_is_reproduced_by_the_scaled_kernels_plus_its_all_reduces():
    # dgx-a100 carries Korthikanti et al. 2022 Table 4's 7.7 ms forward of one 22B layer (hidden
    # 6144, 64 heads, s 2048, b 4, TP 8, no SP, no FlashAttention, dropout). The model's forward of
    # that layer on the calibrated profile, plus its two all-reduces worked out here (ring: 2 x 7/8
    # x s b h x 2 B each at 300 GB/s x 0.8 over NVLink, 2 us latency each), must be the 7.7 ms.
    p = load_builtin("dgx-a100")
    all_reduces = 2 * (2 * 7 / 8 * 2048 * 4 * 6144 * 2 / 240e9 + 2e-6)
    fwd = T.layer_forward(
        _gpt_layer(), False, p, 4 * 2048, 2048, 8, False, 1, 1, flash=False, dropout=True
    )
    assert fwd.total + all_reduces == pytest.approx(7.7e-3, rel=1e-9)
    # every kind of kernel is scaled alike, the output head too; the rates themselves are not
    bare = T.uncalibrated(p)
    f = T.layer_time_factor(p)
    raw = T.layer_forward(
        _gpt_layer(), False, bare, 4 * 2048, 2048, 8, False, 1, 1, flash=False, dropout=True
    )
    assert 1.0 < f < 1.5
    for kind in ("gemm", "attention", "hbm", "scores_hbm"):
        assert getattr(fwd, kind) == pytest.approx(f * getattr(raw, kind), rel=1e-12)
    m = get_model("gpt3-175b")
    assert T.head_forward(m, p, 4096, 8).gemm == pytest.approx(
        f * T.head_forward(m, bare, 4096, 8).gemm
    )
    assert T.gemm_time(p, 4096, 4096, 4096) == T.gemm_time(bare, 4096, 4096, 4096)


def test_the_calibrated_layer_meets_the_same_tables_backward_times_it_was_not_set_from():
    # Korthikanti Table 4 also prints the backward of that layer: 11.9 ms (no recompute), 13.2 ms
    # (selective recompute), 19.5 ms (full recompute). Only the forward set the factor. The
    # backward: kernels per train_time, the two all-reduces hidden behind the weight-gradient GEMMs
    # (Sec. 6.2), plus the recomputed part (full: the forward with its all-reduces; selective:
    # the attention core and its scores' softmax and dropout).
    p = load_builtin("dgx-a100")
    fwd = T.layer_forward(
        _gpt_layer(), False, p, 4 * 2048, 2048, 8, False, 1, 1, flash=False, dropout=True
    )
    all_reduces = 2 * (2 * 7 / 8 * 2048 * 4 * 6144 * 2 / 240e9 + 2e-6)
    assert all_reduces < fwd.gemm  # hidden
    backward = T.train_time(fwd) - fwd.total
    assert backward == pytest.approx(11.9e-3, rel=0.05)
    assert backward + fwd.attention_only().total == pytest.approx(13.2e-3, rel=0.05)
    assert backward + fwd.total + all_reduces == pytest.approx(19.5e-3, rel=0.05)


def test_a_profile_without_a_measured_layer_is_not_scaled():
    p = load_builtin("h200")
    assert T.calibration_layer(p) is None and T.layer_time_factor(p) == 1.0
    m = get_model("gpt3-175b")
    f = T.layer_forward(m, False, p, 4096, 4096, 8)
    assert f.gemm == pytest.approx(T.gemms_time(p, T.layer_gemms(m, False, 4096, 8)), rel=1e-12)


@pytest.mark.parametrize(
    "field,value",
    [
        ("measured_ms", 0),
        ("tp", 2.5),
        ("dropout", "yes"),
        ("heads", 5),
        ("source", ""),
        ("hidden", None),
    ],
)
def test_a_bad_measured_layer_is_refused_with_its_field(field, value):
    import json

    from moe_repro.components.network.platform import from_dict

    doc = json.loads(
        (Path(__file__).parents[1] / "components/network/platforms/dgx-a100.json").read_text()
    )
    cal = doc["calibration"]["layer_forward"]
    if value is None:
        del cal[field]
    else:
        cal[field] = value
    with pytest.raises(ValueError, match="calibration.layer_forward"):
        from_dict(doc)
