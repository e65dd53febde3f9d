"""The planner's EP term (ep_time.dispatch_time) against the network simulator on one fabric."""

import copy

import pytest

from moe_repro.components.model.zoo import get_model
from moe_repro.components.network.ep_units import Routing
from moe_repro.components.network.platform import from_dict, load_builtin
from moe_repro.components.network.simulator import (
    ep_kernel_messages,
    simulate_ep_kernel,
    simulate_messages,
    topology_for,
)
from moe_repro.components.resources import ep_time as E
from moe_repro.components.resources import formulas as F
from moe_repro.components.resources import layout_time as LT
from moe_repro.components.resources import time_model as T
from moe_repro.components.resources.parallel_planner import plan_parallel

EP_SIZES = (8, 16, 32, 64, 128)
TOKENS = (128, 512, 4096)
TOP_K, EXPERTS, ROW = 8, 256, 2 * 7168  # DeepSeek-V3's routing and BF16 rows
CASES = [  # (dispatcher, node limit)
    ("alltoall", None),
    ("deepep", None),
    ("deepep", 4),
    ("hybrid-ep", None),
    ("deepep-ll", None),
]
TOLERANCE = 0.10


def _nccl_fabric(p):
    """The profile with the NIC and fabric at line rate x efficiency.network: the fabric the
    planner's NCCL all-to-all sees (the simulator runs links at line rate)."""
    doc = copy.deepcopy(p.raw)
    eff = p.network_efficiency
    doc["node"]["nic_GBps"] = float(doc["node"]["nic_GBps"]) * eff
    for link in doc["links"]:
        if link["class"] not in ("intra_node", "intra_package") and "GBps" in link:
            link["GBps"] = float(link["GBps"]) * eff
    doc.setdefault("efficiency", {})["network"] = 1.0
    return from_dict(doc)


def _simulated(p, dispatcher, r):
    if dispatcher == "alltoall":
        q = _nccl_fabric(p)
        messages, deps = ep_kernel_messages(r, "low_latency", ROW)
        return simulate_messages(messages, topology_for(q, r.nodes, r.local), q, deps).time_s
    kernel = "low_latency" if dispatcher == "deepep-ll" else "normal"
    return simulate_ep_kernel(p, r, kernel, ROW).time_s


def _errors(platform: str, dispatcher: str, limit):
    """Relative error of the planner's dispatch time against the simulator's, over the grid."""
    p = load_builtin(platform)
    g = p.gpus_per_node
    out = {}
    for ep in EP_SIZES:
        for tokens in TOKENS:
            r = Routing(ep, g, tokens, TOP_K, EXPERTS, limit)
            sim = _simulated(p, dispatcher, r)
            planned = E.dispatch_time(p, dispatcher, ep, g, tokens, TOP_K, EXPERTS, ROW, limit)
            out[(ep, tokens)] = planned.seconds / sim - 1.0
    return out


@pytest.mark.parametrize("platform", ["dgx-h100", "h800"])
@pytest.mark.parametrize("dispatcher,limit", CASES)
def test_planner_ep_time_agrees_with_simulator(platform, dispatcher, limit):
    errors = _errors(platform, dispatcher, limit)
    worst = max(errors, key=lambda k: abs(errors[k]))
    assert abs(errors[worst]) <= TOLERANCE, (worst, errors[worst])


@pytest.mark.parametrize("platform", ["frontier", "dgx-a100", "p5en"])
@pytest.mark.parametrize("dispatcher,limit", [c for c in CASES if c[0] != "alltoall"])
def test_kernel_dispatchers_agree_on_other_fabrics(platform, dispatcher, limit):
    """Pair links between GPUs (frontier's GCD graph), two GPUs per NIC, a Dragonfly fabric and
    EFA's message rate and proxy latency (p5en): the kernels' closed form still follows the
    simulator. (The flat alltoall term keeps
    time_model's per-GPU intra-node all-to-all rate, which on frontier's graph is not the
    simulator's per-pair model.)"""
    errors = _errors(platform, dispatcher, limit)
    worst = max(errors, key=lambda k: abs(errors[k]))
    assert abs(errors[worst]) <= TOLERANCE, (worst, errors[worst])


def _flat(p, dispatcher, ep, ep_per_node, tokens, top_k, experts, row_bytes, node_limit=None):
    """The planner's EP term before ep_time: every top-k copy sent apart, at the profile's rates."""
    sent = F.alltoall_bytes(tokens * top_k * row_bytes, ep)
    on_node = min(ep, ep_per_node)
    per_peer = sent / (ep - 1)
    seconds = T.alltoall_time(p, per_peer * (on_node - 1), per_peer * (ep - on_node))
    return E.Dispatch(seconds, sent)


@pytest.mark.parametrize("platform", ["dgx-h100", "h800"])
@pytest.mark.parametrize("dispatcher,limit", [("deepep", None), ("deepep", 4)])
def test_flat_term_disagrees_for_deduplicated_dispatchers(monkeypatch, platform, dispatcher, limit):
    monkeypatch.setattr(E, "dispatch_time", _flat)
    errors = _errors(platform, dispatcher, limit)
    assert max(abs(e) for e in errors.values()) > TOLERANCE


def test_planner_uses_the_dispatch_time(monkeypatch):
    """The plan's EP seconds are ep_time's: scaling dispatch_time scales every EP part."""
    m, p = get_model("mixtral-8x7b"), load_builtin("dgx-h100")
    base = plan_parallel(m, p, 2, ep=8, tp=1, pp=1, zero=(1,), recompute=("none",), micro_batches=8)
    real = E.dispatch_time

    def doubled(*args, **kwargs):
        one = real(*args, **kwargs)
        return E.Dispatch(2 * one.seconds, one.bytes)

    monkeypatch.setattr(E, "dispatch_time", doubled)
    twice = plan_parallel(
        m, p, 2, ep=8, tp=1, pp=1, zero=(1,), recompute=("none",), micro_batches=8
    )
    a, b = base.candidates[0], twice.candidates[0]
    assert a.parts["ep"] > 0
    assert b.parts["ep"] == pytest.approx(2 * a.parts["ep"])
    assert LT.E is E


def test_dispatchers_and_node_limit():
    p = load_builtin("dgx-h100")
    args = (p, 64, 8, 4096, TOP_K, EXPERTS, ROW)
    flat = E.dispatch_time(p, "alltoall", *args[1:])
    dedup = E.dispatch_time(p, "deepep", *args[1:])
    limited = E.dispatch_time(p, "deepep", *args[1:], node_limit=4)
    assert limited.seconds < dedup.seconds < flat.seconds
    assert E.dispatch_time(p, "hybrid-ep", *args[1:]) == dedup
    assert [E.node_limit("deepseek-v3", n) for n in (2, 8, 16)] == [4, 4, 8]
    assert E.node_limit("mixtral-8x7b", 16) is None
    with pytest.raises(ValueError, match="dispatcher"):
        E.dispatch_time(p, "nccl", *args[1:])
    with pytest.raises(ValueError, match="dispatcher"):
        plan_parallel(get_model("mixtral-8x7b"), p, 1, dispatcher="nccl")
    assert any(
        "dispatcher deepep" in a
        for a in plan_parallel(
            get_model("mixtral-8x7b"), p, 1, ep=8, dispatcher="deepep"
        ).assumptions
    )


def test_plan_cli_dispatcher():
    from click.testing import CliRunner

    from moe_repro.cli.plan_cmd import command

    base = ["--model", "mixtral-8x7b", "--platform", "dgx-h100", "--nodes", "1", "--top", "1"]
    out = CliRunner().invoke(command, [*base, "--dispatcher", "deepep"])
    assert out.exit_code == 0, out.output
    assert "dispatcher deepep" in out.output
    assert CliRunner().invoke(command, [*base, "--dispatcher", "nccl"]).exit_code != 0
    help_text = CliRunner().invoke(command, ["--help"]).output
    assert "node-deduplicated" in help_text and "low-latency" in help_text
    out = CliRunner().invoke(command, [*base, "--dispatcher", "deepep", "--overlap-ep"])
    assert out.exit_code == 0 and "overlapped (asked)" in out.output, out.output


def test_overlap_ep_hides_ep_behind_compute():
    """Exposed by default; overlapped (asked), only what exceeds the stage's compute is left."""
    m, p = get_model("mixtral-8x7b"), load_builtin("dgx-h100")
    fixed = dict(ep=8, tp=1, pp=1, zero=(1,), recompute=("none",), micro_batches=8)
    exposed = plan_parallel(m, p, 2, dispatcher="deepep", **fixed).candidates[0]
    hidden_plan = plan_parallel(m, p, 2, dispatcher="deepep", overlap_ep=True, **fixed)
    hidden = hidden_plan.candidates[0]
    assert exposed.parts["ep"] > 0
    assert hidden.parts["ep"] == pytest.approx(
        max(0.0, exposed.parts["ep"] - exposed.parts["compute"]), abs=1e-9
    )
    assert hidden.step_s < exposed.step_s
    assert any("overlapped (asked)" in a for a in hidden_plan.assumptions)
