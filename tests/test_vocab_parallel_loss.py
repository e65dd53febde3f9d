"""Sharded vocabulary loss (MoP Sec. 3.4) vs the dense projection + cross-entropy, real gloo ranks."""

import pytest
import torch
import torch.nn.functional as F

from moe_repro.components.model.vocab_parallel_loss import shard_bounds
from moe_repro.runtime.launch import run_ranks

pytestmark = pytest.mark.multiprocess


def _dense_reference(seed, tokens, hidden, vocab, ranks):
    """Each rank's loss and grad of x, and the full weight gradient summed over the ranks' batches."""
    from _memsave_targets import vocab_inputs

    per_rank, grad_w_total = {}, torch.zeros(hidden, vocab, dtype=torch.float64)
    for r in ranks:
        w_full, x, targets, grad_out = vocab_inputs(seed, r, tokens, hidden, vocab)
        w = w_full.double().requires_grad_(True)
        x = x.double().requires_grad_(True)
        loss = F.cross_entropy(x @ w, targets, reduction="none")
        loss.backward(grad_out.double())
        per_rank[r] = (loss.detach(), x.grad)
        grad_w_total += w.grad
    return per_rank, grad_w_total


CASES = {
    2: [
        dict(tokens=[7, 12], vocab=53, block_cols=None, seed=0),  # V odd, not divisible by 2
        dict(tokens=[0, 9], vocab=40, block_cols=3, seed=1),  # a rank with no tokens; column blocks
        dict(tokens=[4, 4], vocab=2, block_cols=None, seed=2),
    ],  # one column per rank
    4: [
        dict(tokens=[5, 0, 11, 3], vocab=103, block_cols=None, seed=3),  # shards 26, 26, 26, 25
        dict(tokens=[6, 6, 1, 8], vocab=64, block_cols=5, seed=4),
        dict(tokens=[3, 9, 2, 0], vocab=37, block_cols=None, seed=5),
        dict(tokens=[4, 7, 0, 5], vocab=21, block_cols=None, seed=6, subgroups=2),
    ],  # two P=2 groups
}


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_loss_equals_dense(targets_on_path, world):
    hidden = 16
    cases = [dict(case, hidden=hidden) for case in CASES[world]]
    outs = run_ranks(
        "_memsave_targets:vocab_loss", dict(cases=cases), world_size=world, timeout_s=90
    )
    for i, case in enumerate(cases):
        p = world // case.get("subgroups", 1)
        for first in range(0, world, p):
            group = list(range(first, first + p))
            _check_group(outs, i, case, hidden, group)


def _check_group(outs, i, case, hidden, group):
    """Ranks of one P-rank group against the dense loss of their batches."""
    tokens, vocab = case["tokens"], case["vocab"]
    ref, grad_w_ref = _dense_reference(case["seed"], tokens, hidden, vocab, group)
    covered = []
    for r in group:
        res = outs[r][i]
        loss_ref, gx_ref = ref[r]
        assert len(res["loss"]) == tokens[r]
        torch.testing.assert_close(
            torch.tensor(res["loss"], dtype=torch.float64).reshape(-1),
            loss_ref,
            rtol=1e-5,
            atol=1e-5,
        )
        torch.testing.assert_close(
            torch.tensor(res["grad_x"], dtype=torch.float64).reshape(tokens[r], hidden),
            gx_ref,
            rtol=1e-5,
            atol=1e-5,
        )
        lo, hi = res["lo"], res["hi"]
        covered.append((lo, hi))
        torch.testing.assert_close(
            torch.tensor(res["grad_w"], dtype=torch.float64).reshape(hidden, hi - lo),
            grad_w_ref[:, lo:hi],
            rtol=1e-5,
            atol=1e-5,
        )
    assert covered == shard_bounds(vocab, len(group)) and covered[-1][1] == vocab


def test_shard_bounds_uneven_and_rejects_tiny_vocab():
    assert shard_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    with pytest.raises(ValueError, match="vocab_size"):
        shard_bounds(3, 4)
