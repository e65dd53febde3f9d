"""The simulator's vectorised flow engine (network/simulator.py run_flows, max_min_rates) against
the plain engine it replaced (tests/_flow_sim_reference.py: one progressive-filling level at a
time, rebuilt from Python objects at every event), on fresh random schedules and on RBD's
routed schedule. Both must give the same times to float rounding."""

from __future__ import annotations

import copy
import random

import pytest

import _flow_sim_reference as reference
from moe_repro.components.network import simulator as ns
from moe_repro.components.network.platform import from_dict, load_builtin

DEPS = {"I": [], "II": [], "III": ["II"]}


def both(messages, topo, platform, deps, model=None):
    """(vectorised result, reference result) of one schedule."""
    new = ns.simulate_messages(messages, topo, platform, deps, model)
    engine = ns.run_flows
    ns.run_flows = lambda *args: reference.run_flows(*args[:5])  # no progress argument
    try:
        old = ns.simulate_messages(messages, topo, platform, deps, model)
    finally:
        ns.run_flows = engine
    return new, old


def assert_same(new, old):
    assert new.time_s == pytest.approx(old.time_s, rel=1e-9, abs=1e-18)
    assert new.phase_end_s.keys() == old.phase_end_s.keys()
    for phase, t in old.phase_end_s.items():
        assert new.phase_end_s[phase] == pytest.approx(t, rel=1e-9, abs=1e-18), phase
    assert new.eq6_bound_s == old.eq6_bound_s and new.link_bytes == old.link_bytes


def tapered(name: str, taper: float):
    """A built-in profile with its fabric's tapers set to ``taper`` (below 1 the spine or the
    upper levels bind; at 1 they never do, and the engine drops them)."""
    raw = copy.deepcopy(load_builtin(name).raw)
    fabric = raw["network"]["fabric"]
    for key in list(fabric):
        if key.endswith("taper"):
            fabric[key] = taper
    raw["name"] = f"{name} taper {taper}"
    return from_dict(raw)


@pytest.mark.parametrize("seed", range(6))
def test_random_schedules_match_the_reference(seed):
    rng = random.Random(seed)
    name = rng.choice(["dgx-h100", "frontier"])
    platform = tapered(name, rng.choice([1.0, 0.5, 0.25]))
    nodes = rng.choice([2, 3, 4, 5])
    gpus = rng.choice([2, 4, 8])
    topo = ns.topology_for(platform, nodes, gpus)
    N = topo.world_size
    messages = []
    for _ in range(rng.randint(20, 300)):
        src, dst = rng.randrange(N), rng.randrange(N)
        # sizes from a few bytes to a few MB, some equal (simultaneous ends)
        nbytes = rng.choice([rng.randint(1, 64), rng.randint(1, 1 << 22), 4096])
        messages.append((rng.choice(list(DEPS)), src, dst, nbytes))
    model = rng.choice(["overlapped", "serial"])
    assert_same(*both(messages, topo, platform, DEPS, model))


@pytest.mark.parametrize("seed", range(4))
def test_max_min_rates_match_the_reference(seed):
    rng = random.Random(100 + seed)
    resources = [f"r{i}" for i in range(rng.randint(1, 12))]
    capacity = {r: rng.choice([1.0, 2.5, 10.0, rng.uniform(0.1, 100)]) for r in resources}
    flows = []
    for i in range(rng.randint(1, 40)):
        uses = {
            r: rng.choice([1.0, 2.0, 0.5, rng.uniform(0.1, 4)])
            for r in rng.sample(resources, rng.randint(1, len(resources)))
        }
        flows.append(ns.Flow("p", i, 1.0, 1.0, "x", uses))
    got = ns.max_min_rates(flows, capacity)
    want = reference.max_min_rates(flows, capacity)
    assert got == pytest.approx(want, rel=1e-9)
    # and the result is max-min fair: no resource over capacity, every flow has a full resource
    # on which no flow gets more than it
    load = {r: sum(f.uses.get(r, 0.0) * x for f, x in zip(flows, got)) for r in resources}
    assert all(load[r] <= capacity[r] * (1 + 1e-9) for r in resources)
    for f, x in zip(flows, got):
        assert any(
            load[r] >= capacity[r] * (1 - 1e-9)
            and all(x >= y * (1 - 1e-9) for g, y in zip(flows, got) if r in g.uses)
            for r in f.uses
        )


def rbd_point(nodes: int) -> dict:
    from moe_repro.suites import alltoall

    p = {**{k: v[0] for k, v in alltoall.SUITE.params.items()}, "nodes": nodes, "algo": "rbd"}
    return {**p, **alltoall.derived_params(p)}


def rbd_both(nodes: int):
    """`repro bench alltoall --nodes N --algo rbd` at its defaults (simulated on dgx-h100), by
    the suite's own simulate, with the engine and with the reference."""
    from moe_repro.suites import alltoall

    p = rbd_point(nodes)
    assert p["simulated"] and p["platform"] == "dgx-h100"
    new = alltoall.simulate(p)
    engine = ns.run_flows
    ns.run_flows = lambda *args: reference.run_flows(*args[:5])  # no progress argument
    try:
        old = alltoall.simulate(p)
    finally:
        ns.run_flows = engine
    return new, old


def assert_same_record(new, old):
    for key in ("time_s", "eq6_bound_s", "algbw_GBps", "busbw_GBps"):
        assert new[key] == pytest.approx(old[key], rel=1e-9), key
    for key in ("inter_node_bytes", "intra_node_bytes", "bytes"):
        assert new[key] == old[key], key
    for phase, t in old["phase_end_s"].items():
        assert new["phase_end_s"][phase] == pytest.approx(t, rel=1e-9), phase


def test_rbd_default_point_matches_the_reference_on_9_nodes():
    # 9 nodes x 8 GPUs: past the 16 local ranks, RBD's pilots on real per-rank routing
    assert_same_record(*rbd_both(9))


@pytest.mark.slow
def test_rbd_default_point_matches_the_reference_on_16_nodes():
    # the README's `repro bench alltoall --nodes 16` (the reference takes about 8 s)
    assert_same_record(*rbd_both(16))
