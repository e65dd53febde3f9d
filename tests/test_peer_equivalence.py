"""Equivalence with the MoE stacks users run (the ``peers`` extra): Megatron-core 0.16.1 and
DeepSpeed 0.19.8. Skipped where the extra is not installed, except where
MOE_REPRO_REQUIRE_PEERS=1 (CI), where its absence fails the test.

Inputs: fresh random router logits with a skewed expert popularity (uneven load, so capacity
overflows) and, in some cases, experts no token can pick (empty experts).

- Megatron ``permute`` / ``unpermute`` vs our gather / weighted scatter: outputs and the
  gradients of the input and of the router logits, fp32, bitwise; with and without
  ``apply_router_token_dropping`` (drop policy "probs").
- Over real ranks (2 and 4, gloo), forward and backward: Megatron's ``MoEAlltoAllTokenDispatcher``
  and DeepSpeed's ``MOELayer`` with their own all-to-alls (components/moe/peer_ep.py) around the
  same router and expert weights as our expert-parallel layer: outputs and the gradients of the
  input, the router and every expert weight.
- DeepSpeed gates vs ``build_pft``'s drop policies: ``top1gating`` with random token selection
  (our "random", same seed), ``top2gating`` (our "slot" + renormalize), ``topkgating`` with
  drop_policy "probs" and "position" (ours + renormalize): the same kept (token, expert) pairs
  and the same weights.
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from moe_repro.components.moe.gating import top_k_gating
from moe_repro.components.moe import peers
from moe_repro.components.moe.peers import quiet_import, installed_version
from moe_repro.components.moe.pft import build_pft, gather_tokens, scatter_combine


def _peer(distribution: str, module: str):
    if installed_version(distribution) is None:
        message = f"{distribution} not installed (pip install -e \".[peers]\")"
        if os.environ.get("MOE_REPRO_REQUIRE_PEERS"):
            pytest.fail(message)
        pytest.skip(message)
    return quiet_import(module)


@pytest.fixture(scope="module")
def mu():
    return _peer("megatron-core", "megatron.core.transformer.moe.moe_utils")


@pytest.fixture(scope="module")
def sm():
    return _peer("deepspeed", "deepspeed.moe.sharded_moe")


def skewed_logits(tokens: int, experts: int, empty: int, seed: int) -> torch.Tensor:
    """Router logits whose expert popularity falls off linearly (uneven load); ``empty``
    experts get logits no softmax top-k picks while others remain."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=g)
    popularity = torch.linspace(2.0, 0.0, experts)[torch.randperm(experts, generator=g)]
    logits = logits + popularity
    if empty:
        logits[:, torch.randperm(experts, generator=g)[:empty]] = -60.0
    return logits


def dense(pft, tokens: int, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Our PFT as DeepSpeed/Megatron-style [S, E] kept mask and weights."""
    mask = torch.zeros(tokens, experts, dtype=torch.bool)
    weights = torch.zeros(tokens, experts, dtype=pft.combine_weights.dtype)
    mask[pft.token_ids, pft.expert_ids] = True
    weights[pft.token_ids, pft.expert_ids] = pft.combine_weights.detach()
    return mask, weights


CASES = [  # (tokens, experts, top_k, empty experts)
    (1, 4, 1, 0),
    (5, 4, 2, 0),
    (64, 8, 2, 2),
    (64, 8, 4, 0),
    (257, 16, 4, 3),
    (300, 16, 1, 5),
    (128, 32, 8, 4),
]


@pytest.mark.parametrize("drop_factor", [None, 0.5, 1.0, 1.25])
def test_megatron_permute_unpermute_bitwise(mu, drop_factor):
    equal = 0
    for (tokens, experts, top_k, empty), hidden, seed in itertools.product(CASES, (8, 33), (0, 1)):
        logits = skewed_logits(tokens, experts, empty, seed)
        g = torch.Generator().manual_seed(100 + seed)
        x = torch.randn(tokens, hidden, generator=g)
        grad_out = torch.randn(tokens, hidden, generator=g)

        # Megatron: router probs and map, optional dropping, permute, expert, unpermute.
        logits_m, x_m = logits.clone().requires_grad_(), x.clone().requires_grad_()
        probs, routing_map = mu.topk_routing_with_score_function(
            logits_m, top_k, use_pre_softmax=True, score_function="softmax"
        )
        if drop_factor is not None:
            probs, routing_map = mu.apply_router_token_dropping(
                probs,
                routing_map,
                router_topk=top_k,
                capacity_factor=drop_factor,
                drop_policy="probs",
            )
        permuted, _, sorted_indices = mu.permute(x_m, routing_map)
        out_m = mu.unpermute(
            torch.tanh(permuted) * 3,
            sorted_indices,
            x_m.shape,
            probs=probs,
            routing_map=routing_map,
        )
        out_m.backward(grad_out)

        # Ours: gate, PFT (capacity as Megatron computes it), gather, expert, scatter.
        logits_o, x_o = logits.clone().requires_grad_(), x.clone().requires_grad_()
        gate = top_k_gating(logits_o, top_k)
        capacity = (
            None if drop_factor is None else mu.get_capacity(tokens * top_k, experts, drop_factor)
        )
        if capacity is not None and capacity > tokens:
            capacity = None  # Megatron drops nothing then (apply_router_token_dropping)
        pft = build_pft(gate.top_experts, gate.combine_weights, experts, capacity)
        out_o = scatter_combine(torch.tanh(gather_tokens(x_o, pft)) * 3, pft)
        out_o.backward(grad_out)

        mask_o, _ = dense(pft, tokens, experts)
        assert torch.equal(mask_o, routing_map), (tokens, experts, top_k, empty, seed)
        assert torch.equal(out_o, out_m), (tokens, experts, top_k, empty, seed)
        assert torch.equal(x_o.grad, x_m.grad), (tokens, experts, top_k, empty, seed)
        assert torch.equal(logits_o.grad, logits_m.grad), (tokens, experts, top_k, empty, seed)
        equal += 1
    assert equal == len(CASES) * 2 * 2


def _deepspeed_kept(combine_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    weights = combine_weights.sum(dim=2)
    return combine_weights.bool().any(dim=2), weights


@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 2.0])
def test_deepspeed_top1gating_random_token_selection(sm, capacity_factor):
    for (tokens, experts, _, empty), seed in itertools.product(CASES, (0, 1, 2)):
        logits = skewed_logits(tokens, experts, empty, seed)
        torch.manual_seed(seed)
        _, combine_weights, _, _ = sm.top1gating(logits.clone(), capacity_factor, 1, use_rts=True)
        ds_mask, ds_weights = _deepspeed_kept(combine_weights)

        gate = top_k_gating(logits, 1)
        torch.manual_seed(seed)  # the same draw DeepSpeed made: torch.rand(S, E)
        pft = build_pft(
            gate.top_experts,
            gate.combine_weights,
            experts,
            capacity=combine_weights.shape[2],
            drop_policy="random",
        )
        mask, weights = dense(pft, tokens, experts)
        assert torch.equal(mask, ds_mask), (tokens, experts, empty, seed)
        assert torch.equal(weights, ds_weights), (tokens, experts, empty, seed)


def test_deepspeed_top1gating_without_rts_keeps_c_of_each_expert(sm):
    """Without random token selection DeepSpeed keeps whichever C tokens ``torch.topk`` returns
    among equal 0/1 entries (an arbitrary order); so only what is defined is compared: the same
    count kept per expert, every kept pair routed, and, with no overflow, the same pairs."""
    for (tokens, experts, _, empty), seed in itertools.product(CASES, (0, 1)):
        logits = skewed_logits(tokens, experts, empty, seed)
        for factor in (0.5, float(experts)):
            _, combine_weights, _, _ = sm.top1gating(logits.clone(), factor, 1, use_rts=False)
            ds_mask, _ = _deepspeed_kept(combine_weights)
            gate = top_k_gating(logits, 1)
            pft = build_pft(
                gate.top_experts,
                gate.combine_weights,
                experts,
                capacity=combine_weights.shape[2],
                drop_policy="position",
            )
            mask, _ = dense(pft, tokens, experts)
            assert torch.equal(mask.sum(0), ds_mask.sum(0))
            routed = torch.zeros_like(mask)
            routed[torch.arange(tokens), gate.top_experts[:, 0]] = True
            assert not (ds_mask & ~routed).any()
            if combine_weights.shape[2] >= tokens:  # nothing can overflow
                assert torch.equal(mask, ds_mask)


@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 1.25])
def test_deepspeed_top2gating_is_slot_order_with_renormalisation(sm, capacity_factor):
    for (tokens, experts, _, empty), seed in itertools.product(CASES, (0, 1)):
        if experts - empty < 2:
            continue
        logits = skewed_logits(tokens, experts, empty, seed)
        _, combine_weights, _, _ = sm.top2gating(
            logits.clone(), capacity_factor, 1, top2_2nd_expert_sampling=False
        )
        ds_mask, ds_weights = _deepspeed_kept(combine_weights)
        gate = top_k_gating(logits, 2)
        pft = build_pft(
            gate.top_experts,
            gate.combine_weights,
            experts,
            capacity=combine_weights.shape[2],
            drop_policy="slot",
            renormalize=True,
        )
        mask, weights = dense(pft, tokens, experts)
        assert torch.equal(mask, ds_mask), (tokens, experts, empty, seed)
        torch.testing.assert_close(weights, ds_weights, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("drop_policy", ["probs", "position"])
@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 1.25])
def test_deepspeed_topkgating_per_drop_policy(sm, drop_policy, capacity_factor):
    for (tokens, experts, top_k, empty), seed in itertools.product(CASES, (0, 1)):
        logits = skewed_logits(tokens, experts, empty, seed)
        _, combine_weights, _, _ = sm.topkgating(
            logits.clone(), top_k, capacity_factor, 1, drop_policy=drop_policy
        )
        ds_mask, ds_weights = _deepspeed_kept(combine_weights)
        gate = top_k_gating(logits, top_k)
        pft = build_pft(
            gate.top_experts,
            gate.combine_weights,
            experts,
            capacity=combine_weights.shape[2],
            drop_policy=drop_policy,
            renormalize=True,
        )
        mask, weights = dense(pft, tokens, experts)
        assert torch.equal(mask, ds_mask), (tokens, experts, top_k, empty, seed)
        torch.testing.assert_close(weights, ds_weights, rtol=1e-6, atol=1e-7)


# --- the suites' peer implementations ---------------------------------------------------------

SMALL = {
    "stage": "total",
    "tokens": 96,
    "d_model": 32,
    "experts": 8,
    "top_k": 2,
    "capacity_factor": 0.75,
    "d_ffn": 16,
    "device": "cpu",
    "threads": 1,
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("impl", ["megatron", "megatron-nodrop", "deepspeed", "deepspeed-einsum"])
def test_moe_dispatch_suite_runs_each_peer_correctly(mu, sm, impl, dtype):
    from moe_repro.suites.moe_dispatch import SUITE

    point = SUITE.grid({**{k: [v] for k, v in SMALL.items()}, "impl": [impl], "dtype": [dtype]})[0]
    assert point["peer"].startswith(("megatron-core==0.16.1", "deepspeed==0.19.8"))
    state = SUITE.setup(point, None)
    assert SUITE.check(state) == 0  # against the suite's loop over tokens, per peer semantics


@pytest.mark.parametrize(
    "impl,ours",
    [
        ("megatron", {}),
        ("megatron-nodrop", {"capacity_factor": None}),
        ("deepspeed", {"renormalize_after_drop": True}),
    ],
)
def test_moe_layer_peer_forward_equals_ours_with_the_peer_semantics(mu, sm, impl, ours):
    """A whole layer (ranks=1): the peer's gating/dispatch/combine around our expert weights
    gives our layer's output once our layer is set to the peer's semantics."""
    from moe_repro.suites._moe_stages import build, stage_calls

    params = {
        "impl": impl,
        "tokens": 64,
        "d_model": 16,
        "d_ffn": 24,
        "experts": 8,
        "top_k": 2,
        "capacity_factor": 0.75,
        "dtype": "float32",
        "device": "cpu",
    }
    layer, x = build(params, None)
    with torch.no_grad():
        peer_out = stage_calls(layer, x, impl)["calls"]["layer"]()
        for key, value in ours.items():
            setattr(layer, key, value)
        torch.testing.assert_close(peer_out, layer(x), rtol=1e-5, atol=1e-6)


# --- Megatron's token dispatcher in the alltoall suite, beside ours -----------------------------

SIDE_BY_SIDE = [
    "bench",
    "alltoall",
    "--nodes",
    "1",
    "--gpus-per-node",
    "2",
    "--algo",
    "flat",
    "--path",
    "dispatch,combine,collective,megatron-dispatch,megatron-combine",
    "--sizes",
    "16K",
    "--backend",
    "gloo",
    "--check",
    "--repeats",
    "2",
    "--warmup",
    "0",
    "--min-sample-s",
    "0",
]


@pytest.mark.multiprocess
def test_megatron_dispatcher_runs_beside_ours_in_the_alltoall_suite_checked(mu, tmp_path):
    """One command: ours, Megatron-core's MoEAlltoAllTokenDispatcher and the bare collective on
    the same routing, rows and 2 ranks, every output checked, the ratios printed under the table."""
    import json
    import subprocess
    import sys

    out = tmp_path / "a.json"
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from moe_repro.cli import main; main()",
            "--results",
            str(tmp_path / "results"),
            *SIDE_BY_SIDE,
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    records = {rec["path"]: rec for rec in json.loads(out.read_text())["records"]}
    assert set(records) == {
        "dispatch",
        "combine",
        "collective",
        "megatron-dispatch",
        "megatron-combine",
    }
    for rec in records.values():
        assert rec["correct"] is True and rec["wrong"] == 0
    for path in ("megatron-dispatch", "megatron-combine"):
        assert "MoEAlltoAllTokenDispatcher" in records[path]["impl"]
        assert records[path]["bound_s"] > 0 and records[path]["time_over_bound"] > 0
        assert "inter_node_bytes" not in records[path]  # its collectives are not ours to count
    lines = r.stdout.splitlines()
    for call in ("dispatch", "combine"):
        (line,) = [x for x in lines if x.strip().startswith(f"16 KiB {call} (bound ")]
        ours, theirs = records[call]["time_s"], records[f"megatron-{call}"]["time_s"]
        assert f"ours/megatron {ours / theirs:.2f}" in line
        assert f"ours/collective {ours / records['collective']['time_s']:.2f}" in line
        bound = min(rec["bound_s"] for rec in records.values())  # one floor for every row
        assert f"(bound {bound * 1e3:.3g} ms)" in line and f"({theirs / bound:.3g}x bound)" in line


@pytest.mark.multiprocess
def test_dispatch_stages_times_megatrons_stages_beside_ours(mu, tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "s.json"
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from moe_repro.cli import main; main()",
            "--results",
            str(tmp_path / "results"),
            "bench",
            "dispatch-stages",
            "--algo",
            "flat",
            "--dispatcher",
            "ours,megatron",
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            "--tokens",
            "32",
            "--hidden",
            "16",
            "--experts",
            "4",
            "--top-k",
            "2",
            "--check",
            "--repeats",
            "2",
            "--warmup",
            "0",
            "--min-sample-s",
            "0",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    ours, megatron = json.loads(out.read_text())["records"]
    assert (ours["dispatcher"], megatron["dispatcher"]) == ("ours", "megatron")
    assert ours["wrong"] == 0 and megatron["wrong"] == 0
    assert {"counts_exchange_s", "buffer_gather_s", "all_to_all_s"} <= set(ours)
    assert {"permute_and_counts_s", "all_to_all_s"} <= set(
        megatron
    ) and "counts_exchange_s" not in megatron
    assert megatron["permute_and_counts_s"] > 0 and megatron["all_to_all_s"] > 0  # both timed


@pytest.mark.multiprocess
def test_the_suites_check_sees_a_fault_in_megatrons_dispatch(mu, targets_on_path):
    from moe_repro.runtime.launch import run_ranks
    from moe_repro.suites.alltoall import SUITE

    (point,) = SUITE.grid(
        SUITE.parse_overrides(
            [
                "nodes=1",
                "gpus_per_node=2",
                "algo=flat",
                "path=megatron-dispatch",
                "sizes=16K",
                "backend=gloo",
            ]
        )
    )
    for planted in (False, True):
        per_rank = run_ranks(
            "_peer_ep_targets:megatron_dispatch_checked",
            {"point": point, "reverse_received_rows": planted},
            world_size=2,
            timeout_s=300,
        )
        assert all(r["rows"] > 1 for r in per_rank)
        wrong = [r["wrong"] for r in per_rank]
        assert (max(wrong) > 0) if planted else wrong == [0, 0], (planted, wrong)


# --- without the extra: refused with a hint (runs everywhere) ----------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "moe-dispatch", "--impl", "pft,megatron", "--quick"],
        [
            "bench",
            "alltoall",
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            "--algo",
            "flat",
            "--path",
            "dispatch,megatron-dispatch",
            "--backend",
            "gloo",
        ],
    ],
)
def test_a_peer_that_is_not_installed_is_refused_in_one_line(
    monkeypatch, tmp_path, capsys, command
):
    from moe_repro.cli import main

    monkeypatch.setattr(peers, "installed_version", lambda distribution: None)
    with pytest.raises(SystemExit) as exit_info:  # the console entry point, as a user runs it
        main(["--results", str(tmp_path), *command])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "megatron-core" in lines[0] and 'pip install -e ".[peers]"' in lines[0]
    assert not list(tmp_path.rglob("*.json"))  # nothing ran, nothing stored


@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks", [2, 4])
def test_peers_own_expert_parallel_layers_equal_ours_forward_and_backward(
    ranks, mu, sm, targets_on_path
):
    from moe_repro.runtime.launch import run_ranks

    per_rank = run_ranks(
        "_peer_ep_targets:peers_beside_ours",
        {"impls": ["megatron", "deepspeed"]},
        world_size=ranks,
        timeout_s=300,
    )
    assert len(per_rank) == ranks
    for result in per_rank:
        assert set(result) == {"megatron", "deepspeed"}
        for impl, r in result.items():
            # fp32; Megatron's path is the same arithmetic as ours (bitwise here), DeepSpeed's
            # sums its [E, C, H] buffer in another order
            assert max(r["diffs"].values()) <= 1e-5, (impl, r)
            assert {"out", "dx", "gate", "w_in", "w_out"} <= set(r["diffs"])
            assert r["scale"]["out"] > 0.1 and r["scale"]["dx"] > 0.1  # not trivially zero
    # capacity bites somewhere: DeepSpeed's drops are compared, not only its kept rows
    assert sum(r["deepspeed"]["dropped_pairs"] for r in per_rank) > 0
    # deepspeed.comm came up without compiling its shared-memory op (minutes of C++ build on
    # every fresh install, for an op only its inference all-reduce uses)
    assert not any(r["deepspeed"]["shared_memory_op_built"] for r in per_rank)
