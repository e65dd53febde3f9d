"""The EP libraries' unit definitions (components/network/ep_units.py): routing expectations
against direct enumeration, the converter's round trip, and each definition against the pairs
of numbers one published row prints together (a bandwidth and its latency)."""

import json
import pathlib
from itertools import combinations

import pytest

from moe_repro.components.network import ep_units as U

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_hit_probability_matches_enumeration():
    # 8 experts over 4 ranks on 2 nodes, top-2: every expert pair equally likely
    r = U.Routing(ep=4, gpus_per_node=2, tokens=1, top_k=2, experts=8)
    pairs = list(combinations(range(8), 2))
    rank0 = sum(any(e // 2 == 0 for e in p) for p in pairs) / len(pairs)
    node0 = sum(any(e // 4 == 0 for e in p) for p in pairs) / len(pairs)
    assert U.hit_probability(r, "rank") == pytest.approx(rank0)
    assert U.hit_probability(r, "node") == pytest.approx(node0)


def test_node_limit_binds_only_below_the_node_count():
    free = U.Routing(64, 8, 4096, 8, 256, None)
    limited = U.Routing(64, 8, 4096, 8, 256, 4)
    loose = U.Routing(32, 8, 4096, 8, 256, 4)  # 4 nodes, limit 4: no constraint
    assert U.hit_probability(limited, "node") < U.hit_probability(free, "node")
    assert U.hit_probability(loose, "node") == U.hit_probability(
        U.Routing(32, 8, 4096, 8, 256), "node"
    )
    # a limited token reaches at most `limit` nodes
    assert limited.nodes * U.hit_probability(limited, "node") <= 4


@pytest.mark.parametrize("key", sorted(U.DEFINITIONS))
def test_round_trip(key):
    r = U.Routing(32, 8, 4096, 8, 256, 4)
    t = U.to_time(key, 57.0, r, 7168, "bf16")
    assert U.to_printed(key, t, r, 7168, "bf16") == pytest.approx(57.0)


def test_bad_inputs_refused():
    r = U.Routing(16, 8, 128, 8, 256)
    with pytest.raises(ValueError):
        U.to_printed("deepep-v1-rdma", 0.0, r, 7168, "fp8")
    with pytest.raises(ValueError):
        U.row_bytes("v1", 7168, "fp16", 8)
    with pytest.raises(ValueError):
        U.Routing(12, 8, 128, 8, 256)  # not whole nodes


def _cells():
    doc = json.loads((ROOT / "reproductions" / "ep_validation_points.json").read_text())
    return [c for c in doc["cells"] if "also_printed" in c["published"]]


@pytest.mark.parametrize("cell", _cells(), ids=lambda c: c["id"])
def test_definitions_reproduce_each_rows_other_printed_number(cell):
    """Where a row prints a bandwidth and a latency, the definition turns one into the other
    within the rounding of the printed figures (and the routing expectation); a row the data
    marks inconsistent (``also_printed.consistent`` false) must really be off by more."""
    from moe_repro.reproductions.validation import ep_routing

    s, pub = cell["settings"], cell["published"]
    r = ep_routing(cell)
    also = pub["also_printed"]
    if pub["unit"] == "us":  # latency scored, bandwidth beside it
        t = pub["printed"] * 1e-6
        got = U.to_printed(also["definition"], t, r, s["hidden"], s["dtype"])
        agrees = got == pytest.approx(also["printed"], rel=0.04, abs=1.0)
    else:  # bandwidth scored, kernel time beside it
        t = U.to_time(pub["definition"], pub["printed"], r, s["hidden"], s["dtype"])
        agrees = t * 1e6 == pytest.approx(also["printed"], rel=0.04)
    assert agrees == also.get("consistent", True)
