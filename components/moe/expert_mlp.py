"""Expert MLPs over a padding-free token buffer, on any registered grouped-GEMM kernel.

Rows of the buffer are grouped by expert (the PFT order, components/moe/pft.py). Each projection
is one grouped GEMM (``y[rows of e] = x[rows of e] @ w[e]``); which kernel computes it is a name
in the registry of components/moe/grouped_gemm.py, chosen per layer (``gemm=``) or per call;
``auto`` (the default) resolves per call to the fastest correct kernel for the device, dtype and
shape (components/moe/kernel_choice.py), and ``last_choice`` says which it ran.
``grouped_gemm`` and the registry's lookups are re-exported here for existing callers.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from moe_repro.components.moe.grouped_gemm import (  # noqa: F401  (re-exported)
    check_gemm_name,
    get_grouped_gemm,
    grouped_gemm,
    grouped_gemm_names,
)
from moe_repro.components.moe.kernel_choice import Choice, resolve

ACTIVATIONS = ("swiglu", "gelu", "relu")


class ExpertMLP(nn.Module):
    """E experts' FFNs: SwiGLU (gate, up, down: 3 matrices) or two-matrix (act(x W1) W2).

    Weights are stored stacked per expert: ``w_in`` [E, H, F] (and ``w_gate`` [E, H, F] for
    SwiGLU), ``w_out`` [E, F, H]. ``forward`` takes a buffer grouped by expert (padding-free);
    ``forward_padded`` takes the capacity-padded [E, C, H] buffer of components/moe/padded_moe.py.
    """

    def __init__(
        self,
        num_experts: int,
        d_model: int,
        d_ffn: int,
        activation: str = "swiglu",
        gemm: str = "auto",
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        check_gemm_name(gemm)  # ValueError naming the known kernels
        if min(num_experts, d_model, d_ffn) < 0 or min(d_model, d_ffn) == 0:
            raise ValueError("num_experts must be >= 0 and d_model, d_ffn positive")
        self.num_experts, self.d_model, self.d_ffn = num_experts, d_model, d_ffn
        self.activation, self.gemm = activation, gemm
        self.last_choice: Choice | None = None  # the kernel the last forward ran, and why

        def draw(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, dtype=dtype, device=device)

        self.w_in = nn.Parameter(draw(num_experts, d_model, d_ffn) * d_model**-0.5)
        self.w_gate = (
            nn.Parameter(draw(num_experts, d_model, d_ffn) * d_model**-0.5)
            if activation == "swiglu"
            else None
        )
        self.w_out = nn.Parameter(draw(num_experts, d_ffn, d_model) * d_ffn**-0.5)

    @property
    def n_mat(self) -> int:
        return 3 if self.activation == "swiglu" else 2

    def hidden_activation(self, up: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """The activation between the two GEMMs (SwiGLU gates ``up`` with ``gate``)."""
        if self.activation == "swiglu":
            if gate is None:
                raise ValueError("a SwiGLU expert needs its gate projection")
            return F.silu(gate) * up
        return F.gelu(up) if self.activation == "gelu" else F.relu(up)

    def forward(
        self, x: torch.Tensor, tokens_per_expert: torch.Tensor, gemm: str | None = None
    ) -> torch.Tensor:
        """x [N, H] grouped by expert, tokens_per_expert [E] -> [N, H]."""
        weights = self.w_in
        choice = resolve(gemm or self.gemm, x, weights, tokens_per_expert, grouped_gemm_names())
        self.last_choice, variant = choice, choice.kernel
        up = grouped_gemm(x, self.w_in, tokens_per_expert, variant)
        gate = (
            grouped_gemm(x, self.w_gate, tokens_per_expert, variant)
            if self.w_gate is not None
            else None
        )
        return grouped_gemm(
            self.hidden_activation(up, gate), self.w_out, tokens_per_expert, variant
        )

    def forward_padded(self, x: torch.Tensor) -> torch.Tensor:
        """x [E, C, H] (zero rows where an expert has fewer than C tokens) -> [E, C, H]."""
        up = torch.bmm(x, self.w_in)
        gate = torch.bmm(x, self.w_gate) if self.w_gate is not None else None
        return torch.bmm(self.hidden_activation(up, gate), self.w_out)

    def flops(self, rows: int) -> int:
        """Forward FLOPs for ``rows`` token rows: 2 * rows * H * F per matrix."""
        return 2 * rows * self.d_model * self.d_ffn * self.n_mat
