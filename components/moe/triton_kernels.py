"""Triton kernels for the expert compute and the padding-free permute (X-MoE Sec. 4.1, App. B.4).

X-MoE's speedups come from fused kernels over the padding-free buffer: one grouped GEMM over the
expert segments instead of a padded batch, and a gather / weighted scatter that moves each
retained row once. These are the same operations as the PyTorch implementations they are
registered beside (components/moe/grouped_gemm.py ``triton``; components/moe/pft.py's
``gather_tokens`` / ``scatter_combine`` with ``impl="triton"``), with their backward passes.

Import this module only through those registries: it imports Triton, and Triton decides at
kernel definition whether to compile (CUDA) or interpret (``TRITON_INTERPRET=1``, CPU); see
components/moe/triton_support.py.

Kernels
- grouped GEMM ``y[rows of g] = x[rows of g] @ w[g]``: a host-built tile list names, for each
  BLOCK_M rows of one group, its group and first row; a program computes one [BLOCK_M, BLOCK_N]
  tile over K in BLOCK_K steps, fp32 accumulation, rows past the group's end masked off (so
  uneven and empty groups need no padding). Backward: dx is the same kernel on w transposed;
  dw[g] = x_g^T dy_g reduces over the group's rows (an empty group gives a zero dw[g]).
- gather ``out[i] = src[idx[i]] * scale[i]`` (scale optional), optionally with the row dot
  ``dot[i] = <src[idx[i]], other[i]>``: the permute's forward, and the combine's backward
  (dy = g[token] * w, dw = <g[token], y>).
- segment sum ``out[t] = sum over the rows j of token t of src[j] * scale[j]``, over a CSR
  (rows sorted by token, offsets per token): the combine's forward and the permute's backward.
  A token's rows are summed by one program in a fixed order: no atomics, deterministic.

fp32 ``tl.dot`` uses ``input_precision="ieee"`` (TF32 would not match PyTorch's fp32 GEMM); all
sums accumulate in fp32 and round once to the output dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moe_repro.components.moe.triton_support import require_triton

BLOCK_M, BLOCK_N, BLOCK_K = 32, 32, 32
BLOCK_H = 64


# --- grouped GEMM -------------------------------------------------------------------------------


@triton.jit
def _grouped_gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    tile_group_ptr,
    tile_row_ptr,
    group_end_ptr,
    K,
    N_OUT,
    stride_xm,
    stride_xk,
    stride_wg,
    stride_wk,
    stride_wn,
    stride_ym,
    stride_yn,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    g = tl.load(tile_group_ptr + tile)
    row0 = tl.load(tile_row_ptr + tile)
    row_end = tl.load(group_end_ptr + g)
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(
            x_ptr + rows[:, None] * stride_xm + ks[None, :] * stride_xk,
            mask=(rows[:, None] < row_end) & (ks[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            w_ptr + g * stride_wg + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
            mask=(ks[:, None] < K) & (cols[None, :] < N_OUT),
            other=0.0,
        )
        if IEEE:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
    tl.store(
        y_ptr + rows[:, None] * stride_ym + cols[None, :] * stride_yn,
        acc.to(y_ptr.dtype.element_ty),
        mask=(rows[:, None] < row_end) & (cols[None, :] < N_OUT),
    )


@triton.jit
def _grouped_weight_grad_kernel(
    x_ptr,
    dy_ptr,
    dw_ptr,
    group_start_ptr,
    group_end_ptr,
    K,
    N_OUT,
    stride_xm,
    stride_xk,
    stride_dym,
    stride_dyn,
    stride_dwg,
    stride_dwk,
    stride_dwn,
    IEEE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    g = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_n = tl.program_id(2)
    start = tl.load(group_start_ptr + g)
    end = tl.load(group_end_ptr + g)
    ks = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for r0 in range(start, end, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        xt = tl.load(
            x_ptr + rows[None, :] * stride_xm + ks[:, None] * stride_xk,
            mask=(rows[None, :] < end) & (ks[:, None] < K),
            other=0.0,
        )
        dy = tl.load(
            dy_ptr + rows[:, None] * stride_dym + cols[None, :] * stride_dyn,
            mask=(rows[:, None] < end) & (cols[None, :] < N_OUT),
            other=0.0,
        )
        if IEEE:
            acc += tl.dot(xt, dy, input_precision="ieee")
        else:
            acc += tl.dot(xt, dy)
    tl.store(
        dw_ptr + g * stride_dwg + ks[:, None] * stride_dwk + cols[None, :] * stride_dwn,
        acc.to(dw_ptr.dtype.element_ty),
        mask=(ks[:, None] < K) & (cols[None, :] < N_OUT),
    )


def _tiles(
    counts: torch.Tensor, device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tile_group, tile_row, group_start, group_end) for BLOCK_M-row tiles of every group."""
    counts = counts.to("cpu", torch.int64)
    ends = torch.cumsum(counts, 0)
    starts = ends - counts
    tiles_per_group = (counts + BLOCK_M - 1) // BLOCK_M
    tile_group = torch.repeat_interleave(torch.arange(counts.numel()), tiles_per_group)
    first_tile = torch.cumsum(tiles_per_group, 0) - tiles_per_group
    tile_row = (
        starts[tile_group] + (torch.arange(tile_group.numel()) - first_tile[tile_group]) * BLOCK_M
    )
    group, row, start, end = (
        t.to(device=device, dtype=torch.int32) for t in (tile_group, tile_row, starts, ends)
    )
    return group, row, start, end


def _gemm(
    x: torch.Tensor, w: torch.Tensor, w_strides: tuple[int, int, int], n_out: int, tiles
) -> torch.Tensor:
    """y = x_g @ W_g with W_g read through ``w_strides`` (group, k, n): W or W transposed."""
    tile_group, tile_row, _, ends = tiles
    y = x.new_empty((x.shape[0], n_out))
    if tile_group.numel() and n_out:
        grid = (tile_group.numel(), triton.cdiv(n_out, BLOCK_N))
        _grouped_gemm_kernel[grid](
            x,
            w,
            y,
            tile_group,
            tile_row,
            ends,
            x.shape[1],
            n_out,
            x.stride(0),
            x.stride(1),
            *w_strides,
            y.stride(0),
            y.stride(1),
            IEEE=x.dtype == torch.float32,
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K,
        )
    return y


class _GroupedGemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, counts):
        tiles = _tiles(counts, x.device)
        ctx.save_for_backward(x, w)
        ctx.tiles = tiles
        return _gemm(x, w, (w.stride(0), w.stride(1), w.stride(2)), w.shape[2], tiles)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        tiles = ctx.tiles
        dy = dy.contiguous()
        dx = dw = None
        if ctx.needs_input_grad[0]:  # dx_g = dy_g @ w_g^T: the forward kernel on w transposed
            dx = _gemm(dy, w, (w.stride(0), w.stride(2), w.stride(1)), w.shape[1], tiles)
        if ctx.needs_input_grad[1]:
            _, _, starts, ends = tiles
            dw = torch.empty_like(w)
            groups, k, n = w.shape
            if groups and k and n:
                grid = (groups, triton.cdiv(k, BLOCK_K), triton.cdiv(n, BLOCK_N))
                _grouped_weight_grad_kernel[grid](
                    x,
                    dy,
                    dw,
                    starts,
                    ends,
                    k,
                    n,
                    x.stride(0),
                    x.stride(1),
                    dy.stride(0),
                    dy.stride(1),
                    dw.stride(0),
                    dw.stride(1),
                    dw.stride(2),
                    IEEE=x.dtype == torch.float32,
                    BLOCK_R=BLOCK_M,
                    BLOCK_K=BLOCK_K,
                    BLOCK_N=BLOCK_N,
                )
        return dx, dw, None


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The ``triton`` grouped-GEMM kernel (checked operands: see grouped_gemm.py)."""
    require_triton(x, w)
    if x.dtype != w.dtype:
        raise ValueError(f"triton grouped GEMM needs one dtype, got {x.dtype} and {w.dtype}")
    return _GroupedGemm.apply(x.contiguous(), w.contiguous(), counts)


# --- gather / segment sum (the padding-free permute and combine) -----------------------------


@triton.jit
def _gather_kernel(
    src_ptr,
    idx_ptr,
    scale_ptr,
    other_ptr,
    out_ptr,
    dot_ptr,
    H,
    stride_src,
    stride_other,
    stride_out,
    HAS_SCALE: tl.constexpr,
    HAS_DOT: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    i = tl.program_id(0)
    row = tl.load(idx_ptr + i)
    scale = 1.0
    if HAS_SCALE:
        scale = tl.load(scale_ptr + i).to(tl.float32)
    dot = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        v = tl.load(src_ptr + row * stride_src + hs, mask=hs < H, other=0.0).to(tl.float32)
        tl.store(
            out_ptr + i * stride_out + hs, (v * scale).to(out_ptr.dtype.element_ty), mask=hs < H
        )
        if HAS_DOT:
            o = tl.load(other_ptr + i * stride_other + hs, mask=hs < H, other=0.0).to(tl.float32)
            dot += v * o
    if HAS_DOT:
        tl.store(dot_ptr + i, tl.sum(dot, axis=0).to(dot_ptr.dtype.element_ty))


@triton.jit
def _segment_sum_kernel(
    src_ptr,
    rows_ptr,
    offsets_ptr,
    scale_ptr,
    out_ptr,
    H,
    stride_src,
    stride_out,
    HAS_SCALE: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0)
    pid_h = tl.program_id(1)
    start = tl.load(offsets_ptr + t)
    end = tl.load(offsets_ptr + t + 1)
    hs = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in range(start, end):
        row = tl.load(rows_ptr + j)
        v = tl.load(src_ptr + row * stride_src + hs, mask=hs < H, other=0.0).to(tl.float32)
        if HAS_SCALE:
            v = v * tl.load(scale_ptr + row).to(tl.float32)
        acc += v
    tl.store(out_ptr + t * stride_out + hs, acc.to(out_ptr.dtype.element_ty), mask=hs < H)


def _by_token(token_ids: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR of the rows per token: rows sorted by token (stable) and num_tokens + 1 offsets."""
    rows = torch.argsort(token_ids, stable=True).to(torch.int32)
    counts = torch.bincount(token_ids, minlength=num_tokens)
    offsets = torch.zeros(num_tokens + 1, dtype=torch.int64, device=token_ids.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return rows, offsets.to(torch.int32)


def _gather(src, idx, scale=None, other=None, out_dtype=None, dot_dtype=None):
    n, h = idx.numel(), src.shape[1]
    out = torch.empty((n, h), dtype=out_dtype or src.dtype, device=src.device)
    dot = (
        torch.empty(n, dtype=dot_dtype or torch.float32, device=src.device)
        if other is not None
        else None
    )
    if n and h:
        _gather_kernel[(n,)](
            src,
            idx.to(torch.int32),
            scale if scale is not None else src,
            other if other is not None else src,
            out,
            dot if dot is not None else out,
            h,
            src.stride(0),
            other.stride(0) if other is not None else 0,
            out.stride(0),
            HAS_SCALE=scale is not None,
            HAS_DOT=other is not None,
            BLOCK_H=BLOCK_H,
        )
    elif dot is not None:
        dot.zero_()
    return out, dot


def _segment_sum(src, rows, offsets, num_tokens, scale=None, out_dtype=None):
    h = src.shape[1]
    out = torch.empty((num_tokens, h), dtype=out_dtype or src.dtype, device=src.device)
    if num_tokens and h:
        grid = (num_tokens, triton.cdiv(h, BLOCK_H))
        _segment_sum_kernel[grid](
            src,
            rows,
            offsets,
            scale if scale is not None else src,
            out,
            h,
            src.stride(0),
            out.stride(0),
            HAS_SCALE=scale is not None,
            BLOCK_H=BLOCK_H,
        )
    return out


class _Gather(torch.autograd.Function):
    """out[i] = x[token_ids[i]]; backward: dx[t] = sum of the rows of token t."""

    @staticmethod
    def forward(ctx, x, token_ids, num_tokens):
        ctx.save_for_backward(token_ids)
        ctx.num_tokens = num_tokens
        return _gather(x, token_ids)[0]

    @staticmethod
    def backward(ctx, grad):
        (token_ids,) = ctx.saved_tensors
        rows, offsets = _by_token(token_ids, ctx.num_tokens)
        return _segment_sum(grad.contiguous(), rows, offsets, ctx.num_tokens), None, None


class _Combine(torch.autograd.Function):
    """out[t] = sum_i y[i] w[i] over the rows of token t (fp32 sums, rounded once);
    backward: dy[i] = g[token_ids[i]] w[i], dw[i] = <g[token_ids[i]], y[i]>."""

    @staticmethod
    def forward(ctx, y, weights, token_ids, num_tokens):
        rows, offsets = _by_token(token_ids, num_tokens)
        ctx.save_for_backward(y, weights, token_ids)
        return _segment_sum(y, rows, offsets, num_tokens, scale=weights)

    @staticmethod
    def backward(ctx, grad):
        y, weights, token_ids = ctx.saved_tensors
        dy, dw = _gather(
            grad.contiguous(),
            token_ids,
            scale=weights,
            other=y,
            out_dtype=y.dtype,
            dot_dtype=weights.dtype,
        )
        return dy, dw, None, None


def gather_rows(x: torch.Tensor, token_ids: torch.Tensor, num_tokens: int) -> torch.Tensor:
    require_triton(x)
    return _Gather.apply(x.contiguous(), token_ids, num_tokens)


def combine_rows(
    y: torch.Tensor, weights: torch.Tensor, token_ids: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    require_triton(y)
    return _Combine.apply(y.contiguous(), weights.contiguous(), token_ids, num_tokens)
