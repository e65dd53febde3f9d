"""The ``auto`` grouped-GEMM kernel (components/moe/kernel_choice.py): the documented fallback
without a table, a measured table of this machine obeyed (nearest shape, its device and dtype
only), another machine's table ignored, the suite's records turned into a table, and ``auto`` as
the default of the expert MLP, the layer, its config and the moe-layer suite (each record says
the kernel). conftest gives every test its own empty table."""

import json

import pytest
import torch

from moe_repro.components.moe import kernel_choice as kc
from moe_repro.components.moe.expert_mlp import ExpertMLP
from moe_repro.components.moe.grouped_gemm import gemm_choices, grouped_gemm, grouped_gemm_names
from moe_repro.components.moe.moe_layer import MoEConfig, MoELayer


def _choose(*args):
    return kc.choose_kernel(*args, runnable=grouped_gemm_names())


def _entry(kernel, t, k=64, m=64, dtype="float32", device="cpu"):
    return {
        "device": device,
        "dtype": dtype,
        "tokens_per_expert": t,
        "K": k,
        "M": m,
        "kernel": kernel,
        "tflops": 1.0,
    }


def test_fallback_rule_without_a_table():
    want = "grouped_mm" if hasattr(torch, "_grouped_mm") else "padded_bmm"
    for dtype in (torch.float32, torch.bfloat16):
        choice = _choose("cpu", dtype, 100, 64, 64)
        assert choice == kc.Choice(want, "fallback")
    assert "sequential" not in (kc.fallback_kernel("cpu", torch.float32),)


def test_table_of_this_machine_is_obeyed_nearest_shape():
    kc.write_table(
        [
            _entry("padded_bmm", 16),
            _entry("sequential", 1024),
            _entry("grouped_mm", 16, dtype="bfloat16"),
        ]
    )
    assert _choose("cpu", torch.float32, 20, 64, 64) == kc.Choice("padded_bmm", "table")
    assert _choose("cpu", torch.float32, 900, 64, 64) == kc.Choice("sequential", "table")
    assert _choose("cpu", torch.bfloat16, 900, 64, 64).kernel == "grouped_mm"
    # a device type with no entry: the fallback rule
    assert _choose("meta", torch.float32, 20, 64, 64).source == "fallback"


def test_table_measured_only_at_far_shapes_gives_way_to_the_fallback():
    # a quick run's table (small T, K, M) must not pick the layer's kernel at its default shape
    kc.write_table([_entry("sequential", 16, 256, 176), _entry("sequential", 128, 256, 176)])
    assert _choose("cpu", torch.float32, 384, 1024, 704).source == "fallback"
    assert _choose("cpu", torch.float32, 128, 512, 176) == kc.Choice("sequential", "table")
    assert _choose("cpu", torch.float32, 128, 600, 176).source == "fallback"  # K 2.3x away


def test_a_training_call_takes_only_entries_that_timed_the_backward():
    """The expert-gemm suite times the forward; a call that will be differentiated takes the
    fallback unless an entry timed forward + backward."""
    kc.write_table([_entry("padded_bmm", 16)])  # no passes: forward (what the suite writes)
    assert _choose("cpu", torch.float32, 16, 64, 64).kernel == "padded_bmm"
    trained = kc.choose_kernel("cpu", torch.float32, 16, 64, 64, grouped_gemm_names(), True)
    assert trained.source == "fallback"
    kc.write_table([dict(_entry("sequential", 16), passes=kc.TRAINING)])
    trained = kc.choose_kernel("cpu", torch.float32, 16, 64, 64, grouped_gemm_names(), True)
    assert trained == kc.Choice("sequential", "table")
    mlp = ExpertMLP(2, 64, 64)  # its weights require grad: a training call under grad mode
    mlp(torch.randn(32, 64), torch.tensor([16, 16]))
    assert mlp.last_choice == kc.Choice("sequential", "table")
    with torch.no_grad():  # forward only: the (newer) forward entry for the same shape
        kc.write_table([_entry("padded_bmm", 16)])
        mlp(torch.randn(32, 64), torch.tensor([16, 16]))
    assert mlp.last_choice == kc.Choice("padded_bmm", "table")


def test_table_of_another_machine_is_ignored():
    path = kc.table_path("cpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    other = dict(kc.machine_identity("cpu"), cpu="some other CPU")
    path.write_text(json.dumps({"machine": other, "entries": [_entry("padded_bmm", 16)]}))
    kc.load_table.cache_clear()
    assert _choose("cpu", torch.float32, 16, 64, 64).source == "fallback"


def test_table_from_records_keeps_the_fastest_correct_kernel():
    base = dict(dtype="float32", tokens_per_expert=64, K=32, M=48, device_type="cpu")
    records = [
        dict(base, variant="sequential", tflops=1.0, wrong=0),
        dict(base, variant="padded_bmm", tflops=3.0, wrong=2),  # fastest but wrong: not taken
        dict(base, variant="grouped_mm", tflops=2.0, wrong=0),
        dict(base, variant="dense", tflops=9.0, wrong=0),  # the ceiling, not a kernel
    ]
    (entry,) = kc.table_from_records(records)
    assert entry["kernel"] == "grouped_mm" and (entry["K"], entry["M"]) == (32, 48)


def test_expert_gemm_summary_writes_the_table():
    from moe_repro.suites.grouped_gemm import kernel_table

    recs = [
        dict(
            variant="padded_bmm",
            dtype="float32",
            tokens_per_expert=8,
            K=16,
            M=16,
            tflops=1.0,
            wrong=0,
            device_used="cpu",
        )
    ]
    (line,) = kernel_table(recs)
    assert str(kc.table_path("cpu")) in line
    assert _choose("cpu", torch.float32, 8, 16, 16) == kc.Choice("padded_bmm", "table")


def test_auto_is_the_default_and_says_what_it_ran():
    assert MoEConfig(8, 4, 4, 2).gemm == "auto"
    layer = MoELayer(8, 4, 4, 2)
    assert layer.experts.gemm == "auto"
    layer(torch.randn(10, 8))
    assert layer.experts.last_choice == _choose("cpu", torch.float32, 5.0, 8, 4)
    assert ExpertMLP(2, 8, 4).gemm == "auto"
    assert gemm_choices()[0] == "auto"
    with pytest.raises(ValueError, match="known"):
        ExpertMLP(2, 8, 4, gemm="nosuch")


def test_auto_follows_the_table_and_matches_the_loop():
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(13, 16, generator=g), torch.randn(3, 16, 8, generator=g)
    counts = torch.tensor([6, 0, 7])
    ref = torch.cat([c @ w[i] for i, c in enumerate(torch.split(x, counts.tolist()))])
    kc.write_table([_entry("padded_bmm", 4, 16, 8)])
    mlp = ExpertMLP(3, 16, 8, activation="relu")
    with torch.no_grad():
        mlp(torch.randn(13, 16), counts)
    assert mlp.last_choice == kc.Choice("padded_bmm", "table")
    assert torch.allclose(grouped_gemm(x, w, counts, "auto"), ref, atol=1e-5)


def test_moe_layer_suite_records_the_kernel():
    from moe_repro.suites.moe_layer import SUITE, gemm_used

    assert SUITE.params["gemm"] == ["auto"]
    p = dict(
        gemm="auto",
        device="cpu",
        dtype="float32",
        tokens=64,
        ranks=2,
        top_k=2,
        experts=8,
        d_model=32,
        d_ffn=16,
    )
    used = gemm_used(p)
    assert used == {
        "gemm_used": kc.fallback_kernel("cpu", torch.float32),
        "gemm_rule": "fallback",
        "overlap_chunks": 1,  # auto on a CPU: unpipelined (overlap.chunks_for)
    }
    named = gemm_used(dict(p, gemm="sequential", overlap="off"))
    assert named == {"gemm_used": "sequential", "gemm_rule": "named", "overlap_chunks": 1}


def test_the_trainers_layer_runs_auto():
    """repro train's blocks (pp_ep_trainer -> moe_transformer) build MoELayer with its defaults."""
    from moe_repro.components.model.moe_transformer import ExpertParallelMoE, TransformerConfig

    block = ExpertParallelMoE(TransformerConfig.from_zoo("tiny-moe"))
    assert block.layer.experts.gemm == "auto" and block.layer.overlap == "auto"


def test_moe_layer_output_says_the_kernel():
    from moe_repro.suites.moe_layer import SUITE

    recs = [
        dict(
            impl="pft",
            gemm="auto",
            gemm_used="grouped_mm",
            gemm_rule="fallback",
            overlap_chunks=2,
            dtype=d,
        )
        for d in ("float32", "bfloat16")
    ]
    assert SUITE.summary is not None
    assert SUITE.summary(recs) == [
        "pft: gemm=auto ran grouped_mm (fallback), overlap chunks 2 [bfloat16, float32]"
    ]


def test_fallback_probe_is_the_same_under_no_grad_and_leaves_the_rng():
    """The first auto call may come under no_grad (the suites' timed calls) or inference mode:
    the probe still runs its backward; and it draws nothing from the global generator."""
    kc._grouped_mm_works.cache_clear()
    torch.manual_seed(3)
    want = torch.rand(3)
    torch.manual_seed(3)
    with torch.no_grad():
        first = kc.fallback_kernel("cpu", torch.float32)
    assert torch.equal(torch.rand(3), want)
    kc._grouped_mm_works.cache_clear()
    with torch.inference_mode():
        assert kc.fallback_kernel("cpu", torch.float32) == first
    kc._grouped_mm_works.cache_clear()
    assert kc.fallback_kernel("cpu", torch.float32) == first
    assert first == ("grouped_mm" if hasattr(torch, "_grouped_mm") else "padded_bmm")
