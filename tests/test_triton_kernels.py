"""The Triton kernels (components/moe/triton_kernels.py) against the PyTorch implementations
they are registered beside, forward and backward, on fresh random inputs with uneven and empty
groups. Without a GPU they run in Triton's interpreter mode (fp32 and fp16 only).

Skipped when triton is not installed, except where MOE_REPRO_REQUIRE_TRITON=1 (CI installs the
triton extra): there a missing triton fails."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from moe_repro.components.moe import triton_support
from moe_repro.components.moe.grouped_gemm import grouped_gemm, grouped_gemm_names
from moe_repro.components.moe.pft import build_pft, gather_tokens, scatter_combine

HAS_GPU = torch.cuda.is_available()
# Without a GPU the kernels run in interpreter mode, in a child pytest started with
# TRITON_INTERPRET=1 (test_kernels_in_interpreter_mode): Triton fixes its library functions as
# compiled or interpreted when it is first imported, and in this process another test may have
# imported it already (Megatron-core's import does). The child runs this file's tests directly.
DIRECT = HAS_GPU or triton_support.interpreting()
NOT_INSTALLED = importlib.util.find_spec("triton") is None
if NOT_INSTALLED and os.environ.get("MOE_REPRO_REQUIRE_TRITON"):
    raise RuntimeError("MOE_REPRO_REQUIRE_TRITON is set but triton is not installed")
MISSING = triton_support.triton_unavailable() if DIRECT else "runs in the interpreter-mode child"
needs_triton = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


@pytest.mark.skipif(
    DIRECT or NOT_INSTALLED, reason="triton runs in this process, or is not installed"
)
def test_kernels_in_interpreter_mode():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            __file__,
            "-k",
            "not test_kernels_in_interpreter_mode",
        ],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "passed" in summary and "skipped" not in summary and "failed" not in summary, summary


DEVICE = torch.device("cuda" if HAS_GPU else "cpu")
DTYPES = [torch.float32, torch.float16]
# group sizes: uneven, empty groups first, in the middle and last, one longer than two tiles
COUNTS = [[0, 5, 0, 37, 1, 70, 0], [3], [0, 0], [64, 31, 33]]


def tol(dtype):
    # fp16 results are rounded once from fp32 sums on both sides; sums in another order differ
    # by a few units of the last place of the larger operand
    return dict(rtol=2e-3, atol=2e-3) if dtype == torch.float16 else dict(rtol=1e-5, atol=1e-5)


def fresh(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device=DEVICE, dtype=dtype)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("counts", COUNTS, ids=str)
def test_triton_grouped_gemm_matches_pytorch_forward_and_backward(dtype, counts):
    seed = int.from_bytes(os.urandom(4), "little")
    k, m = 24, 40  # not multiples of the 32-wide tiles: the masks are exercised
    x = fresh((sum(counts), k), dtype, seed).requires_grad_()
    w = (fresh((len(counts), k, m), dtype, seed + 1) * k**-0.5).requires_grad_()
    dy = fresh((sum(counts), m), dtype, seed + 2)
    outs = {}
    for kernel in ("sequential", "triton"):
        y = grouped_gemm(x, w, torch.tensor(counts), kernel)
        dx, dw = (
            torch.autograd.grad(y, (x, w), dy)
            if y.numel()
            else (torch.zeros_like(x), torch.zeros_like(w))
        )
        outs[kernel] = (y.detach(), dx, dw)
    ref = torch.float64
    y64 = grouped_gemm(x.detach().to(ref), w.detach().to(ref), torch.tensor(counts), "sequential")
    for name, got, want in zip(("y", "dx", "dw"), outs["triton"], outs["sequential"]):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        torch.testing.assert_close(got, want, **tol(dtype), msg=f"{name} (seed {seed})")
    torch.testing.assert_close(outs["triton"][0].to(ref), y64, **tol(dtype))
    if 0 in counts:  # an empty group's weights get a zero gradient
        empty = [g for g, c in enumerate(counts) if c == 0]
        assert not outs["triton"][2][empty].any()


@needs_triton
def test_triton_grouped_gemm_of_zero_rows():
    x = torch.zeros(0, 16, device=DEVICE, requires_grad=True)
    w = fresh((3, 16, 8), torch.float32, 1).requires_grad_()
    y = grouped_gemm(x, w, torch.tensor([0, 0, 0]), "triton")
    assert y.shape == (0, 8)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("capacity", [None, 3])
def test_triton_gather_and_combine_match_pytorch_forward_and_backward(dtype, capacity):
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    tokens, experts, top_k, hidden = 29, 6, 2, 72  # hidden spans two 64-wide blocks
    top = torch.argsort(torch.rand(tokens, experts, generator=g), dim=1)[:, :top_k].to(DEVICE)
    top[:, 0] = torch.where(top[:, 0] == experts - 1, 0, top[:, 0])  # expert E-1 mostly empty
    weights = torch.rand(tokens, top_k, generator=g).to(DEVICE, dtype)
    x = fresh((tokens, hidden), dtype, seed + 1)
    results = {}
    for impl in ("torch", "triton"):
        xi = x.clone().requires_grad_()
        wi = weights.clone().requires_grad_()
        pft = build_pft(top, wi, experts, capacity)  # capacity 3: some tokens lose every pair
        rows = gather_tokens(xi, pft, impl=impl)
        y = rows * 0.5 + 1.0  # stands in for the experts
        out = scatter_combine(y, pft, impl=impl)
        grad = fresh(out.shape, dtype, seed + 2)
        dx, dw = torch.autograd.grad(out, (xi, wi), grad)
        results[impl] = (rows.detach(), out.detach(), dx, dw)
    for name, got, want in zip(("rows", "out", "dx", "dw"), results["triton"], results["torch"]):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        torch.testing.assert_close(got, want, **tol(dtype), msg=f"{name} (seed {seed})")


@needs_triton
def test_triton_is_offered_where_it_can_run():
    assert "triton" in grouped_gemm_names()


def test_without_triton_the_kernels_are_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(triton_support.importlib.util, "find_spec", lambda name: None)
    assert "triton" not in grouped_gemm_names()
    x, w = torch.zeros(2, 4), torch.zeros(1, 4, 4)
    with pytest.raises(ValueError) as e:
        grouped_gemm(x, w, torch.tensor([2]), "triton")
    assert "not installed" in str(e.value) and "\n" not in str(e.value)
    pft = build_pft(torch.zeros(2, 1, dtype=torch.int64), torch.ones(2, 1), 1)
    with pytest.raises(ValueError, match="triton is not installed"):
        gather_tokens(x, pft, impl="triton")


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_on_a_cpu_without_interpreter_mode_triton_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    why = triton_support.triton_unavailable()
    assert why is not None and ("TRITON_INTERPRET=1" in why or "not installed" in why)
