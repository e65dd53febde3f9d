"""SSMB (X-MoE Sec. 4.3) vs the single-process layer and vs TP + EP without sequence sharding."""

import pytest
import torch
import torch.nn.functional as F

from moe_repro.components.moe.ssmb import sequence_bounds
from moe_repro.runtime.launch import run_ranks

pytestmark = pytest.mark.multiprocess


def _reference(case):
    """One process, full weights: x + gelu(x W1) W2 + b2, then h + MoE(h) with all experts local."""
    from _memsave_targets import ssmb_inputs, ssmb_model

    w1, w2, b2, moe = ssmb_model(
        case["seed"],
        case["hidden"],
        case["dense_ffn"],
        case["experts"],
        case["expert_ffn"],
        case["top_k"],
        case["activation"],
    )
    x, grad_out = ssmb_inputs(case["seed"], case["seq"], case["hidden"])
    w1, w2, b2, x = (t.clone().requires_grad_(True) for t in (w1, w2, b2, x))
    h = x + F.gelu(x @ w1) @ w2 + b2
    out = h + moe(h)
    out.backward(grad_out)
    return {
        "out": out.detach(),
        "dx": x.grad,
        "dw1": w1.grad,
        "dw2": w2.grad,
        "db2": b2.grad,
        "dgate": moe.gate.weight.grad,
        "dw_in": moe.experts.w_in.grad,
        "dw_out": moe.experts.w_out.grad,
    }


CASES = {
    2: [
        dict(
            seq=9,
            hidden=8,
            dense_ffn=12,
            experts=4,
            expert_ffn=6,
            top_k=2,
            activation="gelu",
            seed=0,
        ),
        dict(
            seq=1,
            hidden=8,
            dense_ffn=4,
            experts=2,
            expert_ffn=4,
            top_k=1,
            activation="swiglu",
            seed=1,
        ),
    ],
    4: [
        dict(
            seq=11,
            hidden=8,
            dense_ffn=8,
            experts=8,
            expert_ffn=4,
            top_k=2,
            activation="swiglu",
            seed=2,
        ),
        dict(
            seq=6,
            hidden=4,
            dense_ffn=16,
            experts=4,
            expert_ffn=8,
            top_k=3,
            activation="gelu",
            seed=3,
        ),
    ],
}


@pytest.mark.parametrize("world", [2, 4])
def test_ssmb_equals_unsharded_layer(targets_on_path, world):
    outs = run_ranks(
        "_memsave_targets:ssmb", dict(cases=CASES[world]), world_size=world, timeout_s=120
    )
    tol = dict(rtol=1e-4, atol=1e-5)
    for i, case in enumerate(CASES[world]):
        ref = _reference(case)
        per = case["dense_ffn"] // world
        for r in range(world):
            for mode in ("ssmb", "tp_ep"):
                res = outs[r][i][mode]
                mine = res["local_experts"]
                expected = {
                    "out": ref["out"],
                    "dx": ref["dx"],
                    "db2": ref["db2"],
                    "dw1": ref["dw1"][:, r * per : (r + 1) * per],
                    "dw2": ref["dw2"][r * per : (r + 1) * per],
                    "dgate": ref["dgate"],
                    "dw_in": ref["dw_in"][mine],
                    "dw_out": ref["dw_out"][mine],
                }
                for key, want in expected.items():
                    got = torch.tensor(res[key], dtype=torch.float32).reshape(want.shape)
                    torch.testing.assert_close(
                        got, want, **tol, msg=f"{mode} {key} rank {r} case {i}"
                    )


def test_sequence_bounds_uneven():
    assert sequence_bounds(11, 4) == [(0, 3), (3, 6), (6, 9), (9, 11)]
    assert sequence_bounds(1, 2) == [(0, 1), (1, 1)]
