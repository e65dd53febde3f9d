"""Measured activation memory of one MoE layer's forward, to set beside X-MoE Table 2.

Two measurements of one forward pass (X-MoE Table 4 and Fig. 3 compare them with the theory):

- saved bytes: what autograd keeps for backward at the end of the forward
  (components.training.pp_ep_trainer.SavedActivationMeter: distinct storages, parameters excluded). This
  is the activation memory Table 2 models. We split off the layer *input* x, which the gate's
  linear saves: Table 2 charges it to the layer that produced it (the attention block's output),
  so ``saved_bytes_beyond_input`` is the number to compare with the theory and ``saved_bytes``
  the whole of it.
- peak bytes: the forward's peak resident-memory rise above the state before it
  (components.training.peak_memory: kernel high-water mark, exact to a page per buffer). It includes the
  saved tensors, the layer's output [S, H] and every transient buffer alive at the worst moment
  (e.g. the padded layer's [S, E, C] masks). On CUDA: torch.cuda.max_memory_allocated.

Theory at the same config (X-MoE Table 2, capacity factor 1, no padding):
A_dispatch + A_combine + A_interm0 + A_interm1 = 2 k S H + 2 k S H_FFN elements
(components.resources.memory_model.xmoe_activation_elements), times the element size of the run's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_repro.runtime.timing import peak_memory_bytes, reset_peak_memory
from moe_repro.components.provenance import produced
from moe_repro.components.resources.memory_model import xmoe_activation_elements
from moe_repro.components.moe.moe_layer import MoELayer
from moe_repro.components.moe.padded_moe import PaddedMoELayer
from moe_repro.components.training.pp_ep_trainer import SavedActivationMeter

IMPLS = ("pft", "padded")


@dataclass
class ActivationMeasurement:
    impl: str
    tokens: int
    saved_bytes: int  # everything autograd holds for backward after the forward
    input_saved_bytes: int  # of which the layer input x (charged to the previous layer)
    peak_bytes: float  # forward's peak memory rise (nan where it cannot be measured)
    output_bytes: int  # the layer output [S, H], alive at the end of the forward
    theory_bytes: int  # X-MoE Table 2 at this config, this dtype
    max_abs_grad: float  # sanity: backward ran and produced finite input gradients
    shape: tuple[int, int, int, int] = (0, 0, 0, 0)  # (d_model, d_ffn, top_k, itemsize): the config

    @property
    def saved_bytes_beyond_input(self) -> int:
        return self.saved_bytes - self.input_saved_bytes


def theory_bytes(tokens: int, d_model: int, d_ffn: int, top_k: int, itemsize: int) -> int:
    """X-MoE Table 2 for b s = ``tokens``: (2 k S H + 2 k S H_FFN) elements x itemsize."""
    return itemsize * sum(xmoe_activation_elements(1, tokens, d_model, d_ffn, top_k).values())


def build_layer(
    impl: str,
    d_model: int,
    d_ffn: int,
    num_experts: int,
    top_k: int,
    capacity_factor: float = 1.25,
    gemm: str = "grouped_mm",
    dtype: torch.dtype = torch.float32,
) -> MoELayer:
    """Two-matrix (GELU) experts as X-MoE Table 1; pft drops nothing, padded uses ``capacity_factor``."""
    if impl == "pft":
        return MoELayer(
            d_model, d_ffn, num_experts, top_k, activation="gelu", gemm=gemm, dtype=dtype
        )
    if impl == "padded":
        return PaddedMoELayer(
            d_model,
            d_ffn,
            num_experts,
            top_k,
            activation="gelu",
            capacity_factor=capacity_factor,
            dtype=dtype,
        )
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def _release_heap() -> None:
    """Pin glibc's mmap threshold (components.training.peak_memory) and hand free heap memory back
    (malloc_trim), so buffers freed earlier in this process cannot be reused unseen by RSS."""
    import ctypes

    from moe_repro.components.training.peak_memory import return_freed_memory_to_os

    return_freed_memory_to_os()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _forward_peak(layer: MoELayer, x: torch.Tensor, meter: SavedActivationMeter):
    """Run the forward under the meter; return (output, peak bytes of the forward)."""
    if x.device.type == "cuda":  # the allocator's high-water mark (runtime/timing.py)
        before = reset_peak_memory(x.device)
        with meter.hooks():
            y = layer(x)
        peak = peak_memory_bytes(x.device)
        assert peak is not None and before is not None  # CUDA devices report both
        return y, float(peak - before)
    from moe_repro.components.training.peak_memory import measure_peak_rss, peak_supported

    if not peak_supported():
        with meter.hooks():
            return layer(x), float("nan")
    _release_heap()
    with measure_peak_rss() as m:
        with meter.hooks():
            y = layer(x)
    return y, float(m.peak_bytes)


def measure_activation_memory(layer: MoELayer, x: torch.Tensor, impl: str) -> ActivationMeasurement:
    """Saved and peak activation bytes of one forward of ``layer`` on x [S, H] (see module doc).

    One warm-up forward+backward first, so thread pools and lazily built kernels are not
    counted; then the measured forward, then its backward (so the graph is really used)."""
    x = x.detach().requires_grad_(True)
    if x.device.type == "cpu":
        _release_heap()  # before the warm-up, so its buffers are mmaps that go back on free
    layer(x).sum().backward()  # warm-up
    layer.zero_grad(set_to_none=True)
    x.grad = None
    meter = SavedActivationMeter(list(layer.parameters()))
    y, peak = _forward_peak(layer, x, meter)
    saved = meter.live
    entry = meter.refs.get(x.untyped_storage().data_ptr())
    input_saved = entry[0] if entry is not None else 0
    y.sum().backward()
    grad = float(x.grad.abs().max()) if x.grad is not None and x.numel() else 0.0
    return ActivationMeasurement(
        impl=impl,
        tokens=x.shape[0],
        saved_bytes=int(saved),
        input_saved_bytes=int(input_saved),
        peak_bytes=peak,
        max_abs_grad=grad,
        output_bytes=int(y.untyped_storage().nbytes()),
        theory_bytes=theory_bytes(
            x.shape[0], layer.d_model, layer.d_ffn, layer.top_k, x.element_size()
        ),
        shape=(layer.d_model, layer.d_ffn, layer.top_k, x.element_size()),
    )


def measure_config(
    tokens: int,
    d_model: int,
    d_ffn: int,
    num_experts: int,
    top_k: int,
    impls=IMPLS,
    capacity_factor: float = 1.25,
    seed: int = 0,
) -> dict[str, ActivationMeasurement]:
    """Build each impl's layer (fp32, CPU, same weights) at one config and measure it."""
    produced("measured")
    out = {}
    for impl in impls:
        torch.manual_seed(seed)
        layer = build_layer(impl, d_model, d_ffn, num_experts, top_k, capacity_factor)
        x = torch.randn(tokens, d_model, generator=torch.Generator().manual_seed(seed + 1))
        out[impl] = measure_activation_memory(layer, x, impl)
        del layer
    return out
