"""Ulysses sequence-parallel attention (MoP Sec. 3.2) vs plain causal attention on one process."""

import math

import pytest
import torch

from moe_repro.runtime.launch import run_ranks

pytestmark = pytest.mark.multiprocess


def _reference(q, k, v, grad_out):
    """Causal softmax attention written out with an explicit loop over query positions (fp64)."""
    q, k, v = (t.double().requires_grad_(True) for t in (q, k, v))
    seq, heads, dim = q.shape
    rep = heads // k.shape[1]
    kr, vr = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    rows = []
    for i in range(seq):
        scores = torch.einsum("hd,jhd->hj", q[i], kr[: i + 1]) / math.sqrt(dim)
        rows.append(torch.einsum("hj,jhd->hd", scores.softmax(dim=-1), vr[: i + 1]))
    out = torch.stack(rows)
    out.backward(grad_out.double())
    return out.detach(), q.grad, k.grad, v.grad


CASES = {
    2: [
        dict(lengths=[5, 8], heads=4, kv_heads=4, dim=8, seed=0),  # S = 13, odd
        dict(lengths=[0, 7], heads=2, kv_heads=2, dim=4, seed=1),  # a rank with no tokens
        dict(lengths=[6, 6], heads=4, kv_heads=2, dim=8, seed=2),
    ],  # grouped-query attention
    4: [
        dict(lengths=[3, 5, 2, 7], heads=4, kv_heads=4, dim=8, seed=3),
        dict(lengths=[4, 0, 4, 1], heads=8, kv_heads=4, dim=4, seed=4),
        dict(lengths=[2, 2, 2, 2], heads=6, kv_heads=6, dim=4, seed=5),  # 6 heads over 4 ranks
        dict(lengths=[3, 4, 0, 5], heads=2, kv_heads=2, dim=4, seed=6, subgroups=2),
    ],  # 2 groups of D=2
}


@pytest.mark.parametrize("world", [2, 4])
def test_ulysses_equals_plain_attention(targets_on_path, world):
    from _memsave_targets import attention_inputs

    outs = run_ranks(
        "_memsave_targets:ulysses", dict(cases=CASES[world]), world_size=world, timeout_s=90
    )
    for i, case in enumerate(CASES[world]):
        d = world // case.get("subgroups", 1)
        if case["heads"] % d:
            for r in range(world):
                assert "divisible by the sequence-parallel degree" in outs[r][i]["error"]
            continue
        for g_index, first in enumerate(range(0, world, d)):
            lengths = case["lengths"][first : first + d]
            q, k, v, grad_out = attention_inputs(
                case["seed"] + g_index, sum(lengths), case["heads"], case["kv_heads"], case["dim"]
            )
            _check_group(outs, i, _reference(q, k, v, grad_out), (q, k, v), range(first, first + d))


def _check_group(outs, i, ref, inputs, ranks):
    q, k, v = inputs
    for r in ranks:
        res = outs[r][i]
        lo, hi = res["lo"], res["hi"]
        for key, full, shape in (
            ("out", ref[0], q.shape),
            ("dq", ref[1], q.shape),
            ("dk", ref[2], k.shape),
            ("dv", ref[3], v.shape),
        ):
            got = torch.tensor(res[key], dtype=torch.float64).reshape(hi - lo, *shape[1:])
            torch.testing.assert_close(
                got, full[lo:hi], rtol=1e-5, atol=1e-5, msg=f"{key} rank {r} case {i}"
            )


def test_declared_bytes_match_a_hand_count():
    from moe_repro.components.model.ulysses_attention import alltoall_bytes_per_rank

    # rank 0 of D = 2 holds 3 of 8 tokens; H = 4 query heads, 2 kv heads, d = 8, fp32 (32 B a head row)
    got = alltoall_bytes_per_rank([3, 5], 0, heads=4, kv_heads=2, head_dim=8)
    # seq->head: its 3 tokens x the peer's half of the heads: q 3*2, k 3*1, v 3*1 head rows
    # head->seq: its 2 heads of the peer's 5 tokens
    assert got == {"seq_to_head_bytes": (3 * 2 + 3 + 3) * 32, "head_to_seq_bytes": 5 * 2 * 32}
