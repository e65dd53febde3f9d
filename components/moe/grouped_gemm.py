"""Grouped-GEMM kernels: one registry of interchangeable ways to multiply each row group of a
padding-free buffer by its own weight matrix.

Rows of the buffer are grouped by expert (the PFT order, components/moe/pft.py): group g owns
rows ``offsets[g-1]:offsets[g]`` with ``offsets = cumsum(tokens_per_group)``. A grouped GEMM
computes ``y[rows of g] = x[rows of g] @ w[g]`` for x [N, K] and w [G, K, M].

Kernels (all differentiable, all exact up to fp summation order; ``auto`` picks one per device,
dtype and shape, components/moe/kernel_choice.py): ``sequential`` (one GEMM per
group, X-MoE App. B.4 "sequential GeMM"), ``padded_bmm`` (a zero-padded batch and one bmm: what
a capacity-padded pipeline computes), ``grouped_mm`` (``torch._grouped_mm``, one kernel) and
``triton`` (components/moe/triton_kernels.py; offered only where Triton can run, see
components/moe/triton_support.py). FLOPs of one grouped GEMM: 2 * N * K * M; the padded kernel
performs 2 * G * max_rows * K * M for the same useful work.

:func:`grouped_gemm` checks the shapes once and looks the kernel up by name; the expert MLPs
(components/moe/expert_mlp.py), the expert-gemm suite and the benchmarks list the kernels from
:func:`grouped_gemm_names`.

Adding a kernel: write ``_my_kernel(x, w, counts) -> y`` here (checked operands in, must be
differentiable) and register it once below the others with ``register_grouped_gemm``;
tests/test_balance_registry.py then checks it against a loop reference on uneven groups.

Why: X-MoE's padding-free pipeline needs the expert GEMM without padding, and the kernels that
compute it are compared on the same contract. Each kernel's contract and limits: see
docs/moe-kernels.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.nn import functional as F

from moe_repro.components.moe.triton_support import triton_unavailable


@dataclass(frozen=True)
class GroupedGemmKernel:
    """One grouped-GEMM implementation: ``compute(x [N, K], w [G, K, M], counts [G]) -> [N, M]``."""

    name: str
    description: str
    compute: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    # () -> why the kernel cannot run in this process (None: it can); such a kernel stays
    # registered but is left out of grouped_gemm_names() and refused by name in one line
    unavailable: Callable[[], str | None] = lambda: None


GROUPED_GEMM_KERNELS: dict[str, GroupedGemmKernel] = {}


def register_grouped_gemm(kernel: GroupedGemmKernel) -> GroupedGemmKernel:
    """Add a kernel to the registry under its name (once)."""
    if kernel.name in GROUPED_GEMM_KERNELS:
        raise ValueError(f"grouped GEMM kernel {kernel.name!r} is already registered")
    GROUPED_GEMM_KERNELS[kernel.name] = kernel
    return kernel


def grouped_gemm_names() -> tuple[str, ...]:
    """Names of the registered kernels that can run here, in registration order."""
    return tuple(name for name, k in GROUPED_GEMM_KERNELS.items() if k.unavailable() is None)


def gemm_choices() -> tuple[str, ...]:
    """What a ``gemm=`` parameter accepts: ``auto`` (components/moe/kernel_choice.py: the
    fastest correct kernel for the device, dtype and shape), then every runnable kernel."""
    return ("auto", *grouped_gemm_names())


def check_gemm_name(name: str) -> None:
    """ValueError naming the known kernels unless ``name`` is ``auto`` or a runnable kernel."""
    if name != "auto":
        get_grouped_gemm(name)


def get_grouped_gemm(name: str) -> GroupedGemmKernel:
    if name not in GROUPED_GEMM_KERNELS:
        raise ValueError(
            f"unknown grouped GEMM kernel {name!r}; known: {', '.join(GROUPED_GEMM_KERNELS)}"
        )
    kernel = GROUPED_GEMM_KERNELS[name]
    why = kernel.unavailable()
    if why:
        raise ValueError(f"grouped GEMM kernel {name} cannot run here: {why}")
    return kernel


def grouped_gemm(
    x: torch.Tensor, w: torch.Tensor, tokens_per_group: torch.Tensor, variant: str = "auto"
) -> torch.Tensor:
    """y[rows of g] = x[rows of g] @ w[g] for x [N, K], w [G, K, M] -> [N, M], with the
    registered kernel named ``variant`` (``auto``: components/moe/kernel_choice.py)."""
    if variant == "auto":
        from moe_repro.components.moe.kernel_choice import resolve

        variant = resolve(
            variant, x, w, torch.as_tensor(tokens_per_group), grouped_gemm_names()
        ).kernel
    kernel = get_grouped_gemm(variant)
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[1]:
        raise ValueError(
            f"need x [N, K] and w [G, K, M], got {tuple(x.shape)} and {tuple(w.shape)}"
        )
    counts = torch.as_tensor(tokens_per_group, dtype=torch.int64)
    if counts.numel() != w.shape[0]:
        raise ValueError(f"{counts.numel()} group sizes for {w.shape[0]} weight matrices")
    if int(counts.sum()) != x.shape[0] or bool((counts < 0).any()):
        raise ValueError(f"group sizes {counts.tolist()} do not partition {x.shape[0]} rows")
    return kernel.compute(x, w, counts)


# --- the kernels --------------------------------------------------------------------------------


def _sequential(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    chunks = torch.split(x, counts.tolist(), dim=0)
    # unbind, not w[g]: the backward of G selects is G zero-filled [G, K, M] gradients summed
    # (quadratic in G); unbind's is one stack
    return torch.cat([chunk @ w_g for w_g, chunk in zip(w.unbind(0), chunks)], dim=0)


def _padded_bmm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    groups, rows = w.shape[0], x.shape[0]
    max_rows = int(counts.max()) if groups else 0
    group_of_row = torch.repeat_interleave(
        torch.arange(groups, device=x.device), counts.to(x.device)
    )
    group_start = torch.cumsum(counts, 0).to(x.device) - counts.to(x.device)
    slot_of_row = group_of_row * max_rows + (
        torch.arange(rows, device=x.device) - group_start[group_of_row]
    )
    padded = x.new_zeros(groups * max_rows, x.shape[1]).index_copy(0, slot_of_row, x)
    out = torch.bmm(padded.view(groups, max_rows, x.shape[1]), w)
    return out.reshape(groups * max_rows, w.shape[2]).index_select(0, slot_of_row)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous (for _grouped_mm)."""

    @staticmethod
    def forward(ctx, y):
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def _pad_to(t: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    short = (-t.shape[dim]) % multiple
    if not short:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [0, short]
    return F.pad(t, pad)


def _grouped_mm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    if x.shape[0] == 0:  # _grouped_mm's backward fails on zero rows; the result is empty anyway
        return _sequential(x, w, counts)
    out_cols = w.shape[2]
    align = max(1, 16 // x.element_size())  # 16-byte row strides
    x_p = _pad_to(x, 1, align).contiguous()
    w_p = _pad_to(_pad_to(w, 1, align), 2, align).contiguous()
    offsets = torch.cumsum(counts, 0).to(device=x.device, dtype=torch.int32)
    y = torch._grouped_mm(x_p, w_p, offs=offsets)
    return _ContiguousGrad.apply(y)[:, :out_cols]


register_grouped_gemm(
    GroupedGemmKernel(
        "sequential", "one matmul per group in a Python loop (X-MoE App. B.4)", _sequential
    )
)
register_grouped_gemm(
    GroupedGemmKernel(
        "padded_bmm", "groups zero-padded to the largest, one batched matmul", _padded_bmm
    )
)
register_grouped_gemm(
    GroupedGemmKernel(
        "grouped_mm", "torch._grouped_mm, one kernel over int32 group offsets", _grouped_mm
    )
)


def _triton(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    from moe_repro.components.moe import triton_kernels  # imports Triton: only when used

    return triton_kernels.grouped_gemm(x, w, counts)


register_grouped_gemm(
    GroupedGemmKernel(
        "triton",
        "Triton kernel over per-group row tiles, fp32 accumulation (X-MoE App. B.4)",
        _triton,
        unavailable=triton_unavailable,
    )
)
