"""The memory validation set (validation_points.json, predictor "memory") and its scoring per
measured kind and model family."""

import copy

import pytest

from moe_repro.reproductions import validation as V

KINDS = {"max allocated", "max reserved", "device used"}


def _memory_points(doc=None):
    doc = doc or V.load_points()
    return [p for p in doc["points"] if p["predictor"] == "memory" and p["role"] == "scored"]


def _organisation(p):
    return p["published"]["paper"].split(",")[0]


def test_the_set_has_enough_points_sources_and_moe_layouts():
    pts = _memory_points()
    ids = [p["id"] for p in pts]
    assert len(ids) == len(set(ids)), "duplicate ids"
    assert len(pts) >= 20
    assert len({_organisation(p) for p in pts}) >= 3
    moe = [p for p in pts if V._model(p["model"]).n_moe_layers]
    assert len(moe) >= 8
    # MoE layouts with expert parallelism, expert TP and a shared expert are among them
    assert any((p["layout"].get("ep") or 1) > 1 for p in moe)
    assert any((p["layout"].get("etp") or 1) > 1 for p in moe)


def test_every_point_says_what_was_measured_where_and_on_which_layout():
    for p in _memory_points():
        assert p["measured_kind"] in KINDS, p["id"]
        assert p.get("measured_kind_source") or p["measured_kind"] == "max reserved", p["id"]
        assert p["published"]["url"].startswith("https://"), p["id"]
        lay = p["layout"]
        for key in ("gpus", "tp", "pp", "recompute", "precision", "zero"):
            assert key in lay, (p["id"], key)
        assert lay["gpus"] % (lay["tp"] * lay["pp"] * (lay.get("cp") or 1)) == 0, p["id"]
        assert p["model"]["seq"] > 0


def _planted_doc():
    """Two copies of one real point whose measured value is set from its own prediction: one
    measured exactly (error 0) as max allocated, one at half (error +100%) as max reserved, each
    against its own kind's prediction."""
    doc = V.load_points()
    base = next(p for p in _memory_points(doc) if p["id"] == "torchtitan24-1-8gpu-fsdp")
    exact, half = copy.deepcopy(base), copy.deepcopy(base)
    exact.update(id="planted-exact", measured_kind="max allocated")
    exact["published"]["printed"] = repr(V.predict_memory(exact)[0])
    half.update(id="planted-half", measured_kind="max reserved")
    predicted, _ = V.predict_memory(half)
    half["published"]["printed"] = repr(predicted / 2)
    doc["points"] = [exact, half]
    return doc, predicted


def test_per_kind_and_overall_mape_are_computed_from_the_points():
    doc, predicted = _planted_doc()
    (s,) = V.validate(("memory",), doc)
    assert (s.points, s.predicted) == (2, 2)
    assert s.mape == pytest.approx(0.5)  # (0 + 100%) / 2
    groups = {g: (n, k, m, x) for g, n, k, m, x in s.groups}
    assert groups["measured as max allocated"] == (1, 1, pytest.approx(0.0), pytest.approx(0.0))
    assert groups["measured as max reserved"] == (1, 1, pytest.approx(1.0), pytest.approx(1.0))
    assert groups["dense"][:3] == (2, 2, pytest.approx(0.5))
    assert "MoE" not in groups
    assert "max allocated" in s.predicts and "max reserved" in s.predicts
    row = {x.point_id: x.to_dict() for x in s.scored}["planted-half"]
    assert row["measured_kind"] == "max reserved" and row["family"] == "dense"
    assert row["predicted"] == pytest.approx(predicted)


def test_each_point_is_predicted_as_the_kind_its_source_measured():
    from moe_repro.components.resources import memory_model as MM

    base = next(p for p in _memory_points() if p["id"].startswith("megatron-ci-gpt3-7b-tp4"))
    by_kind = {}
    for measured, kind in (("max allocated", "allocated"), ("max reserved", "reserved")):
        p = copy.deepcopy(base)
        p["measured_kind"] = measured
        value, note = V.predict_memory(p)
        assert note.startswith(kind + ":"), note
        by_kind[kind] = value
    # reserved adds the allocator's segment rounding to what allocated counts
    assert by_kind["reserved"] > by_kind["allocated"]
    # the kinds drop the profile's unsourced framework overhead: the live tensors (no kind, no
    # overhead) plus the sourced terms, and nothing else
    m, p, pl = V._plan(base)
    c = pl.best or pl.candidates[0]
    live = MM.per_gpu_memory(
        m,
        p,
        MM.MemoryLayout(
            tp=c.tp,
            pp=c.pp,
            cp=c.cp,
            dp=c.dp,
            sp=c.sp,
            vpp=c.vpp,
            ep=c.ep,
            etp=c.etp,
            micro_batch=c.micro_batch,
            micro_batches=c.micro_batches,
        ),
        base["model"]["seq"],
        kind="allocated",
        zero=c.zero,
        recompute=V._recompute_mode(c),
        precision=base["layout"]["precision"],
        flash_attention=base["layout"]["flash_attention"],
        settings=None,
    )
    assert p.overhead_bytes > 0  # the profile has one, and the kind path leaves it out
    assert live.buffers < p.overhead_bytes
    extras = sum(b for _, b in live.extras)
    assert by_kind["allocated"] * V.GiB == pytest.approx(sum(live.terms().values()) + extras)


def test_a_points_framework_settings_come_from_the_data_file():
    doc = V.load_points()
    tt = next(p for p in _memory_points(doc) if p["id"] == "torchtitan24-1-8gpu-fsdp")
    mc = next(p for p in _memory_points(doc) if p["id"].startswith("megatron-ci"))
    assert V.memory_settings(tt, doc)["expandable_segments"] is True
    assert V.memory_settings(tt, doc)["optimizer"] == "foreach"  # the point's own override
    assert V.memory_settings(mc, doc)["framework"] == "megatron"
    for name, entry in doc["memory_settings"].items():
        assert entry["source"], name
    # without expandable segments the reserve adds the largest transient's segment
    frag = copy.deepcopy(tt)
    frag["settings"] = {**tt["settings"], "expandable_segments": False}
    assert V.predict_memory(frag)[0] > V.predict_memory(tt)[0]


def test_a_point_the_planner_cannot_predict_is_shown_not_dropped():
    doc, _ = _planted_doc()
    bad = doc["points"][0]
    bad["layout"]["gpus"] = 12  # not whole nodes of the platform
    (s,) = V.validate(("memory",), doc)
    assert (s.points, s.predicted) == (2, 1)
    (row,) = [x for x in s.scored if x.point_id == "planted-exact"]
    assert row.predicted is None and row.note.startswith("no prediction:")


def test_every_moe_point_gets_a_number_from_the_planner():
    for p in _memory_points():
        if V._model(p["model"]).n_moe_layers:
            value, note = V.predict_memory(p)
            assert value is not None and value > 0, (p["id"], note)


def test_megatron_test_models_are_built_from_their_launch_arguments():
    from moe_repro.components.model.params import param_counts

    p = next(
        x for x in _memory_points() if x["id"].endswith("ep8-resume-torch-dist-dist-optimizer")
    )
    c = param_counts(V._model(p["model"]))
    # 12 layers x 8 experts x two GeLU matrices of 512 x 1024 (--moe-ffn-hidden-size 1024)
    assert c.routed_experts == 12 * 8 * 2 * 512 * 1024
    # tied GPT-2 vocabulary padded to 128 x TP (TP 1): 50304 x 512, counted once
    assert c.embeddings == 50304 * 512


def test_deepseek_v2_lite_matches_torchtitans_printed_parameter_count():
    from dataclasses import replace

    from moe_repro.components.model.params import param_counts
    from moe_repro.components.model.zoo import get_model

    # torchtitan PR #1513's log (vocab 129280): "Total parameter count: dense 968,486,400,
    # sparse 14,848,098,304" (sparse: routed and shared experts and routers)
    c = param_counts(replace(get_model("deepseek-v2-lite"), vocab=129280))
    assert c.attention + c.norms + c.dense_ffn + c.embeddings == 968_486_400
    assert c.routed_experts + c.shared_experts + c.routers == 14_848_098_304


def test_runs_predicted_over_their_gpus_memory_are_listed():
    ran = V.Scored("ran", "memory", 70.0, 90.0, "GiB", "s", "analytic", capacity=80.0)
    fits = V.Scored("fits", "memory", 70.0, 75.0, "GiB", "s", "analytic", capacity=80.0)
    none = V.Scored("none", "memory", 70.0, None, "GiB", "s", "analytic", capacity=80.0)
    s = V.summarise("memory", [ran, fits, none])
    assert s.over_capacity == ["ran"]


def test_out_of_memory_runs_are_scored_for_direction_only():
    doc = V.load_points()
    ooms = [p for p in doc["points"] if p["predictor"] == "memory" and p["role"] == "oom"]
    assert ooms
    (s,) = V.validate(("memory",), doc)
    assert {x.point_id for x in s.oom} == {p["id"] for p in ooms}
    assert not {x.point_id for x in s.scored} & {p["id"] for p in ooms}  # not in the MAPE
    # what PyTorch gets of each GPU (its printed total capacity, the profiles' sources)
    capacity_gib = {"dgx-h100": 79.11, "grand-teton-h100": 94.99}
    platform = {p["id"]: p["platform"] for p in ooms}
    for x in s.oom:
        # the need is at least the GPU's memory, in GiB
        want = capacity_gib[platform[x.point_id]]
        assert x.measured == x.capacity == pytest.approx(want, abs=0.005)
        assert x.over_capacity == (x.predicted > x.capacity)


def test_each_memory_prediction_is_stored_by_term_and_the_page_draws_them(tmp_path):
    """The sources print one number per run; each point keeps what our prediction of it is made
    of (the live-tensor terms, then the sourced terms of its kind), summing to the prediction,
    and the validation page draws them against the measured peaks."""
    import json

    from click.testing import CliRunner

    from moe_repro.cli import cli
    from moe_repro.records.store import ResultsStore
    from moe_repro.reports.validation_page import write_validation_page

    store = ResultsStore(tmp_path / "results")
    r = CliRunner().invoke(cli, ["--results", str(store.root), "validate", "--predictor", "memory"])
    assert r.exit_code == 0, r.output
    doc = json.loads((store.root / "validation" / "validation.json").read_text())
    points = [p for p in doc["points"] if p["predictor"] == "memory" and p["predicted"]]
    assert len(points) >= 20
    for p in points:
        terms = p["terms"]
        assert list(terms)[:5] == ["weights", "grads", "optimizer", "activations", "buffers"]
        assert sum(terms.values()) == pytest.approx(p["predicted"], rel=1e-9), p["id"]
    # a point measured as max reserved carries the allocator's terms; one measured as max
    # allocated does not (memory_terms.KINDS)
    reserved = next(p for p in points if p["measured_kind"] == "max reserved")
    allocated = next(p for p in points if p["measured_kind"] == "max allocated")
    assert any(k.startswith("allocator") for k in reserved["terms"])
    assert not any(k.startswith("allocator") for k in allocated["terms"])
    site = tmp_path / "site"
    site.mkdir()
    page = write_validation_page(store, site).read_text()
    assert 'src="validation-memory-terms.png"' in page and "prediction by term" in page
    png = (site / "validation-memory-terms.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
