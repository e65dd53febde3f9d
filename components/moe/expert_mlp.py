"""Expert MLPs over a padding-free token buffer, with interchangeable grouped-GEMM kernels.

Rows of the buffer are grouped by expert (the PFT order, components/moe/pft.py): expert g owns rows
``offsets[g-1]:offsets[g]`` with ``offsets = cumsum(tokens_per_expert)``. A grouped GEMM
multiplies each group by its own weight: ``y[rows of g] = x[rows of g] @ w[g]``.

Variants (all differentiable, all exact up to fp summation order)
- ``sequential``: one GEMM per expert in a Python loop (X-MoE App. B.4 "sequential GeMM").
- ``padded_bmm``: scatter groups into a zero-padded [G, max_rows, K] batch, one ``torch.bmm``,
  gather back (what a capacity-padded pipeline computes; wastes G*max_rows - N rows).
- ``grouped_mm``: ``torch._grouped_mm`` (one kernel, CPU and GPU). Its contract: int32 offsets
  holding cumulative row ends; every row stride a multiple of 16 bytes (K and M padded with zero
  columns when they are not); its backward rejects expanded/non-contiguous incoming gradients
  and zero-row inputs, so we hand it a contiguous gradient and route N = 0 through
  ``sequential``.

FLOPs of one grouped GEMM: 2 * N * K * M (N = total rows); bytes read at least
(N*K + G*K*M) * itemsize, written N*M*itemsize. The padded variant performs
2 * G * max_rows * K * M FLOPs for the same useful work.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

GEMM_VARIANTS = ("sequential", "padded_bmm", "grouped_mm")
ACTIVATIONS = ("swiglu", "gelu", "relu")


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, tokens_per_group: torch.Tensor,
                 variant: str = "sequential") -> torch.Tensor:
    """y[rows of g] = x[rows of g] @ w[g] for x [N, K], w [G, K, M] -> [N, M]."""
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[1]:
        raise ValueError(f"need x [N, K] and w [G, K, M], got {tuple(x.shape)} and {tuple(w.shape)}")
    counts = torch.as_tensor(tokens_per_group, dtype=torch.int64)
    if counts.numel() != w.shape[0]:
        raise ValueError(f"{counts.numel()} group sizes for {w.shape[0]} weight matrices")
    if int(counts.sum()) != x.shape[0] or bool((counts < 0).any()):
        raise ValueError(f"group sizes {counts.tolist()} do not partition {x.shape[0]} rows")
    if variant == "sequential":
        return _sequential(x, w, counts)
    if variant == "padded_bmm":
        return _padded_bmm(x, w, counts)
    if variant == "grouped_mm":
        return _grouped_mm(x, w, counts)
    raise ValueError(f"unknown grouped GEMM variant {variant!r}; known: {', '.join(GEMM_VARIANTS)}")


def _sequential(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    chunks = torch.split(x, counts.tolist(), dim=0)
    return torch.cat([chunk @ w[g] for g, chunk in enumerate(chunks)], dim=0)


def _padded_bmm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    groups, rows = w.shape[0], x.shape[0]
    max_rows = int(counts.max()) if groups else 0
    group_of_row = torch.repeat_interleave(torch.arange(groups, device=x.device), counts.to(x.device))
    group_start = torch.cumsum(counts, 0).to(x.device) - counts.to(x.device)
    slot_of_row = group_of_row * max_rows + (torch.arange(rows, device=x.device) - group_start[group_of_row])
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


class ExpertMLP(nn.Module):
    """E experts' FFNs: SwiGLU (gate, up, down: 3 matrices) or two-matrix (act(x W1) W2).

    Weights are stored stacked per expert: ``w_in`` [E, H, F] (and ``w_gate`` [E, H, F] for
    SwiGLU), ``w_out`` [E, F, H]. ``forward`` takes a buffer grouped by expert (padding-free);
    ``forward_padded`` takes the capacity-padded [E, C, H] buffer of components/moe/padded_moe.py.
    """

    def __init__(self, num_experts: int, d_model: int, d_ffn: int, activation: str = "swiglu",
                 gemm: str = "sequential", dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if gemm not in GEMM_VARIANTS:
            raise ValueError(f"gemm must be one of {GEMM_VARIANTS}, got {gemm!r}")
        if min(num_experts, d_model, d_ffn) < 0 or min(d_model, d_ffn) == 0:
            raise ValueError("num_experts must be >= 0 and d_model, d_ffn positive")
        self.num_experts, self.d_model, self.d_ffn = num_experts, d_model, d_ffn
        self.activation, self.gemm = activation, gemm
        kw = {"dtype": dtype, "device": device}
        self.w_in = nn.Parameter(torch.randn(num_experts, d_model, d_ffn, **kw) * d_model ** -0.5)
        self.w_gate = (nn.Parameter(torch.randn(num_experts, d_model, d_ffn, **kw) * d_model ** -0.5)
                       if activation == "swiglu" else None)
        self.w_out = nn.Parameter(torch.randn(num_experts, d_ffn, d_model, **kw) * d_ffn ** -0.5)

    @property
    def n_mat(self) -> int:
        return 3 if self.activation == "swiglu" else 2

    def _hidden(self, up: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        if self.activation == "swiglu":
            return F.silu(gate) * up
        return F.gelu(up) if self.activation == "gelu" else F.relu(up)

    def forward(self, x: torch.Tensor, tokens_per_expert: torch.Tensor,
                gemm: str | None = None) -> torch.Tensor:
        """x [N, H] grouped by expert, tokens_per_expert [E] -> [N, H]."""
        variant = gemm or self.gemm
        up = grouped_gemm(x, self.w_in, tokens_per_expert, variant)
        gate = grouped_gemm(x, self.w_gate, tokens_per_expert, variant) if self.w_gate is not None else None
        return grouped_gemm(self._hidden(up, gate), self.w_out, tokens_per_expert, variant)

    def forward_padded(self, x: torch.Tensor) -> torch.Tensor:
        """x [E, C, H] (zero rows where an expert has fewer than C tokens) -> [E, C, H]."""
        up = torch.bmm(x, self.w_in)
        gate = torch.bmm(x, self.w_gate) if self.w_gate is not None else None
        return torch.bmm(self._hidden(up, gate), self.w_out)

    def flops(self, rows: int) -> int:
        """Forward FLOPs for ``rows`` token rows: 2 * rows * H * F per matrix."""
        return 2 * rows * self.d_model * self.d_ffn * self.n_mat
