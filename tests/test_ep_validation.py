"""The EP validation set (reproductions/ep_validation_points.json) and its scoring by the
simulator's EP kernel model (repro validate's EP section)."""

import json
import pathlib

import pytest

from moe_repro.components.network.ep_units import DEFINITIONS, Routing, row_bytes
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.network.simulator import ep_kernel_messages, simulate_ep_kernel

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = json.loads((ROOT / "reproductions" / "ep_validation_points.json").read_text())
SCORED = [c for c in DOC["cells"] if c["role"] == "scored"]


def test_set_covers_the_issue():
    assert len(SCORED) >= 40
    assert len({c["library"] for c in SCORED}) >= 4
    assert len({c["platform"] for c in SCORED}) >= 2
    for key in ("regime", "scope"):
        assert len({c[key] for c in SCORED}) == 2, key
    assert all(c["regime"] == "latency" for c in SCORED if c["settings"]["tokens_per_rank"] <= 256)


@pytest.mark.parametrize("cell", DOC["cells"], ids=lambda c: c["id"])
def test_every_cell_has_source_settings_and_unit(cell):
    pub = cell["published"]
    for k in ("repository", "commit", "file", "section", "row", "column", "hardware", "unit"):
        assert pub.get(k), k
    assert len(pub["commit"]) == 40
    assert pub["definition"] in DEFINITIONS
    assert float(pub["printed"]) > 0
    s = cell["settings"]
    for k in ("ep", "tokens_per_rank", "hidden", "top_k", "experts", "dtype", "settings_source"):
        assert k in s, k
    load_builtin(cell["platform"])
    assert cell["role"] == "scored" or cell.get("why_unscored")


def test_normal_kernel_sends_once_per_node():
    """Node-deduplicated: the bytes crossing the network equal the distinct-node rows, and the
    same routing's low-latency kernel (one message per selection) sends more across nodes."""
    r = Routing(32, 8, 4096, 8, 256, 4)
    msgs, deps = ep_kernel_messages(r, "normal", 1.0)
    rdma = sum(b for ph, s, d, b in msgs if ph == "rdma" and s == 0)
    assert deps == {"rdma": [], "nvl": []}
    from moe_repro.components.network.ep_units import expected_rows

    assert rdma == pytest.approx(3 * expected_rows(r, "node"))
    ll, _ = ep_kernel_messages(r, "low_latency", 1.0)
    ll_remote = sum(b for _, s, d, b in ll if s == 0 and d // 8 != 0)
    assert ll_remote > rdma


def test_node_limit_lowers_the_network_load():
    p = load_builtin("h800")
    rb = row_bytes("v1", 7168, "fp8", 8)
    limited = simulate_ep_kernel(p, Routing(64, 8, 4096, 8, 256, 4), "normal", rb)
    free = simulate_ep_kernel(p, Routing(64, 8, 4096, 8, 256, None), "normal", rb)
    assert limited.time_s < free.time_s
    assert limited.simulated and "EP normal kernel" in limited.assumptions[0]


def test_scoring_runs_and_can_fail():
    """The EP scoring reports per-regime and per-library errors with leave-one-library-out
    beside them, and a wrong published number shows up as a large error."""
    from moe_repro.reproductions.validation import score_ep

    doc = {"cells": [c for c in DOC["cells"] if c["id"].startswith("deepep-v1-normal")]}
    out = score_ep(doc)
    assert set(out["groups"]) >= {"all", "bandwidth", "DeepEP V1 / bandwidth"}
    assert len(out["held_out"]) == len(out["scored"]) == 8
    good = out["groups"]["all"].median
    bad_doc = json.loads(json.dumps(doc))
    for c in bad_doc["cells"]:
        c["published"]["printed"] = float(c["published"]["printed"]) * 10
    bad = score_ep(bad_doc)["groups"]["all"].median
    assert bad > 0.8 > good


def test_leave_one_library_out_uses_the_fit():
    """A fit that changes the platform for held-out libraries changes their errors: the
    held-out column is computed, not copied."""
    from moe_repro.components.network.platform import from_dict
    from moe_repro.reproductions.validation import score_ep

    cells = [
        c
        for c in DOC["cells"]
        if c["id"] in ("deepep-v1-normal-dispatch-ep64", "hybrid-ep-kernel-dispatch-bf16-ep64-sm16")
    ]

    def fit(train):
        if all(c["library"] == "Hybrid-EP" for c in train):  # DeepEP held out: a slower NIC
            doc = json.loads(json.dumps(load_builtin("h800").raw))
            doc["ep_kernels"]["nic_GBps"] /= 2
            return {"h800": from_dict(doc)}
        return {}

    out = score_ep({"cells": cells}, fit=fit)
    ins = {x.point_id: x.predicted for x in out["scored"]}
    held = {x.point_id: x.predicted for x in out["held_out"]}
    assert held["deepep-v1-normal-dispatch-ep64"] < ins["deepep-v1-normal-dispatch-ep64"]
    assert (
        held["hybrid-ep-kernel-dispatch-bf16-ep64-sm16"]
        == ins["hybrid-ep-kernel-dispatch-bf16-ep64-sm16"]
    )


def test_validate_prints_the_ep_set_and_the_page_shows_it_per_library(tmp_path):
    from click.testing import CliRunner

    from moe_repro.cli import cli
    from moe_repro.records.store import ResultsStore
    from moe_repro.reports.validation_page import write_validation_page

    store = ResultsStore(tmp_path / "results")
    args = ["--results", str(store.root), "validate", "--predictor", "memory", "--ep-set"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    for word in ("EP dispatch/combine set", "LOLO median", "bandwidth", "latency", "UCCL-EP"):
        assert word in r.output
    doc = json.loads((store.root / "validation" / "validation.json").read_text())
    assert len(doc["ep"]["cells"]) == len(SCORED) == len(doc["ep"]["held_out"])
    site = tmp_path / "site"
    site.mkdir()
    page = write_validation_page(store, site).read_text()
    for lib in {c["library"] for c in SCORED}:
        assert f"EP {lib} (" in page
    assert "deepep-v1-ll-combine-ep256" in page
    # without --ep-set, a --predictor run leaves the EP set out
    r = CliRunner().invoke(cli, ["validate", "--predictor", "memory"])
    assert r.exit_code == 0 and "EP dispatch/combine set" not in r.output


def test_every_model_parameter_says_where_it_comes_from():
    assert DOC["parameters"]
    for p in DOC["parameters"]:
        assert p["name"] and p["value"] and p["role"] and p["source"]
        # no constant comes from a cell: each names a specification, a statement, an
        # assumption or says it is not modelled
        words = ("specification", "statement", "assumption", "not modelled", "definition", "own")
        words += ("micro-benchmark, not a scored cell",)
        assert any(w in p["role"] for w in words), p["name"]


def test_ep_kernel_rates_come_from_the_profile_section_only_for_ep_kernels():
    """ep_kernels replaces the NIC and NVLink rates for the EP kernel model and nothing else:
    the profile itself (what repro bench alltoall and the other predictors read) keeps its line
    rates."""
    from moe_repro.components.network.simulator import ep_kernel_platform

    p = load_builtin("dgx-h100")
    q = ep_kernel_platform(p)
    assert p.nic_bytes_per_s == 50e9 and q.nic_bytes_per_s == 47e9
    assert q.raw["node"]["intra_node"]["GBps_per_gpu"] == 310 and q.nvlink_efficiency == 1.0
    assert p.raw["network"]["window"] == 32 and q.raw["network"]["window"] == 0
    rb = row_bytes("v1", 7168, "bf16", 8)
    r = Routing(32, 8, 4096, 8, 256, 4)
    slower = simulate_ep_kernel(p, r, "normal", rb).time_s
    doc = json.loads(json.dumps(p.raw))
    doc.pop("ep_kernels")
    from moe_repro.components.network.platform import from_dict

    assert simulate_ep_kernel(from_dict(doc), r, "normal", rb).time_s < slower


def test_every_nvlink_4_profile_runs_its_ep_kernels_at_one_put_efficiency():
    """One rule for the EP kernels' NVLink rate on NVLink 4 (H100, H200, H800): the line rate
    times the put efficiency the NVSHMEM micro-benchmark measured on H100/H200 (dgx-h100's
    ep_kernels.nvlink_GBps over its line rate), whatever the number of links."""
    measured = load_builtin("dgx-h100")
    line = measured.raw["node"]["intra_node"]["GBps_per_gpu"]
    efficiency = measured.raw["ep_kernels"]["nvlink_GBps"] / line
    assert 0.5 < efficiency < 0.8  # a put reaches less than NCCL's 80% application rate
    for name in ("dgx-h100", "p5en", "h800"):
        p = load_builtin(name)
        rate = p.raw["node"]["intra_node"]["GBps_per_gpu"] * efficiency
        assert p.raw["ep_kernels"]["nvlink_GBps"] == pytest.approx(rate, rel=1e-3), name


def test_put_latency_and_message_rate_come_from_the_profile_section():
    """ep_kernels.put_latency_us replaces the links' latencies for the EP kernels; the EFA
    message rate caps the NIC for one-row messages only, and reproduces the benchmark it comes
    from (9.930 GB/s at 8 KB messages, UCCL-EP efa_alltoall_results.md)."""
    from moe_repro.components.network.simulator import ep_kernel_platform, ep_nic_rate_GBps

    h = load_builtin("h800")
    q = ep_kernel_platform(h)
    lat = {lk["class"]: lk["latency_us"] for lk in q.raw["links"]}
    assert lat["intra_node"] == 1.5 and lat["nic_injection"] == lat["inter_group"] == 7.0
    assert {lk["latency_us"] for lk in h.raw["links"]} == {2.0, 3.0, 4.0}  # profile untouched
    assert ep_nic_rate_GBps(h, 8192) == 47.0  # no message rate on ConnectX-7: put rate only

    p5 = load_builtin("p5en")
    assert ep_nic_rate_GBps(p5) is None  # no large-message put rate on EFA
    assert abs(ep_nic_rate_GBps(p5, 8192) - 9.930) < 0.01
    assert ep_kernel_platform(p5, 8192).nic_bytes_per_s < ep_kernel_platform(p5).nic_bytes_per_s


def test_efa_message_rate_binds_the_low_latency_kernel_only():
    """On p5en the low-latency kernel's off-node rows (one message each) take at least
    messages / rate; the normal kernel (chunked messages) does not see the message rate."""
    p5 = load_builtin("p5en")
    doc = json.loads(json.dumps(p5.raw))
    doc["ep_kernels"].pop("nic_message_rate_Mps")
    from moe_repro.components.network.platform import from_dict

    uncapped = from_dict(doc)
    r = Routing(32, 8, 128, 8, 288, None)
    rb = row_bytes("ll", 7168, "fp8", 8)
    ll = simulate_ep_kernel(p5, r, "low_latency", rb).time_s
    off_node_messages = 128 * 8 * (32 - 8) / 32
    assert ll >= off_node_messages / 1.212e6
    assert ll > 2 * simulate_ep_kernel(uncapped, r, "low_latency", rb).time_s
    rn = Routing(32, 8, 4096, 8, 256, 4)
    rbn = row_bytes("v1", 7168, "bf16", 8)
    normal = simulate_ep_kernel(p5, rn, "normal", rbn).time_s
    assert normal == simulate_ep_kernel(uncapped, rn, "normal", rbn).time_s
