"""The suites reproductions and `repro calibrate` measure through (memcopy, llep-layer,
ssmb-memory, dispatch-stages, rank-layout-traffic, pp-ep-train) and run_grid, the one way in."""

import json

import pytest
from click.testing import CliRunner

from moe_repro.suites import all_suites
from moe_repro.suites.runner import RunConfig, run_point

FAST = RunConfig(warmup=1, repeats=2, min_sample_s=0.001)


# --- memcopy and repro calibrate ----------------------------------------------------------------


def test_memcopy_bandwidth_is_read_plus_write_over_time():
    rec = run_point(all_suites()["memcopy"], {"mbytes": 2, "device": "cpu", "threads": 1}, FAST)
    assert rec["correct"] and rec["wrong"] == 0
    # 2 MiB read + 2 MiB written per copy, by hand
    for t, gbps in zip(rec["samples"]["time_s"], rec["samples"]["GBps"]):
        assert gbps == pytest.approx(2 * 2 * 2**20 / t / 1e9)


def test_memcopy_check_counts_a_broken_copy(monkeypatch):
    from moe_repro.suites import memcopy

    state = memcopy.setup({"mbytes": 1, "device": "cpu", "threads": 1})
    monkeypatch.setattr(memcopy, "run", lambda s: s["dst"][:100].copy_(s["src"][:100]))
    assert memcopy.check(state) == 2**18 - 100  # 1 MiB of float32, all but 100 left at -1


def test_calibrate_measures_through_the_suites(tmp_path):
    from moe_repro.cli import cli

    out = tmp_path / "local.json"
    res = CliRunner().invoke(
        cli,
        ["calibrate", "--quick", "--ranks", "2", "--no-alltoall", "--out", str(out)],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    measured = doc["measured"]
    assert measured["copy_GBps"] > 0 and measured["attention_tflops"] > 0
    assert measured["copy_spread_s"] >= 0 and measured["attention_spread_s"] >= 0
    assert all(v["correct"] for v in measured["gemm_float32_1thread"].values())
    assert doc["node"]["gpus"] == 2
    assert doc["node"]["nic_GBps"] == pytest.approx(measured["copy_GBps"] / 2)


def test_calibrate_refuses_a_wrong_result():
    from moe_repro.cli.calibrate_cmd import require_correct
    from moe_repro.cli.errors import RunFailure

    require_correct({"suite": "memcopy", "wrong": 0, "correct": True})
    with pytest.raises(RunFailure, match="3 wrong"):
        require_correct({"suite": "memcopy", "wrong": 3, "correct": False})


# --- grid validation (no ranks started) ---------------------------------------------------------


def test_world_params_are_derived_and_bad_points_refused():
    from moe_repro.suites.dispatch_stages import stage_metric

    names = ("rank-layout-traffic", "dispatch-stages", "pp-ep-train")
    traffic, stages, train = (all_suites()[n] for n in names)
    assert {
        (p["ranks"], p["ranks_per_node"])
        for p in traffic.grid({"nodes": [2], "gpus_per_node": [4], "ep": [4]})
    } == {(8, 4)}
    with pytest.raises(ValueError, match="divide"):
        traffic.grid({"nodes": [2], "gpus_per_node": [2], "ep": [3]})
    with pytest.raises(ValueError, match="algo"):
        stages.grid({"algo": ["ring"]})  # flat, HALO and RBD all time their stages now
    assert {p["algo"] for p in stages.grid({"algo": ["flat", "halo", "rbd"]})} == {
        "flat",
        "halo",
        "rbd",
    }
    assert stage_metric("pilot all-to-all (inter-node)") == "pilot_all_to_all_inter_node_s"
    assert [p["ranks"] for p in train.grid({"pp": [2], "ep": [2], "dp": [2]})] == [8]
    with pytest.raises(ValueError, match="EP=3"):
        train.grid({"ep": [3]})  # tiny-moe's experts are not divisible by 3


def test_train_record_gives_back_the_trainers_report():
    from moe_repro.suites.pp_ep_train import flatten_report, report_of

    def stage(i):
        return {
            "pp_rank": i,
            "stages": [i],
            "activation_peak_bytes": 100 * (2 - i),
            "static_bytes": 7,
            "activation_per_microbatch_bytes": 50.0,
            "peak_over_mean_microbatch": 2.0 - i,
            "in_flight_at_peak": 2 - i,
            "idle_fraction": 0.25,
            "peak_bytes": 107,
            "cuda_max_allocated_bytes": None,
        }

    report = {
        "step_s": 0.1,
        "tokens_per_s": 1e4,
        "bubble_measured": 0.2,
        "idle_fraction_mean": 0.3,
        "bubble_theory": 0.2,
        "mfu": 0.01,
        "time_split_s": {
            k: 0.01
            for k in ("attention", "experts", "alltoall", "p2p", "idle", "other", "grad_sync")
        },
        "per_stage": [stage(0), stage(1)],
        "losses": [6.0, 5.5],
    }
    params = {
        "model": "tiny-moe",
        "pp": 2,
        "ep": 1,
        "dp": 1,
        "schedule": "1f1b",
        "micro_batches": 4,
        "micro_batch_size": 2,
        "steps": 2,
        "lr": 1e-3,
        "seed": 0,
    }
    back = report_of({**params, **flatten_report(report)})
    assert back["per_stage"] == report["per_stage"]
    assert back["losses"] == report["losses"] and back["time_split_s"] == report["time_split_s"]
    assert back["bubble_measured"] == 0.2 and back["config"]["micro_batches"] == 4


# --- real ranks ---------------------------------------------------------------------------------


@pytest.mark.multiprocess
def test_llep_layer_moves_rows_off_the_busiest_rank_exactly():
    from moe_repro.reproductions.suite_runs import pick, run_grid

    base = {
        "ranks": 2,
        "backend": "gloo",
        "tokens": 64,
        "d_model": 16,
        "d_ffn": 32,
        "experts": 8,
        "top_k": 2,
        "skew": 4.0,
        "seed": 0,
    }
    records = run_grid(
        "llep-layer", [dict(base, layer=l) for l in ("plain", "llep")], repeats=2, timeout_s=120
    )
    plain, llep = pick(records, layer="plain"), pick(records, layer="llep")
    mean = base["tokens"] * base["top_k"]  # every rank routes tokens x top_k rows
    for r in (plain, llep):
        assert r["correct"] and r["time_s"] > 0
        assert r["straggler_rows"] == r["rows_busiest"] - mean
    assert plain["rows_busiest"] > mean  # the skew overloads one rank
    assert llep["rows_busiest"] <= mean  # LLEP's capacity is ceil(N / W) rows
    assert llep["max_abs_diff"] < 1e-5


@pytest.mark.multiprocess
def test_ssmb_memory_shrinks_by_the_tp_degree():
    from moe_repro.reproductions.suite_runs import pick, run_grid

    base = {
        "ranks": 2,
        "backend": "gloo",
        "seq": 64,
        "hidden": 16,
        "dense_ffn": 16,
        "experts": 4,
        "expert_ffn": 8,
        "top_k": 2,
        "seed": 0,
    }
    records = run_grid(
        "ssmb-memory", [dict(base, variant=v) for v in ("tp_ep", "ssmb")], repeats=1, timeout_s=120
    )
    tp_ep, ssmb = pick(records, variant="tp_ep"), pick(records, variant="ssmb")
    assert tp_ep["correct"] and ssmb["correct"] and ssmb["max_abs_diff"] < 1e-5
    # each of the 2 ranks routes half of the sequence: half the MoE activations
    assert tp_ep["moe_saved_bytes"] / ssmb["moe_saved_bytes"] == pytest.approx(2.0, rel=0.1)


@pytest.mark.multiprocess
def test_trainer_runs_report_eq4_in_flight_counts():
    from moe_repro.reproductions._trainer_cells import run_trainers

    configs = [
        dict(model="tiny-moe", pp=2, ep=1, micro_batches=m, micro_batch_size=1, steps=2, schedule=s)
        for s, m in (("1f1b", 4), ("gpipe", 3))
    ]
    one_f_one_b, gpipe = run_trainers(configs, timeout_s=120)
    # Piper Eq. 4: under 1F1B stage i holds PP - i micro-batches at its peak; Eq. 3: GPipe all M
    assert [s["in_flight_at_peak"] for s in one_f_one_b["per_stage"]] == [2, 1]
    assert [s["in_flight_at_peak"] for s in gpipe["per_stage"]] == [3, 3]
    assert gpipe["config"]["micro_batches"] == 3 and len(gpipe["losses"]) == 2
    assert all(loss > 0 for loss in one_f_one_b["losses"])
