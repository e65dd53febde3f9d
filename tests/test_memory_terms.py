"""The memory terms beyond live tensors (memory_terms) and the memory kinds of the planners'
model (memory_model): each expected value is worked out here from the cited source's rule."""

from __future__ import annotations

import copy

import pytest
from click.testing import CliRunner

from moe_repro.components.model.zoo import get_model
from moe_repro.components.network.platform import from_dict, load_platform
from moe_repro.components.resources import memory_model as mm
from moe_repro.components.resources import memory_terms as MT

MiB = 2**20
H100 = load_platform("dgx-h100")
LLAMA = get_model("llama3-8b")
MIXTRAL = get_model("mixtral-8x7b")
C = 9_633_792  # NCCL buffers per connection: LL 8*512*8*16 + LL128 120*640*8*8 + SIMPLE 4 MiB


def extras(sm: mm.StageMemory) -> dict[str, float]:
    return dict(sm.extras)


def device(m, layout, seq=4096, zero=1, settings=None, p=H100, kind="device"):
    return mm.per_gpu_memory(m, p, layout, seq, kind=kind, zero=zero, settings=settings)


# --- cuBLAS workspaces (PyTorch CublasHandlePool.cpp) ---------------------------------------


def test_cublas_workspaces_per_architecture():
    # sm90: ":4096:8" = 4096 KiB x 8; else ":4096:2:16:8"; ROCm adds hipBLASLt's 76 MiB; two
    # handles (Python thread, autograd device thread)
    assert MT.cublas_workspaces(MT.device_facts(H100)) == 2 * 32 * MiB
    a100 = MT.device_facts(load_platform("dgx-a100"))
    assert MT.cublas_workspaces(a100) == 2 * (4096 * 1024 * 2 + 16 * 1024 * 8)
    mi250x = MT.device_facts(load_platform("frontier"))
    assert mi250x.cublas_workspace_bytes == 8_519_680 + 76 * MiB


def test_profile_memory_block_overrides_and_is_checked():
    raw = copy.deepcopy(H100.raw)
    raw["memory"] = {"cuda_context_MB": 500, "cublas_workspace_MiB": 8, "nccl_channels": 24}
    f = MT.device_facts(from_dict(raw))
    assert (f.cuda_context_bytes, f.cublas_workspace_bytes) == (500e6, 8 * MiB)
    assert (f.nccl_channels, f.nccl_channels_per_nvl_peer) == (24, 24)
    assert MT.nccl_collective(4, f) == 24 * C
    raw["memory"] = {"nccl_channels": -1}
    with pytest.raises(ValueError, match="memory.nccl_channels"):
        MT.device_facts(from_dict(raw))


# --- NCCL (src/init.cc, src/include/device.h) ------------------------------------------------


def test_nccl_connection_bytes_by_hand():
    assert MT.NCCL_CONNECTION_BYTES == 524_288 + 4_915_200 + 4_194_304 == C
    f = MT.device_facts(H100)
    assert MT.nccl_collective(1, f) == 0
    assert MT.nccl_collective(2, f) == 16 * C
    # 3 NVLink peers x 16 channels + 2 off-node peers x NCCL_NCHANNELS_PER_NET_PEER (2)
    assert MT.nccl_p2p(3, 2, f) == (48 + 4) * C


def test_nccl_buffers_grow_with_the_layouts_communicators():
    # TP 2 x PP 2 x DP 2 on one node: stage 0 uses the TP and DP collectives and one PP peer
    sm = device(LLAMA, mm.MemoryLayout(tp=2, pp=2, dp=2, sp=True, micro_batches=4))
    assert extras(sm)["NCCL buffers"] == 3 * 16 * C
    # EP 8 all-to-all inside a node: DP collective + 7 NVLink peers; EDP = 1, ETP = 1
    sm = device(MIXTRAL, mm.MemoryLayout(dp=8, ep=8))
    assert extras(sm)["NCCL buffers"] == (16 + 7 * 16) * C
    # EP 16 over two nodes: 7 NVLink peers, 8 off-node peers at 2 channels each
    deepseek = get_model("deepseek-v3")
    sm = device(deepseek, mm.MemoryLayout(dp=16, ep=16, pp=1), seq=1024)
    assert extras(sm)["NCCL buffers"] == (16 + 7 * 16 + 8 * 2) * C


# --- DeepEP (csrc/config.hpp, deep_ep/buffer.py, Megatron fused_a2a.get_buffer) -------------


def test_deepep_buffers_by_hand():
    # hidden 7168 bf16: 14336 B; num_sms 20 -> 10 channels; per received token
    # 14336 + 8 (SourceMeta) + 128 x 8 + 128 x 4 + 128 x 4 = 16392 B
    # EP 8 (one node): 8 NVL ranks, 1 RDMA rank, 256 received tokens per chunk (both configs)
    nvl8 = 10 * 8 * (2 * 1 + 3) * 4 + 10 * 8 * 256 * 16392  # 335_709_760 -> 128-B aligned
    assert MT.deepep_buffers(7168, 8) == 335_709_824 == -(-nvl8 // 128) * 128
    # EP 16: NVL 288 tokens; RDMA: 2 ranks, 128 tokens aligned up to the send chunk (20 -> 140,
    # 12 -> 132), send + receive halves, + sizeof(int4) per token: 16408 B
    nvl16 = 10 * 8 * (2 * 2 + 3) * 4 + 10 * 8 * 288 * 16392
    rdma16 = 10 * 2 * 18 * 2 * 4 + 10 * 2 * 140 * 16408 * 2
    expected = -(-nvl16 // 128) * 128 + -(-rdma16 // 128) * 128
    assert MT.deepep_buffers(7168, 16) == expected == 469_561_728
    assert MT.deepep_buffers(7168, 1) == 0


def test_deepep_dispatcher_swaps_the_nccl_all_to_all_for_its_buffers():
    ds = get_model("deepseek-v3")
    lay = mm.MemoryLayout(dp=8, ep=8)
    facts = MT.device_facts(H100)
    a2a = extras(device(ds, lay, seq=1024, settings=MT.MemorySettings(facts=facts)))
    deep = extras(
        device(ds, lay, seq=1024, settings=MT.MemorySettings(facts=facts, dispatcher="deepep"))
    )
    assert "DeepEP buffers" not in a2a and deep["DeepEP buffers"] == 335_709_824
    assert a2a["NCCL buffers"] - deep["NCCL buffers"] == 7 * 16 * C


# --- MoE dispatch, logits and loss, gradient reduction, optimizer step ----------------------


def test_moe_dispatch_transient_expected_and_worst_case():
    # Mixtral, 4096 tokens on this rank, top-2, h 4096, bf16
    assert MT.moe_dispatch_transient(4096, 4096, 2) == 4096 * 2 * 4096 * 2
    # dropless worst case, EP 8 with one local expert: all 8 ranks' tokens, one copy each
    worst = MT.moe_dispatch_transient(4096, 4096, 2, ep=8, local_experts=1, worst_case=True)
    assert worst == 8 * 4096 * 4096 * 2
    sm = device(MIXTRAL, mm.MemoryLayout(dp=8, ep=8), kind="allocated")
    assert extras(sm)["MoE dispatch transient"] == 4096 * 2 * 4096 * 2
    dense = device(LLAMA, mm.MemoryLayout(dp=8), kind="allocated")
    assert "MoE dispatch transient" not in extras(dense)


def test_logits_and_loss_transient_by_framework():
    # vocab-parallel CE (Megatron): 2 B per logit over the 4 B kept; torch CE on .float(): 8 B
    assert MT.logits_loss_transient(4096, 128256, 2) == 2 * 4096 * 128256 / 2
    assert MT.logits_loss_transient(4096, 128256, 2, "torch") == 8 * 4096 * 128256 / 2
    lay = mm.MemoryLayout(dp=8)
    megatron = extras(device(LLAMA, lay, zero=1, kind="allocated"))
    fsdp = extras(device(LLAMA, lay, zero=3, kind="allocated"))
    assert megatron["fp32 logits and loss transient"] == 2 * 4096 * 128256
    assert fsdp["fp32 logits and loss transient"] == 8 * 4096 * 128256
    with pytest.raises(ValueError, match="loss"):
        MT.logits_loss_transient(1, 1, 1, "fp8")


def test_gradient_reduction_buffers():
    assert MT.grad_reduction_buffers("megatron", 1e9, 8e9, 2) == 0
    assert MT.grad_reduction_buffers("torch-ddp", 1e9, 8e9, 2) == 16e9
    # FSDP2 (ZeRO-3): Llama 3 8B's layer: Q, O 4096^2, K, V 4096 x 1024, MLP 3 x 4096 x 14336,
    # two norms; its unsharded bf16 gradients (2 B) + the fp32 reduce-scatter input (4 B)
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    sm = device(LLAMA, mm.MemoryLayout(dp=8), zero=3, kind="allocated")
    assert extras(sm)["gradient reduction buffers"] == layer * (2 + 4)
    assert MT.grad_reduction_buffers("fsdp2", 1e9, 8e9, 2, reduce_bytes=2) == 4e9


def test_optimizer_step_temporaries_count_only_above_the_backward_peak():
    assert MT.optimizer_step_temporaries(1e9, 4, "fused") == 0
    assert MT.optimizer_step_temporaries(1e9, 4, "foreach") == 4e9
    facts = MT.device_facts(H100)
    foreach = MT.MemorySettings(facts=facts, optimizer="foreach")
    # ZeRO-1 over DP 8: 8,030,261,248 / 8 parameters' fp32 second moments, at a short sequence
    # where the step's temporaries exceed the backward's activations and logits
    sm = device(LLAMA, mm.MemoryLayout(dp=8), seq=128, settings=foreach, kind="allocated")
    step = 8_030_261_248 / 8 * 4
    backward = sm.activations + 2 * 128 * 128256
    assert extras(sm)["optimizer-step temporaries"] == pytest.approx(step - backward, rel=1e-12)
    long = device(LLAMA, mm.MemoryLayout(dp=8), seq=8192, settings=foreach, kind="allocated")
    assert extras(long)["optimizer-step temporaries"] == 0  # the backward peak is higher


# --- caching allocator (c10/cuda/CUDACachingAllocator.cpp) ----------------------------------


def test_allocator_rounding_rules():
    assert MT.round_size(1) == 512 and MT.round_size(513) == 1024
    assert MT.segment_size(MiB) == 2 * MiB  # small pool
    assert MT.segment_size(MiB + 1) == 20 * MiB  # kLargeBuffer below kMinLargeAlloc
    assert MT.segment_size(10 * MiB) == 10 * MiB  # rounded to kRoundLarge
    assert MT.segment_size(10 * MiB + 1) == 12 * MiB
    assert MT.segment_rounding([MiB + 1, 10 * MiB + 1]) == (20 * MiB - MiB - 1) + (2 * MiB - 1)
    assert MT.fragmentation(5 * 2**30 + 1) == 5 * 2**30 + 2 * MiB
    assert MT.fragmentation(5 * 2**30, expandable_segments=True) == 0


def test_reserved_adds_the_largest_transient_unless_expandable_segments():
    facts = MT.device_facts(H100)
    lay = mm.MemoryLayout(dp=8)
    kw = dict(seq=4096, zero=3, kind="reserved")
    r = extras(device(LLAMA, lay, settings=MT.MemorySettings(facts=facts), **kw))
    loss = 8 * 4096 * 128256  # the largest transient here: torch's loss at ZeRO-3
    assert r["allocator: fragmentation"] == MT.segment_size(loss)
    exp = MT.MemorySettings(facts=facts, expandable_segments=True)
    assert extras(device(LLAMA, lay, settings=exp, **kw))["allocator: fragmentation"] == 0


# --- kinds and the default --------------------------------------------------------------------


def test_default_kind_is_the_live_tensor_model_with_the_profile_overhead():
    lm = mm.LayerMemory(LLAMA, 4096, mm.F.precision("bf16-adam"))
    layout = mm.MemoryLayout(dp=8)
    legacy = mm.LayoutMemory(lm, layout, mm.pipeline_stages(LLAMA, 1), 4e9).stage(1, "none", 0, 0)
    assert legacy.extras == () and legacy.buffers == 4e9
    assert legacy.to_dict() == {
        **legacy.terms(),
        "total": legacy.total,
        "host": 0.0,
    }
    for kind in MT.KINDS:
        sm = device(LLAMA, layout, kind=kind)
        assert sm.buffers == 0.0 and sm.kind == kind
        assert {n for n, _ in sm.extras} <= {
            n for n, k in MT.KIND_OF.items() if MT.includes(kind, k)
        }
        assert [r[0] for r in sm.breakdown()][:5] == list(mm.StageMemory.TERMS)
        assert all(src for _, _, src in sm.breakdown())
    with pytest.raises(ValueError, match="memory kind"):
        mm.LayerMemory(LLAMA, 4096, mm.F.precision("bf16-adam"), kind="peak")


def test_every_term_has_a_source_a_citation_and_a_kind():
    extra = set(MT.KIND_OF)
    assert set(MT.SOURCES) == set(MT.CITATIONS) == extra | set(mm.StageMemory.TERMS)
    assert set(MT.KIND_OF.values()) == set(MT.KINDS)


# --- repro plan --explain-memory / --memory-margin --------------------------------------------


def _plan(*args):
    from moe_repro.cli import cli

    return CliRunner().invoke(cli, ["plan", *args])


def test_explain_memory_lists_every_term_with_its_source():
    r = _plan(
        "--model", "mixtral-8x7b", "--platform", "dgx-h100", "--nodes", "1", "--tp", "1",
        "--pp", "1", "--ep", "8", "--zero", "1", "--recompute", "full", "--explain-memory",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    out = r.output
    assert "kind device (nvidia-smi)" in out and "margin 10%" in out
    for term in [*mm.StageMemory.TERMS, "NCCL buffers", "CUDA context", "MoE dispatch transient"]:
        line = next(x for x in out.splitlines() if x.startswith(term + " "))
        assert "%" in line and MT.CITATIONS[term] in line
    assert out.rstrip().splitlines()[-1].startswith("best:")


def test_memory_margin_moves_the_usable_hbm():
    args = ["--model", "llama3-8b", "--platform", "dgx-h100", "--nodes", "1", "--tp", "1"]
    r = _plan(*args, "--pp", "1", "--zero", "3", "--memory-margin", "0.25")
    assert r.exit_code == 0, r.output
    # an 80 GB H100 gives PyTorch 79.11 GiB (its out-of-memory message; dgx-h100's sources)
    assert f"({79.11 * 0.75:.1f} usable, 25% kept free)" in r.output


@pytest.mark.parametrize("value", ["1", "-0.1", "ten"])
def test_bad_memory_margin_is_a_one_line_error(value):
    r = _plan("--model", "llama3-8b", "--platform", "dgx-h100", "--nodes", "1",
              "--memory-margin", value)  # fmt: skip
    assert r.exit_code == 2
    assert "--memory-margin must be a fraction" in r.output and "Traceback" not in r.output


def test_help_shows_both_options_with_examples():
    r = _plan("--help")
    text = " ".join(r.output.split())
    assert "--explain-memory" in text and "--memory-margin" in text
    assert "Example: --memory-margin 0.05" in text
    assert (
        "Example: repro plan --model mixtral-8x7b --nodes 2 --platform dgx-h100 --explain-memory"
        in text
    )


def test_explain_memory_for_a_layout_that_does_not_fit_and_for_piper():
    # one node cannot hold Mixtral's 16 B/param state: the closest miss is explained
    r = _plan(
        "--model", "mixtral-8x7b", "--platform", "dgx-h100", "--nodes", "1", "--tp", "8",
        "--pp", "1", "--zero", "0", "--recompute", "full", "--explain-memory",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "does not fit" in r.output and "NCCL buffers" in r.output
    # Piper's method explains its own check: the live terms with the profile's overhead
    r = _plan("--method", "piper", "--model", "tiny-moe", "--platform", "dgx-h100",
              "--nodes", "1", "--explain-memory")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "kind live" in r.output and "NCCL buffers" not in r.output
    assert "buffers " in r.output and "margin 0%" in r.output


def test_plan_for_torchtitan_predicts_what_the_validation_set_scores(tmp_path):
    """--framework torchtitan takes the settings the memory set scores torchtitan's runs with:
    on a scored point's layout the plan's terms are the point's prediction (max reserved) plus
    the device-only terms (CUDA context, NCCL buffers) nvidia-smi adds."""
    import json

    from moe_repro.reproductions import validation as V

    point = next(p for p in V.load_points()["points"] if p["id"] == "torchtitan24-2-llama3-8b-cp1")
    _, _, terms = V.predict_memory_terms({**point, "settings": {}})  # the framework's own
    out = tmp_path / "plan.json"
    r = _plan(
        "--model", "llama3-8b", "--platform", "grand-teton-h100", "--nodes", "1", "--tp", "1",
        "--pp", "1", "--cp", "1", "--zero", "3", "--recompute", "full", "--seq", "32768",
        "--global-batch", "8", "--framework", "torchtitan", "--json", str(out),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "the framework's settings: " in r.output and "mlp eager" in r.output
    plan = json.loads(out.read_text())
    assert plan["framework"] == "torchtitan" and plan["memory_settings"]["mlp"] == "eager"
    memory = plan["candidates"][0]["memory"]
    for name, gib in terms.items():
        assert memory[name] / 2**30 == pytest.approx(gib, rel=1e-9), name
    device_only = memory["CUDA context"] + memory["NCCL buffers"]
    assert memory["total"] / 2**30 == pytest.approx(sum(terms.values()) + device_only / 2**30)
    # the default plans the same run as Megatron-core would keep it: another number
    r = _plan(
        "--model", "llama3-8b", "--platform", "grand-teton-h100", "--nodes", "1", "--tp", "1",
        "--pp", "1", "--cp", "1", "--zero", "3", "--recompute", "full", "--seq", "32768",
        "--global-batch", "8", "--json", str(out),
    )  # fmt: skip
    assert json.loads(out.read_text())["candidates"][0]["memory"]["total"] != memory["total"]


def test_framework_is_refused_for_piper_and_unknown_names_in_one_line():
    r = _plan("--method", "piper", "--model", "tiny-moe", "--platform", "dgx-h100",
              "--nodes", "1", "--framework", "torchtitan")  # fmt: skip
    assert r.exit_code == 2 and "--framework applies to --method parallel" in r.output
    r = _plan("--model", "llama3-8b", "--platform", "dgx-h100", "--nodes", "1",
              "--framework", "jax")  # fmt: skip
    assert r.exit_code == 2 and "Traceback" not in r.output
