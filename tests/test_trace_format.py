"""The routing-trace format: bit-exact round trip, readable without this project, and every
kind of damage refused with a one-line TraceError."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from moe_repro.components.balance.trace_format import (
    TraceError,
    load_trace,
    save_trace,
    verify_trace,
)
from moe_repro.components.balance.workloads import get_workload


@pytest.mark.parametrize("name", ["ragged-source", "rotating-hotspot", "olmoe-layers", "synthetic"])
def test_round_trip_is_bit_exact(tmp_path, name):
    w = get_workload(name, tokens=256)
    manifest = save_trace(tmp_path / "t", w, seed=7, steps=3)
    _, routings = load_trace(tmp_path / "t")
    assert len(routings) == w.num_layers and all(len(row) == 3 for row in routings)
    for layer, row in enumerate(routings):
        for step, got in enumerate(row):
            want = w.routing(7, step, layer=layer)
            assert torch.equal(got.expert_ids, want.expert_ids)
            assert got.gates.numpy().tobytes() == want.gates.numpy().tobytes()
            if want.source_position is None:
                assert got.source_position is None
            else:
                assert (
                    got.source_position.numpy().tobytes() == want.source_position.numpy().tobytes()
                )
    assert verify_trace(tmp_path / "t")["generator"] == manifest["generator"]


def test_a_reader_needs_only_the_manifest(tmp_path):
    """numpy alone, from dtype and shape, and sha256 of the raw file as the manifest says."""
    w = get_workload("hot-set")
    save_trace(tmp_path / "t", w, seed=1, steps=1)
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    entry = manifest["tensors"]["L0_S0.expert_ids"]
    raw = (tmp_path / "t" / entry["file"]).read_bytes()
    assert hashlib.sha256(raw).hexdigest() == entry["sha256"]
    ids = np.frombuffer(raw, dtype="<i8").reshape(entry["shape"])
    assert ids.tolist() == w.routing(1, 0).expert_ids.tolist()
    assert manifest["generator"]["workload"] == "hot-set" and manifest["seed"] == 1


def _rewrite(tmp_path, key, array):
    """Replace one tensor's file and fix its sha256, so only the routing rule can catch it."""
    d = tmp_path / "t"
    manifest = json.loads((d / "manifest.json").read_text())
    data = array.tobytes()
    (d / manifest["tensors"][key]["file"]).write_bytes(data)
    manifest["tensors"][key]["sha256"] = hashlib.sha256(data).hexdigest()
    (d / "manifest.json").write_text(json.dumps(manifest))


def test_damage_is_refused(tmp_path):
    w = get_workload("spread")
    save_trace(tmp_path / "t", w, seed=0, steps=2)
    d = tmp_path / "t"
    ids = w.routing(0, 1).expert_ids.numpy().copy()
    gates = w.routing(0, 1).gates.numpy().copy()

    f = d / "tensors" / "L0_S1.expert_ids.bin"
    good = f.read_bytes()
    f.write_bytes(good[:-8] + bytes(8))
    with pytest.raises(TraceError, match="sha256"):
        load_trace(d)
    f.write_bytes(good)

    twice = ids.copy()
    twice[0, 1] = twice[0, 0]
    _rewrite(tmp_path, "L0_S1.expert_ids", twice)
    with pytest.raises(TraceError, match="same expert twice"):
        load_trace(d)
    out_of_range = ids.copy()
    out_of_range[3, 0] = 8
    _rewrite(tmp_path, "L0_S1.expert_ids", out_of_range)
    with pytest.raises(TraceError, match="outside"):
        load_trace(d)
    _rewrite(tmp_path, "L0_S1.expert_ids", ids)
    _rewrite(tmp_path, "L0_S1.gates", gates * 2)
    with pytest.raises(TraceError, match="sum to 1"):
        load_trace(d)
    # a valid routing that is not what the generator makes: load passes, verify refuses
    _rewrite(tmp_path, "L0_S1.gates", gates[:, ::-1].copy())
    load_trace(d)
    with pytest.raises(TraceError, match="differs from a fresh"):
        verify_trace(d)
    (d / "tensors" / "L0_S0.gates.bin").unlink()
    with pytest.raises(TraceError, match="missing file"):
        load_trace(d)
    (d / "manifest.json").write_text("{")
    with pytest.raises(TraceError, match="not JSON"):
        load_trace(d)


def test_an_existing_trace_is_kept_unless_asked(tmp_path):
    w = get_workload("burst")
    save_trace(tmp_path / "t", w, seed=0, steps=1)
    with pytest.raises(FileExistsError):
        save_trace(tmp_path / "t", w, seed=1, steps=1)
    save_trace(tmp_path / "t", w, seed=1, steps=2, overwrite=True)
    assert verify_trace(tmp_path / "t")["steps"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["t"]  # no temporary left behind
