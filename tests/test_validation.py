"""repro validate: the published points, the derived measurements and the command."""

import json

import pytest
from click.testing import CliRunner

from moe_repro.cli import cli
from moe_repro.reproductions import validation as V


def _points(predictor):
    return [
        p
        for p in V.load_points()["points"]
        if p["predictor"] == predictor and p["role"] == "scored"
    ]


def test_enough_points_per_predictor_each_with_its_source():
    assert len(_points("step-time")) >= 10
    assert len(_points("memory")) >= 10
    assert len(_points("alltoall-bandwidth")) >= 6
    for p in V.load_points()["points"]:
        pub = p["published"]
        for key in ("paper", "source", "row", "column", "printed", "unit", "hardware", "url"):
            assert pub.get(key), (p["id"], key)
        assert V.published_value(p) > 0


def test_every_parameter_says_where_it_comes_from():
    doc = V.load_points()
    assert doc["parameters"]
    for par in doc["parameters"]:
        assert par["role"] and par["source"]
        assert "scored" not in par["role"] or "not scored" in par["role"]


def test_measured_step_time_agrees_with_the_papers_training_time_estimate():
    # Narayanan et al. Sec. 5.1: the 1T model on 3072 GPUs at 163 teraFLOP/s needs 84 days for
    # 450B tokens (Eq. 4, an approximation of Eq. 3 within a few percent).
    p = next(x for x in _points("step-time") if x["id"] == "narayanan21-t1-1008.0b")
    steps = 450e9 / (p["layout"]["global_batch"] * p["model"]["seq"])
    days = V.measured_step_time(p) * steps / 86400
    assert days == pytest.approx(84, rel=0.04)


def test_simulated_nvlink_bandwidth_is_the_links_rate_for_large_messages():
    p = next(x for x in _points("alltoall-bandwidth") if x["id"] == "deepep-combine-ep8")
    bw, _ = V.predict_alltoall_bandwidth(p)
    # H800 NVLink, 400 GB/s bidirectional: 200 GB/s each way x 0.8 moved by an application
    assert bw == pytest.approx(160.0, rel=0.01)


def test_errors_and_summary_follow_their_definitions():
    a = V.Scored("a", "memory", 80.0, 88.0, "GiB", "s", "analytic")
    b = V.Scored("b", "memory", 50.0, 40.0, "GiB", "s", "analytic")
    c = V.Scored("c", "memory", 50.0, None, "GiB", "s", "analytic")
    s = V.summarise("memory", [a, b, c])
    assert (s.points, s.predicted) == (3, 2)
    assert s.mape == pytest.approx((0.1 + 0.2) / 2)
    assert (s.max_abs_error, s.worst) == (pytest.approx(0.2), "b")


def test_validate_command_prints_each_predictor_and_writes_json(tmp_path):
    out = tmp_path / "v.json"
    r = CliRunner().invoke(cli, ["validate", "--json", str(out)])
    assert r.exit_code == 0, r.output
    for name in (
        "step-time",
        "memory",
        "alltoall-bandwidth",
        "MAPE",
        "narayanan21-t1-1.7b",
        "Calculon",
    ):
        assert name in r.output
    doc = json.loads(out.read_text())
    assert {s["predictor"] for s in doc["summaries"]} == {
        "step-time",
        "memory",
        "alltoall-bandwidth",
        "gemm-time",
        "attention-core",
    }
    assert len(doc["points"]) == sum(s["points"] for s in doc["summaries"])


def test_validate_refuses_an_unknown_predictor():
    r = CliRunner().invoke(cli, ["validate", "--predictor", "nope"])
    assert r.exit_code == 2


def test_validation_page_from_the_stored_result(tmp_path):
    from moe_repro.records.store import ResultsStore
    from moe_repro.reports.validation_page import write_validation_page

    store = ResultsStore(tmp_path / "results")
    site = tmp_path / "site"
    site.mkdir()
    page = write_validation_page(store, site).read_text()
    assert "Not yet run" in page
    r = CliRunner().invoke(
        cli, ["--results", str(store.root), "validate", "--predictor", "alltoall-bandwidth"]
    )
    assert r.exit_code == 0, r.output
    page = write_validation_page(store, site).read_text()
    assert "Not yet run" not in page and "deepep-dispatch-ep8" in page and "Calculon" in page
    assert (site / "validation-alltoall-bandwidth.png").stat().st_size > 0
    doc = json.loads((store.root / "validation" / "validation.json").read_text())
    assert page.count("<tr>") >= 1 + len(doc["points"])  # the summary row and one row per point
    # what the data file leaves out on purpose is on the page with its reason, as in the CLI's output
    assert doc["unscored"] and "Published measurements left unscored" in page
    for u in doc["unscored"]:
        assert u["what"].split(" (")[0] in page
    assert "left unscored, and why" in r.output and doc["unscored"][-1]["what"] in r.output


def test_gemm_time_points_are_the_graph_replayed_measurements_less_the_ceilings_shape():
    """gemm-time scores the H200 GEMMs replayed from CUDA graphs; the shape the h200 profile's
    ceiling was measured at is a parameter, not a scored point; a prediction is the roofline of
    the profile's numbers, checked here by hand for one compute-bound shape."""
    import math

    from moe_repro.components.network.platform import load_builtin

    pts = V.gemm_points()
    assert pts and all(p["predictor"] == "gemm-time" for p in pts)
    assert all("graph" in p["published"]["source"] for p in pts)
    ceiling = [p for p in pts if p["gemm"] == {"rows": 8192, "k": 8192, "n": 8192}]
    assert ceiling and all(p["role"] == "parameter" for p in ceiling)
    assert all(p["role"] == "scored" for p in pts if p not in ceiling)
    assert len({p["id"] for p in pts}) == len(pts)
    # 16384 x 4096 x 4096 on 132 SMs: 256x128 tiles make 64 x 32 = 2048 tiles = 15.5 waves -> 16
    # (2048 / 2112 = 0.970); 128x64 tiles 8192 -> 63 waves (0.985); 64x64 tiles 16384 = 124.1
    # waves -> 125 (16384 / 16500 = 0.993), the least waste, which the model takes
    p = load_builtin("h200")
    (pt,) = [x for x in pts if x["id"] == "h200-curve-16384x4096x4096"]
    t, _ = V.predict_gemm_time(pt)
    eff = 16384 / (125 * 132)
    assert t == pytest.approx(2 * 16384 * 4096 * 4096 / (686e12 * eff), rel=1e-9)
    assert 2 * (16384 * 4096 + 4096 * 4096 + 16384 * 4096) / 4259e9 < t  # compute-bound, as assumed
    assert math.isclose(p.gemm_flops, 686e12)


def test_the_cli_offers_exactly_the_predictors_the_module_scores():
    """validate_cmd keeps its own copy (importing the module at start-up costs the records
    schema); the two must not drift apart."""
    from moe_repro.cli import validate_cmd

    assert validate_cmd._PREDICTORS == V.PREDICTORS


def test_step_time_points_run_the_configuration_their_launch_scripts_state():
    # Each step-time point's micro-batch size and virtual stages come from the authors' published
    # scripts (configuration_source); the planner must time exactly that, not its own fastest pick.
    for p in _points("step-time"):
        lay = p["layout"]
        assert "micro_batch" in lay and "vpp" in lay and lay["configuration_source"], p["id"]
        best = V._plan(p)[2].best
        assert (best.micro_batch, best.vpp) == (lay["micro_batch"], lay["vpp"]), p["id"]
        assert best.tp == lay["tp"] and best.pp == lay["pp"]


def test_attention_core_points_pair_each_qk_with_its_av_and_time_materialised_scores():
    """attention-core: one point per (batch, d) of the measured batched products, QK^T
    [2048 x d] @ [d x 2048] plus AV [2048 x 2048] @ [2048 x d]; the prediction is the roofline of
    the h200 profile's attention rate and the scores' HBM traffic (written once, read once, 2 B
    each), worked by hand for the d = 96 pair (HBM-bound) and a d = 128 one (FLOP-bound)."""
    import json
    from importlib import resources

    pts = V.attention_points()
    run = json.loads(
        resources.files("moe_repro.reproductions")
        .joinpath("measured", "h200-layer-gemms-graph-2026-11-26.json")
        .read_text()
    )["hot"]
    products = [m for m in run["points"] if "batch" in m]
    assert len(pts) * 2 == len(products) and len({p["id"] for p in pts}) == len(pts)
    for p in pts:
        a = p["attention"]
        qk = next(
            m for m in products if (m["batch"], m["k"], m["n"]) == (a["batch"], a["d"], a["keys"])
        )
        av = next(
            m for m in products if (m["batch"], m["k"], m["n"]) == (a["batch"], a["keys"], a["d"])
        )
        assert V.published_value(p) == pytest.approx(qk["median_s"] + av["median_s"])
    gpu = json.loads(
        resources.files("moe_repro.components.network")
        .joinpath("platforms", "h200.json")
        .read_text()
    )["gpu"]
    rate, hbm = gpu["achievable_attention_tflops"] * 1e12, gpu["achievable_hbm_GBps"] * 1e9
    (p96,) = [p for p in pts if p["attention"]["batch"] == 128]
    scores = 128 * 2048 * 2048
    assert V.predict_attention_core(p96)[0] == pytest.approx(2 * 2 * scores / hbm, rel=1e-9)
    (p128,) = [p for p in pts if p["attention"]["batch"] == 64]
    assert V.predict_attention_core(p128)[0] == pytest.approx(
        2 * 64 * 2048 * 2048 * 256 / rate, rel=1e-9
    )


def test_every_predictor_named_is_one_score_point_knows():
    assert set(V._PREDICT) == set(V.PREDICTORS) == set(V.UNITS)


def test_no_scored_step_time_point_shares_the_calibration_layers_shape():
    # dgx-a100's layer kernel-time factor comes from Korthikanti Table 4's 22B layer; a point made
    # of that layer (Table 5's 22B rows) would score the calibration, so it must not be scored,
    # and the data file must say why.
    from moe_repro.components.network.platform import load_builtin
    from moe_repro.components.resources import time_model as T

    cal = T.calibration_layer(load_builtin("dgx-a100"))
    for p in _points("step-time"):
        if p["platform"] == "dgx-a100":
            assert (p["model"]["hidden"], p["model"]["heads"]) != (cal["hidden"], cal["heads"]), p[
                "id"
            ]
    assert any(
        "22B" in u["what"] and "calibration" in u["why"] for u in V.load_points()["unscored"]
    )
    assert any("calibration.layer_forward" in par["name"] for par in V.load_points()["parameters"])


def test_korthikanti_points_run_the_techniques_their_column_names():
    # Table 5: 'Present Work' = sequence parallelism + selective recompute, 'Full Recompute' = full
    # recompute without SP; the printed number is the iteration time itself.
    pts = [p for p in _points("step-time") if p["id"].startswith("korthikanti22")]
    assert len(pts) == 6
    for p in pts:
        lay = p["layout"]
        present = "Present Work" in p["published"]["column"]
        assert (lay["recompute"], lay["sp"]) == (
            ("selective", True) if present else ("full", False)
        )
        assert V.measured_step_time(p) == V.published_value(p)
        best = V._plan(p)[2].best
        assert best.sp == lay["sp"] and best.recompute == lay["recompute"]
    # the older Narayanan runs predate the asynchronous TP all-reduce; Korthikanti's overlap it
    assert all(
        p["layout"]["overlap_tp"] is False
        for p in _points("step-time")
        if p["id"].startswith("narayanan21")
    )
    assert all(p["layout"]["overlap_tp"] is True for p in pts)
