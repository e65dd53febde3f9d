"""Our memory model's terms against PyTorch's own accounting, for MoE layer stacks.

components/resources/fake_memory.py runs one FSDP2 training step of a scaled-down zoo model
(Mixtral 8x7B and Qwen3-30B-A3B, widths / 16 and / 8, 2 layers) on rank 0 of an 8-rank fake
process group under FakeTensorMode, with the experts expert-parallel as torchtitan shards them
(EP ranks hold E / EP experts; the experts' module is its own FSDP unit on the world / EP ranks
left). FSDPMemTracker files every tensor by category. Routing is balanced by construction: copy j
of token t goes to expert (t k + j) mod E, every expert gets T k / E copies (dropless, no
padding), which is what the planner's capacity factor 1 assumes; ``load`` = 2 doubles the copies
the measured rank's experts receive (the planner's capacity factor 2).

Tolerances. Fake tensors have exact sizes and the CPU device has no allocator rounding, so where
our model and PyTorch count the same tensors the bytes agree exactly and are compared with ==
(every byte count here is an integer well below 2^53). Where PyTorch keeps tensors our model does
not count, the test names each one, computes its bytes from the shapes and PyTorch's kernels
(below), and the exact agreement is asserted after adding them; the gap itself is asserted only
where the planner's formula claims it (fused SwiGLU, balanced routing: within 2.5%, the named
items' share at these shapes; see test_fused_swiglu_activations_within_the_formulas_promise).

Differences by construction (named, not tolerated):

- Model state: FSDP2's sharded parameter IS the fp32 master (4 B) and its sharded gradient is
  fp32 (4 B); ours has a bf16 weight (2 B) + bf16 grad (2 B) + fp32 master and Adam moments
  (12 B, the ``optimizer`` term). The totals are both 16 B per parameter / 8 ranks; PyTorch adds
  Adam's ``step`` counter (a 0-d fp32 tensor per parameter tensor).
- Activations: torchtitan's SwiGLU is eager (silu(w1 x) * w3 x keeps 4 d_ffn per routed copy);
  our formula counts Megatron-core's fused swiglu (3 d_ffn). SDPA keeps its fp32 log-sum-exp
  (4 B per head and token); the CPU LayerNorm keeps mean and rstd in the input's dtype (bf16);
  the routing keeps three int64 index tensors per routed copy (the gate gather, the dispatch
  gather, the combine's inverse permutation) and the bf16 gate weights the weighting multiply
  saves. With load > 1 the expert side (dispatch, intermediates) grows but the expert output the
  weighting keeps is back on the token's own rank (T k rows): our formula scales all three.
- Gathered weights: ours is two whole layers (prefetch); with the experts as a separate FSDP
  unit FSDP2 never holds two whole layers, only one layer and its neighbour's experts (backward
  prefetch): ours is an upper bound there, exact for a dense stack (test_fsdp2_memory.py).
- The peak total is not compared here: the peak falls in the backward (activation gradients,
  gradient reduce-scatter buffers) or in an MoE forward's dispatch buffers, terms our model does
  not have yet; docs/memory-accounting.md lists them.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from moe_repro.components.model.zoo import get_model
from moe_repro.components.resources import fake_memory as FM
from moe_repro.components.resources import formulas

WORLD = 8

MIXTRAL = FM.StackSpec.scaled(
    get_model("mixtral-8x7b"), width=16, layers=2, batch=2, seq=256, ep=4, world=WORLD
)
QWEN3 = FM.StackSpec.scaled(
    get_model("qwen3-30b-a3b"), width=8, layers=2, batch=2, seq=256, ep=8, world=WORLD
)
SPECS = {
    "mixtral/16 ep4 eager": MIXTRAL,
    "mixtral/16 ep4 fused": dataclasses.replace(MIXTRAL, swiglu="fused"),
    "mixtral/16 ep4 fused load2": dataclasses.replace(MIXTRAL, swiglu="fused", load=2.0),
    "qwen3/8 ep8 eager": QWEN3,
}


@functools.cache
def tracked(name: str) -> FM.TrackedMemory:
    return FM.measure_fake(SPECS[name])


def not_in_our_formula(s: FM.StackSpec) -> float:
    """Bytes of the activations PyTorch keeps that our formula does not count (module
    docstring), from the shapes and the kernels' saved tensors."""
    T, H = s.tokens, s.heads
    per_token = 4 * H  # aten._scaled_dot_product_flash_attention_for_cpu: fp32 lse (b, H, s)
    per_token += 2 * 2 * 2  # two LayerNorms' mean and rstd, bf16 on the CPU (native_layer_norm)
    extra = T * per_token
    if s.experts:
        home = T * s.top_k  # copies this rank sends and gets back
        recv = int(home * s.load)  # copies its experts receive
        extra += home * (3 * 8 + 2)  # three int64 index tensors + bf16 gate weights
        extra -= (recv - home) * s.d_model * 2  # our combine scales with load; it stays at home
        if s.n_mat == 3 and s.swiglu == "eager":
            extra += recv * s.d_ffn * 2  # silu(w1 x) kept as well
    elif s.n_mat == 3 and s.swiglu == "eager":
        extra += T * s.d_ffn * 2
    return s.layers * extra


def adam_steps(s: FM.StackSpec) -> int:
    """Adam's per-parameter ``step`` counters (0-d fp32): 2 norms + 4 attention matrices
    + router + the experts' n_mat batched matrices per layer."""
    return 4 * s.layers * (2 + 4 + 1 + s.n_mat)


@pytest.mark.parametrize("name", ["mixtral/16 ep4 eager", "qwen3/8 ep8 eager"])
def test_model_state_is_16_bytes_per_parameter_on_both_sides(name):
    s, got = SPECS[name], tracked(name)
    ours = FM.planner_memory(s)
    dense, expert = FM.parameter_count(s)  # counted from the modules
    assert expert > 10 * dense  # an MoE stack: the experts dominate the state
    per_rank = (dense + expert) / WORLD  # experts: / EP ranks, / (world / EP) FSDP ranks
    a = got.after_step
    assert a["SHARDED_PARAM"] == 4 * per_rank  # the fp32 master
    assert a["SHARDED_GRAD"] == 4 * per_rank  # fp32 reduce dtype
    assert a["OPT"] == 8 * per_rank + adam_steps(s)
    assert ours.weights + ours.grads + ours.optimizer == 16 * per_rank
    (row, *_) = FM.side_by_side(ours, got)
    assert row.ours == row.tracker - adam_steps(s)


@pytest.mark.parametrize("name", list(SPECS))
def test_activations_are_our_formula_plus_the_named_tensors(name):
    s, got = SPECS[name], tracked(name)
    ours = FM.planner_memory(s)
    theirs = got.after_forward["ACT"] - got.output
    assert theirs == ours.activations + not_in_our_formula(s)


@pytest.mark.parametrize("name", ["mixtral/16 ep4 fused"])
def test_fused_swiglu_activations_within_the_formulas_promise(name):
    """With Megatron-core's fused SwiGLU and balanced routing (what the formula is written for),
    ours is within 2.5% of PyTorch's count: the tensors named above are 4 H + 8 + 26 k bytes per
    token against ~ (16 + 4 k) d + 6 k d_ffn."""
    s, got = SPECS[name], tracked(name)
    theirs = got.after_forward["ACT"] - got.output
    assert FM.planner_memory(s).activations == pytest.approx(theirs, rel=0.025)


def test_eager_swiglu_is_the_known_activation_undercount():
    """torchtitan's eager SwiGLU keeps one d_ffn-wide tensor per routed copy more than our
    formula counts: the gap between the eager and fused runs is exactly that tensor."""
    eager, fused = tracked("mixtral/16 ep4 eager"), tracked("mixtral/16 ep4 fused")
    s = SPECS["mixtral/16 ep4 eager"]
    gap = eager.after_forward["ACT"] - fused.after_forward["ACT"]
    assert gap == s.layers * s.copies * s.d_ffn * 2


def test_gathered_weights_are_one_layer_and_the_neighbours_experts():
    s, got = SPECS["mixtral/16 ep4 eager"], tracked("mixtral/16 ep4 eager")
    dense, expert = FM.parameter_count(s)
    non_expert_layer = dense / s.layers * 2  # bf16, whole on every rank
    experts_unit = expert / s.layers / s.ep * 2  # this EP rank's experts, bf16
    theirs = got.category_peaks["gathered weights"]
    assert theirs == non_expert_layer + 2 * experts_unit
    ours = FM.planner_memory(s).buffers
    assert ours == 2 * (non_expert_layer + experts_unit)
    assert ours >= theirs  # an upper bound, by construction (module docstring)


# --------------------------------------------------------------------------------------------
# The comparison fails when the model is wrong
# --------------------------------------------------------------------------------------------


def test_doubling_the_experts_in_our_model_breaks_the_state_comparison():
    s, got = SPECS["mixtral/16 ep4 eager"], tracked("mixtral/16 ep4 eager")
    wrong = FM.planner_memory(dataclasses.replace(s, experts=2 * s.experts))
    (row, *_) = FM.side_by_side(wrong, got)
    assert row.ours != pytest.approx(row.tracker - adam_steps(s), rel=1e-3)
    assert row.rel > 0.5


def test_dropping_the_dispatch_term_breaks_the_activation_comparison(monkeypatch):
    name = "mixtral/16 ep4 fused"
    s, got = SPECS[name], tracked(name)
    real = formulas.moe_activation_terms_per_layer

    def without_dispatch(*a, **kw):
        terms = real(*a, **kw)
        terms.pop("dispatch", None)
        return terms

    monkeypatch.setattr(formulas, "moe_activation_terms_per_layer", without_dispatch)
    theirs = got.after_forward["ACT"] - got.output
    ours = FM.planner_memory(s).activations
    assert ours != pytest.approx(theirs - not_in_our_formula(s), rel=1e-3)
    assert ours != pytest.approx(theirs, rel=0.025)


def test_a_stack_the_builder_cannot_make_is_refused():
    with pytest.raises(ValueError, match="MLA|GQA"):
        FM.StackSpec.scaled(get_model("deepseek-v3"), width=16, layers=2, batch=2, seq=256)
    with pytest.raises(ValueError, match="ep"):
        dataclasses.replace(MIXTRAL, ep=3)


# --------------------------------------------------------------------------------------------
# The CUDA allocator's view, where there is a GPU
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="torch.cuda.memory._record_memory_history needs a CUDA device; none here",
)
def test_cuda_allocator_peak_is_the_fake_peak_within_rounding_and_kernel_differences():
    """The same step on a GPU: the caching allocator's peak against the fake run's. They count
    the same tensors except for kernels that save differently on CUDA (LayerNorm's fp32 mean and
    rstd, the CUDA SDPA backend's saved tensors) and the allocator's 512 B block rounding, which
    at these tensor sizes (>= 8 kB each) are within 10% of the peak."""
    s = SPECS["mixtral/16 ep4 eager"]
    fake, real = FM.measure_fake(s), FM.measure_cuda(s)
    assert "caching allocator" in real.how
    assert real.peak == pytest.approx(fake.peak, rel=0.10)
    assert real.at_peak["reserved"] >= real.at_peak["allocated"]


def test_moe_gradient_buffers_within_the_sourced_term():
    """memory_terms.grad_reduction_buffers counts the largest layer's local parameters (the
    non-expert weights + this EP rank's experts) at 6 B (bf16 unsharded gradient + fp32
    reduce-scatter input). With the experts their own FSDP unit the two never hold a whole layer
    at once: the tracker's largest sum stays within it (exact for a dense stack,
    tests/test_fsdp2_memory.py)."""
    from moe_repro.components.resources import memory_terms as MT

    s, got = SPECS["mixtral/16 ep4 eager"], tracked("mixtral/16 ep4 eager")
    dense, expert = FM.parameter_count(s)
    layer = (dense + expert / s.ep) / s.layers
    experts_unit = expert / s.layers / s.ep
    theirs = got.category_peaks["gradient buffers"]
    assert 2 * experts_unit < theirs <= MT.grad_reduction_buffers("fsdp2", layer, 0, 2, 4)


@pytest.mark.parametrize("name", ["mixtral/16 ep4 eager", "qwen3/8 ep8 eager"])
def test_moe_forward_transient_is_the_dispatch_and_combine_buffers(name):
    """Beyond what an MoE block leaves behind, its forward (eager SwiGLU, balanced routing) holds
    at once: the send buffer (T k rows, this rank's copies in expert order) and the all-to-all's
    receive buffer (T k rows), both alive until the block returns; the expert output in
    source-major order and the return all-to-all's output (T k rows each); and one int64 per copy
    (the inverse permutation before the combine's gather keeps it). Which buffers coexist at
    the block's peak is the implementation's (with the fused SwiGLU, silu(w1 x) is a temporary
    of the experts and the peak moves there); memory_terms.moe_dispatch_transient counts one
    T k row copy (Megatron-core's alltoall dispatcher), so the two are not compared."""
    s, got = SPECS[name], tracked(name)
    row = s.d_model * 2
    expected = (2 + 2 * s.load) * s.copies * row + 8 * s.copies
    assert got.extra["MoE forward transient"] == expected
