"""Micro benchmarks (pytest-benchmark). Not under tests/, so CI's plain `python -m pytest` skips them."""

import pytest
import torch

from _shapes import EXPERTS, HIDDEN, TOKENS, TOP_K


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread, as the suites' default (threads=1): stable on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def routing():
    """x [S, H] and a top-k routing with uneven loads and two experts that get no token."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(TOKENS, HIDDEN, generator=g)
    logits = torch.randn(TOKENS, EXPERTS, generator=g)
    logits[:, :8] += 1.5  # hot experts
    logits[:, [10, 11]] = -1e9  # cold experts: zero tokens
    weights, experts = torch.topk(torch.softmax(logits, -1), TOP_K, dim=-1)
    return x, experts, weights
