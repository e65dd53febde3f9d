"""Dispatch/combine pipelined with the expert GEMMs (components/moe/overlap.py) equals the
unpipelined layer and the loop reference, forward and backward (output, input gradient, gate,
expert and shared-expert gradients), over real gloo ranks: uneven routing, empty experts, a
zero-token rank, a rank that receives nothing, a non-contiguous placement, more chunks than a
rank has experts, fp32 and bf16. Plus what ``auto`` and bad values mean."""

import pytest
import torch

from moe_repro.components.moe.moe_layer import MoEConfig, MoELayer
from moe_repro.components.moe.overlap import chunks_for, parse_overlap
from moe_repro.runtime.launch import run_ranks

TOL = {"float32": 1e-5, "bfloat16": 2e-2}
_BASE = dict(d_model=12, d_ffn=10, top_k=2)


def test_overlap_values():
    assert parse_overlap("off") == 1 and parse_overlap("auto") is None
    assert parse_overlap("3") == 3 and parse_overlap(2) == 2
    for bad in ("0", "-1", "some", 1.5j):
        with pytest.raises(ValueError):
            parse_overlap(bad)
    with pytest.raises(ValueError, match="overlap"):
        MoELayer(8, 4, 4, 2, overlap="sometimes")
    assert MoEConfig(8, 4, 4, 2).overlap == "auto"
    assert MoELayer(8, 4, 4, 2).overlap_chunks() == 1  # one rank: nothing to overlap
    assert MoELayer(8, 4, 4, 2, overlap="4").overlap_chunks() == 1


def test_auto_pipelines_on_a_gpu_only():
    """auto: 2 chunks under EP with the flat all-to-all on a GPU; on a CPU the all-to-all's
    threads share the cores the GEMMs use, so it stays unpipelined; a count is obeyed."""
    assert chunks_for("auto", True, "flat", 4, "cuda") == 2
    assert chunks_for("auto", True, "flat", 4, "cpu") == 1
    assert chunks_for("auto", True, "flat", 1, "cuda") == 1  # one expert per rank
    assert chunks_for("auto", True, "halo", 4, "cuda") == 1
    assert chunks_for("3", True, "flat", 4, "cpu") == 3
    assert chunks_for("3", False, "flat", 4, "cuda") == 1


def _check(results, dtype="float32"):
    for rank_results in results:
        for r in rank_results:
            assert max(r["errs_vs_off"].values()) < TOL[dtype], r
            if dtype == "float32":  # bf16 gate logits may flip a near tie against the float64
                # reference (the same flip in both layers); tests/test_moe_bf16.py checks the
                # bf16 layer against it on inputs without near ties
                assert max(r["errs"].values()) < TOL[dtype], r


@pytest.mark.multiprocess
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_overlap_equals_unpipelined_two_ranks(targets_on_path, dtype):
    cases = [
        dict(_BASE, seed=31, experts=4, tokens=[17, 9], dead=(1,), overlap="2", dtype=dtype),
        # zero-token rank 0; rank 1's experts are dead: it receives nothing
        dict(
            _BASE,
            seed=32,
            experts=4,
            tokens=[0, 13],
            dead=(2, 3),
            overlap="2",
            shared=1,
            dtype=dtype,
        ),
        dict(
            _BASE,
            seed=33,
            experts=6,
            tokens=[11, 14],
            rank_of_expert=[1, 0, 1, 1, 0, 0],
            overlap="3",
            gemm="padded_bmm",
            dtype=dtype,
        ),
        # more chunks than experts per rank: empty chunks still exchange (nothing)
        dict(_BASE, seed=34, experts=4, tokens=[8, 12], dead=(0,), overlap="5", dtype=dtype),
        dict(_BASE, seed=35, experts=4, tokens=[10, 6], overlap="auto", dtype=dtype),
    ]
    results = run_ranks(
        "_moe_targets:overlap_vs_unpipelined", {"cases": cases}, world_size=2, timeout_s=150
    )
    _check(results, dtype)
    assert [r["chunks"] for r in results[0]] == [2, 2, 3, 5, 1]  # auto on a CPU: unpipelined
    assert {r["out_dtype"] for r in results[0]} == {str(getattr(torch, dtype))}


@pytest.mark.multiprocess
def test_overlap_equals_unpipelined_four_ranks(targets_on_path):
    cases = [
        dict(_BASE, seed=36, experts=8, tokens=[9, 0, 14, 5], dead=(2, 3, 6), overlap="2"),
        dict(
            _BASE,
            seed=37,
            experts=8,
            tokens=[7, 12, 3, 0],
            rank_of_expert=[3, 0, 2, 1, 1, 3, 0, 2],
            dead=(5,),
            overlap="2",
            shared=1,
        ),
    ]
    results = run_ranks(
        "_moe_targets:overlap_vs_unpipelined", {"cases": cases}, world_size=4, timeout_s=150
    )
    _check(results)


@pytest.mark.multiprocess
def test_async_counts_exchange_equals_blocking(targets_on_path):
    results = run_ranks("_moe_targets:counts_async_vs_blocking", {}, world_size=2, timeout_s=60)
    want = [[0, 5, 1], [1, 5, 4]]
    assert all(r["async"] == r["blocking"] == want for r in results), results


def test_the_trainers_blocks_pipeline_unless_checkpointed():
    """repro train's MoE blocks take the layer's overlap (auto); checkpointed blocks stay
    unpipelined (their recomputation would run inside the pipelined backward)."""
    from moe_repro.components.model.moe_transformer import StageModule, TransformerConfig

    cfg = TransformerConfig.from_zoo("tiny-moe")
    for checkpoint, want in ((False, "auto"), (True, "off")):
        stage = StageModule(cfg, [0], True, True, checkpoint=checkpoint)
        assert [b.moe.layer.overlap for b in stage.blocks()] == [want]
