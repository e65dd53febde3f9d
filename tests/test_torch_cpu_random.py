"""The numpy twin of torch's CPU generator (components/torch_cpu_random.py) and the simulated
RBD routing built on it, against torch itself: the same draws, the same routing, the same
messages as the torch path (RBD's schedule as it was built before, kept below verbatim)."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from moe_repro.components.alltoall import rbd
from moe_repro.components.moe.pft import build_pft
from moe_repro.components.network.topology import Topology
from moe_repro.components.torch_cpu_random import TorchCPUGenerator
from moe_repro.suites import alltoall


@pytest.mark.parametrize("seed", [0, 1, 7919 * 3 + 5, 104729, 2**32 + 9, 2**40 + 3])
def test_draws_equal_torchs(seed):
    g, twin = torch.Generator().manual_seed(seed), TorchCPUGenerator(seed)
    assert np.array_equal(
        twin.randint(-64, 64, (37, 5)), torch.randint(-64, 64, (37, 5), generator=g).numpy()
    )
    assert np.array_equal(twin.rand(300, 7), torch.rand(300, 7, generator=g).numpy())
    twin.skip(1000)
    torch.randint(0, 3, (1000,), generator=g)
    assert np.array_equal(
        twin.randint(0, 2**28 - 1, (64,)), torch.randint(0, 2**28 - 1, (64,), generator=g).numpy()
    )
    assert np.array_equal(twin.rand(0), torch.rand(0, generator=g).numpy())
    assert np.array_equal(twin.rand(5000), torch.rand(5000, generator=g).numpy())


def test_draws_it_cannot_reproduce_are_refused():
    with pytest.raises(ValueError, match="high - low"):  # torch draws 64 bits per value there
        TorchCPUGenerator(0).randint(0, 2**28, (1,))
    with pytest.raises(ValueError, match="seed"):
        TorchCPUGenerator(-1)


def _point(**changes) -> dict:
    p = {**{k: v[0] for k, v in alltoall.SUITE.params.items()}, "algo": "rbd", **changes}
    return p


def _torch_pft(params, rank):
    _, top, weights = alltoall._rank_inputs(params, rank)
    return build_pft(top, weights, int(params["experts"]))


@pytest.mark.parametrize("case", range(8))
def test_rank_routing_equals_the_real_runs(case):
    rng = random.Random(case)
    experts = rng.choice([4, 16, 24, 64])
    params = _point(
        tokens=rng.choice([0, 1, 7, 64]),
        hidden=rng.choice([1, 3, 32]),
        experts=experts,
        top_k=rng.randint(1, min(experts, 6)),
        seed=rng.randint(0, 50),
    )
    for rank in rng.sample(range(200), 3):
        got, want = alltoall._rank_routing(params, rank), _torch_pft(params, rank)
        assert np.array_equal(got.token_ids, want.token_ids.numpy())
        assert np.array_equal(got.expert_ids, want.expert_ids.numpy())


def test_rank_routing_asks_torch_when_scores_tie(monkeypatch):
    # Scores rounded to quarters tie in every row: the twin must not choose the top-k set
    # itself (torch's sort decides it, unstable past 16 columns) but take torch's routing.
    params = _point(tokens=50, hidden=4, experts=40, top_k=3)
    rand = TorchCPUGenerator.rand
    monkeypatch.setattr(
        TorchCPUGenerator, "rand", lambda self, *shape: np.floor(rand(self, *shape) * 4) / 4
    )
    real = alltoall._rank_inputs

    def coarse_inputs(p, r):  # torch's inputs with the same rounding
        x, _, w = real(p, r)
        g = torch.Generator().manual_seed(alltoall._rank_inputs_seed(p, r))
        torch.randint(-64, 64, (int(p["tokens"]), int(p["hidden"])), generator=g)
        scores = torch.floor(torch.rand(int(p["tokens"]), int(p["experts"]), generator=g) * 4) / 4
        return x, torch.argsort(scores, dim=1)[:, : int(p["top_k"])], w

    monkeypatch.setattr(alltoall, "_rank_inputs", coarse_inputs)
    got, want = alltoall._rank_routing(params, 3), _torch_pft(params, 3)
    assert np.array_equal(got.token_ids, want.token_ids.numpy())
    assert np.array_equal(got.expert_ids, want.expert_ids.numpy())


@pytest.mark.parametrize("seed", range(4))
def test_pilot_groups_equal_torchs_even_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = 2000
    group_key = rng.integers(0, 300, n)
    for priority in (
        rng.random(n, dtype=np.float32),  # distinct: numpy chooses
        np.floor(rng.random(n, dtype=np.float32) * 3) / 3,
    ):  # ties: torch chooses
        pilots, groups = rbd._pilot_groups_numpy(group_key, priority)
        want_pilots, want_groups = rbd._pilot_groups(
            torch.from_numpy(group_key), torch.from_numpy(priority)
        )
        assert np.array_equal(pilots, want_pilots.numpy()) and np.array_equal(
            groups, want_groups.numpy()
        )


def rbd_schedule_before(pfts, expert_to_rank, topo, row_bytes, generators=None):
    """rbd.rbd_schedule as it was before it counted pilots with numpy (verbatim)."""
    N = topo.world_size
    generators = generators or [None] * N
    msgs = []
    replicas = torch.zeros(N * N, dtype=torch.int64)
    for s, (pft, g) in enumerate(zip(pfts, generators)):
        s0 = rbd.select_pilots(pft, expert_to_rank, topo, g)
        for p in range(N):
            msgs.append(("counts", s, p, 16))
            if topo.node_of(p) == topo.node_of(s):  # the intra-node exchange's own phase
                msgs.append(("replica_counts", s, p, 8))
            if s0.meta_counts[p]:
                msgs.append(("meta", s, p, s0.meta_counts[p] * rbd.META_BYTES_PER_PAIR))
            if s0.pilot_counts[p]:
                msgs.append(("pilot", s, p, s0.pilot_counts[p] * row_bytes))
        pilot_rank = torch.repeat_interleave(
            torch.arange(N), torch.tensor(s0.meta_counts, dtype=torch.int64)
        )
        dest = s0.meta[:, 1]
        away = dest != pilot_rank
        replicas += torch.bincount(pilot_rank[away] * N + dest[away], minlength=N * N)
    replicas = replicas.view(N, N).tolist()
    for p in range(N):
        for d in range(N):
            if replicas[p][d]:
                msgs.append(("replica", p, d, replicas[p][d] * row_bytes))
                msgs.append(("replica_meta", p, d, replicas[p][d] * rbd.REPLICA_META_BYTES))
    return msgs


def _schedules(params: dict, nodes: int, gpus: int):
    """(torch path before, torch path now, numpy path now) of RBD's messages at a grid point."""
    topo = Topology(nodes=nodes, ranks_per_node=gpus)
    N, E = topo.world_size, int(params["experts"])
    placement = alltoall._placement(params["placement"], E, N, int(params["seed"]))
    pfts = [_torch_pft(params, r) for r in range(N)]
    before = rbd_schedule_before(
        pfts, placement, topo, 64, [alltoall._rank_generator(r) for r in range(N)]
    )
    now = rbd.rbd_schedule(
        pfts, placement, topo, 64, [alltoall._rank_generator(r) for r in range(N)]
    )
    twin = rbd.rbd_schedule(
        [alltoall._rank_routing(params, r) for r in range(N)],
        placement,
        topo,
        64,
        [TorchCPUGenerator(alltoall._rank_generator_seed(r)) for r in range(N)],
    )
    return before, now, twin


@pytest.mark.parametrize("case", range(6))
def test_rbd_schedule_from_numpy_routing_equals_the_torch_one(case):
    rng = random.Random(10 + case)
    experts = rng.choice([8, 16, 32])
    params = _point(
        tokens=rng.choice([1, 16, 40]),
        hidden=2,
        experts=experts,
        top_k=rng.randint(1, 4),
        seed=rng.randint(0, 9),
        placement=rng.choice(["contiguous", "strided", "random"]),
    )
    before, now, twin = _schedules(params, rng.choice([1, 2, 3]), rng.choice([1, 2, 4]))
    assert before == now == twin


@pytest.mark.parametrize("nodes", [9, 16])
def test_rbd_default_point_messages_equal_the_torch_ones(nodes):
    # `repro bench alltoall --nodes N` at its defaults: 8 GPUs per node on dgx-h100
    before, now, twin = _schedules(_point(), nodes, 8)
    assert len(before) > 1000 and before == now == twin


def test_random_placement_equals_torchs():
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        assert (
            alltoall._placement("random", 37, 12, seed)
            == torch.randint(0, 12, (37,), generator=g).tolist()
        )


def test_simulated_rbd_grid_imports_no_torch():
    code = (
        "import sys; from moe_repro.suites import alltoall as a\n"
        "p = {**{k: v[0] for k, v in a.SUITE.params.items()}, 'nodes': 3, 'algo': 'rbd', 'platform': 'dgx-h100'}\n"
        "a.simulate({**p, **a.derived_params(p)})\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr
