"""Planner: Eq. 7-11 on the Done-when case and on small hand-checkable cases."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from moe_repro.components.resources.memory_model import MemoryOptions, all_stages
from moe_repro.components.resources.planner import plan
from moe_repro.components.network.platform import from_dict, load_builtin
from moe_repro.components.model.zoo import MoEModel, get_model


def test_deepseek_v3_on_frontier_64_nodes():
    p = load_builtin("frontier")
    pl = plan(get_model("deepseek-v3"), p, nodes=64)
    assert pl.gpus == 512
    assert pl.candidates, "expected at least one candidate"
    for c in pl.candidates:
        assert c.pp * c.ep == 512 and 256 % c.ep == 0 and c.pp <= 61 and c.ep <= 8 * 4
    # Every factorisation is either a candidate or rejected with its equation named.
    seen = {(c.pp, c.ep) for c in pl.candidates} | {(r["pp"], r["ep"]) for r in pl.rejected}
    assert seen == {(512 // ep, ep) for ep in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)}
    reasons = {r["ep"]: r["why_not"] for r in pl.rejected}
    assert "Eq. 9" in reasons[8] and "Eq. 10" in reasons[64] and "Eq. 8" in reasons[512]
    feasible = [c for c in pl.candidates if c.feasible]
    assert feasible and all(c.peak_bytes <= 64e9 for c in feasible)
    mfus = [c.estimate.mfu for c in feasible]
    assert mfus == sorted(mfus, reverse=True) and 0 < mfus[0] < 1


def _toy_platform(hbm_gb: float) -> dict:
    return {
        "name": "toy",
        "gpu": {
            "peak_tflops": 100,
            "hbm_GB": hbm_gb,
            "hbm_GBps": 1000,
            "achievable_gemm_tflops": 50,
            "achievable_attention_tflops": 40,
        },
        "node": {"gpus": 4, "nics": 1, "nic_GBps": 10, "intra_node_alltoall_GBps_per_gpu": 100},
        "network": {"switch_group_nodes": 1, "rack_nodes": 1},
    }


TOY = MoEModel(
    key="toy",
    name="toy",
    layers=6,
    d_model=256,
    d_ffn=512,
    n_experts=6,
    top_k=2,
    n_heads=4,
    attn_params="4d2",
)


def test_constraints_on_a_small_case():
    # 2 nodes x 4 GPUs = 8: EP in {1,2,4,8}; E=6 -> EP | 6 leaves 1, 2; PP=8 > L=6 rejects EP=1;
    # EP=8 > g N_h = 4 and does not divide 6.
    pl = plan(TOY, from_dict(_toy_platform(80)), nodes=2, seq=64)
    assert [(c.pp, c.ep) for c in pl.candidates] == [(4, 2)]
    reasons = {r["ep"]: r["why_not"] for r in pl.rejected}
    assert set(reasons) == {1, 4, 8}
    assert "Eq. 9" in reasons[1] and "Eq. 8" in reasons[4] and "Eq. 10" in reasons[8]


def test_memory_infeasible_names_binding_term_and_stage():
    p = from_dict(_toy_platform(0.001))  # 1 MB of HBM: nothing fits
    pl = plan(TOY, p, nodes=2, seq=64, allow_checkpointing=False)
    (c,) = pl.candidates
    assert not c.feasible and "Eq. 11" in c.why_not and "stage 0" in c.why_not
    stages = all_stages(TOY, 4, 2, c.micro_batch, 64, c.micro_batches, opts=MemoryOptions())
    assert c.peak_bytes == pytest.approx(max(s.total for s in stages))
    assert pl.best is None


def test_checkpointing_fallback_is_marked():
    p = load_builtin("frontier")
    pl = plan(get_model("deepseek-v3"), p, nodes=64)
    no_ckpt = plan(get_model("deepseek-v3"), p, nodes=64, allow_checkpointing=False)
    for a, b in zip(
        sorted(pl.candidates, key=lambda c: c.ep), sorted(no_ckpt.candidates, key=lambda c: c.ep)
    ):
        if a.checkpointing:
            assert not b.feasible  # it was only chosen because the plain plan did not fit


def test_global_batch_must_split_evenly():
    pl = plan(TOY, from_dict(_toy_platform(80)), nodes=2, seq=64, global_batch=6, micro_batches=4)
    (c,) = pl.candidates
    assert not c.feasible and "multiple of M x EP" in c.why_not


@pytest.mark.parametrize(
    "bad", [dict(nodes=0), dict(nodes=1, seq=-1), dict(nodes=1, global_batch=0)]
)
def test_bad_sizes_raise(bad):
    with pytest.raises(ValueError, match="positive"):
        plan(TOY, from_dict(_toy_platform(80)), **bad)


def test_platform_validation():
    doc = _toy_platform(80)
    del doc["node"]["nics"]
    with pytest.raises(ValueError, match="node.nics"):
        from_dict(doc)
    with pytest.raises(ValueError, match="unknown platform"):
        load_builtin("mars")
    for name in ("frontier", "dgx-h100", "h200"):
        p = load_builtin(name)
        assert p.gpus_per_node == 8 and p.links and p.raw["sources"]
    f = load_builtin("frontier")
    assert (
        f.peak_flops,
        f.hbm_bytes,
        f.nics_per_node,
        f.nic_bytes_per_s,
        f.switch_group_nodes,
    ) == (191.5e12, 64e9, 4, 25e9, 4)


def test_local_profile_from_measurements_is_valid_and_rejects_bad_values():
    from moe_repro.components.network.platform import local_profile

    doc = local_profile(
        0.05, 0.01, 4.0, ranks=2, memory_GB_per_rank=8.0, description="t", measured={}
    )
    p = from_dict(doc)
    assert p.gpus_per_node == 2 and p.peak_flops == 0.05e12 and p.intra_node_a2a_bytes_per_s == 2e9
    pl = plan(get_model("tiny-moe"), p, nodes=1, seq=64)
    assert pl.best is not None and {(c.pp, c.ep) for c in pl.candidates} == {(1, 2), (2, 1)}
    with pytest.raises(ValueError, match="copy"):
        local_profile(
            0.05, 0.01, 0.0, ranks=2, memory_GB_per_rank=8.0, description="t", measured={}
        )
    assert (
        from_dict(
            json.loads(
                resources.files("moe_repro.components.network")
                .joinpath("platforms", "local.json")
                .read_text()
            )
        ).name
        == "local"
    )
