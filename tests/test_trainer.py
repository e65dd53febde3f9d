"""The PP x EP trainer (components/training/pp_ep_trainer.py): exact against one process, schedules agree.

The reference is the whole model in one process, no pipeline and no expert parallelism, looping
over the same data shards and micro-batches (pp_ep_trainer.reference_run); the distributed runs
use real gloo ranks, real P2P between stages and real all-to-alls inside each stage.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from moe_repro.components.model.moe_transformer import StageModule, TransformerConfig
from moe_repro.components.model.pipeline_split import stage_layers
from moe_repro.components.training.pp_ep_trainer import SavedActivationMeter, TrainConfig
from moe_repro.runtime.launch import run_ranks

TOL = 1e-5  # fp32; the bound
# Small and fast: 2 layers (so PP=2 has one each), short sequences.
SMALL = dict(
    model="tiny-moe",
    n_layers=2,
    seq_len=32,
    micro_batches=2,
    micro_batch_size=2,
    steps=2,
    check_reference=True,
)


def test_stage_layers_is_contiguous_and_complete():
    for layers, stages in [(4, 1), (4, 2), (5, 2), (7, 3), (4, 4)]:
        split = [list(r) for r in stage_layers(layers, stages)]
        assert len(split) == stages
        assert [i for part in split for i in part] == list(range(layers))
        assert max(map(len, split)) - min(map(len, split)) <= 1
    with pytest.raises(ValueError):
        stage_layers(2, 3)


@pytest.mark.parametrize(
    "bad",
    [
        dict(ep=3),
        dict(pp=5),
        dict(pp=2, micro_batches=1),
        dict(schedule="zb"),
        dict(pp=2, schedule="interleaved", n_layers=3),
    ],
)
def test_config_validation_rejects(bad):
    with pytest.raises(ValueError):
        TrainConfig(**{"model": "tiny-moe", **bad}).validate()


@pytest.mark.parametrize("seed", [0, 7])
def test_stages_chain_to_the_full_model(seed):
    """Stage modules built separately (name-seeded init) compose to the one-process model."""
    cfg = TransformerConfig.from_zoo("tiny-moe", seq_len=16)
    full = StageModule(cfg, list(range(cfg.n_layers)), True, True, seed=seed)
    parts = [
        StageModule(cfg, list(ids), i == 0, i == 2, seed=seed)
        for i, ids in enumerate(stage_layers(cfg.n_layers, 3))
    ]
    x = torch.randint(0, cfg.vocab, (2, 16), generator=torch.Generator().manual_seed(seed))
    h = x
    for part in parts:
        h = part(h)
    assert torch.allclose(h, full(x), atol=1e-6, rtol=0)


def test_activation_meter_counts_saved_storages_once():
    w = torch.nn.Parameter(torch.randn(10, 10))
    meter = SavedActivationMeter([w])
    x = torch.randn(100, 10, requires_grad=True)
    with meter.hooks():
        y = (x * x) @ w  # mul saves x twice (one storage), matmul saves x*x and w (a parameter)
        loss = y.sum()
    assert meter.peak == 2 * 100 * 10 * 4
    loss.backward()
    del y, loss
    assert meter.live == 0


def _check(report: dict, steps: int) -> None:
    assert len(report["losses"]) == steps
    assert all(math.isfinite(v) for v in report["losses"])
    assert report["reference_max_abs_diff"] <= TOL, report["reference_worst_param"]
    assert report["reference_max_abs_diff_losses"] <= TOL


@pytest.mark.multiprocess
def test_pp_ep_1x2_and_2x1_match_one_process(targets_on_path):
    """1x2 (with activation checkpointing: recomputation repeats the all-to-alls), 2x1, and 2x1
    interleaved (two stages per rank, 4 layers)."""
    configs = [
        dict(SMALL, pp=1, ep=2, seed=1, checkpoint=True),
        dict(SMALL, pp=2, ep=1, seed=2),
        dict(SMALL, pp=2, ep=1, seed=4, schedule="interleaved", n_layers=4),
    ]
    reports = run_ranks(
        "_trainer_targets:train_several", {"configs": configs}, world_size=2, timeout_s=240
    )[0]
    for report in reports:
        _check(report, SMALL["steps"])


@pytest.mark.multiprocess
def test_pp_ep_2x2_matches_one_process_and_gpipe_equals_1f1b(targets_on_path):
    cfg = dict(SMALL, pp=2, ep=2, seed=3)
    out = run_ranks(
        "_trainer_targets:train_then_compare_schedules",
        {
            "configs": [cfg, dict(SMALL, dp=2, pp=2, ep=1, seed=5)],
            "compare": {
                "config": {**cfg, "check_reference": False, "micro_batches": 4},
                "schedules": ["1f1b", "gpipe"],
                "steps": 2,
            },
        },
        world_size=4,
        timeout_s=300,
    )[0]
    report, with_dp = out["reports"]
    _check(report, SMALL["steps"])
    _check(with_dp, SMALL["steps"])
    # The trainer actually trained: losses move, and the measurements are present.
    assert report["losses"][0] != report["losses"][1]
    assert len(report["per_stage"]) == 2 and report["tokens_per_s"] > 0

    both = out["schedules"]
    assert both["n_params"] > 0
    assert both["max_abs_diff"] <= 1e-6
    assert both["losses"]["1f1b"] == pytest.approx(both["losses"]["gpipe"], abs=1e-6)


@pytest.mark.multiprocess
def test_every_dispatcher_trains_like_one_process_on_four_ranks_over_two_nodes(targets_on_path):
    """EP=4 over 2 emulated nodes of 2 ranks, each registered dispatcher in turn (flat; HALO's
    three phases; RBD's pilots across the nodes and replicas inside them): losses and every
    gradient of every step equal the one-process model's (reference_max_abs_diff)."""
    from moe_repro.components.alltoall import algorithm_names

    names = algorithm_names()
    assert {"flat", "halo", "rbd"} <= set(names)
    configs = [
        dict(SMALL, pp=1, ep=4, ranks_per_node=2, alltoall=name, seed=10 + i)
        for i, name in enumerate(names)
    ]
    reports = run_ranks(
        "_trainer_targets:train_several",
        {"configs": configs},
        world_size=4,
        ranks_per_node=2,
        timeout_s=300,
    )[0]
    for name, report in zip(names, reports):
        assert report["config"]["alltoall"] == name
        _check(report, SMALL["steps"])


@pytest.mark.multiprocess
@pytest.mark.parametrize("alltoall", ["halo", "rbd"])
def test_train_cli_with_each_all_to_all_matches_one_process(tmp_path, alltoall):
    """PP=2 x EP=2 with HALO or RBD as each stage's dispatcher, from the command line."""
    out = tmp_path / "t.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from moe_repro.cli import main; main()",
            "train",
            "--model",
            "tiny-moe",
            "--pp",
            "2",
            "--ep",
            "2",
            "--alltoall",
            alltoall,
            "--steps",
            "2",
            "--check-reference",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["config"]["alltoall"] == alltoall and report["world_size"] == 4
    _check(report, 2)


def test_config_rejects_halo_on_ep_groups_uneven_over_nodes():
    with pytest.raises(ValueError, match="same number"):  # EP group {0..3} over nodes of 3
        TrainConfig(model="tiny-moe", ep=4, dp=3, alltoall="halo", ranks_per_node=3).validate()
    with pytest.raises(ValueError, match="alltoall"):
        TrainConfig(model="tiny-moe", alltoall="ring").validate()


@pytest.mark.multiprocess
def test_a_dead_rank_stops_the_world_with_a_clear_message():
    from moe_repro.components.training.pp_ep_trainer import launch_training
    from moe_repro.runtime.launch import RankFailure

    cfg = TrainConfig(
        **{
            **SMALL,
            "check_reference": False,
            "pp": 2,
            "ep": 1,
            "steps": 3,
            "fail_rank": 1,
            "fail_step": 1,
        }
    )
    with pytest.raises(RankFailure) as err:
        launch_training(cfg, timeout_s=120)
    assert "did not finish" not in str(err.value)  # killed when rank 1 died, not at the timeout
    # Rank 1 is named; its peer may be named too (gloo reports the closed connection at once).
    assert 1 in err.value.ranks and "code 3" in str(err.value)


def test_train_cli_bad_input_is_one_line_exit_2():
    proc = subprocess.run(
        [sys.executable, "-c", "from moe_repro.cli import main; main()", "train", "--ep", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "EP=3" in proc.stderr
