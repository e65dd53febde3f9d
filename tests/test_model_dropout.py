"""Dropout as a model field: the planner stores its masks only for models trained with dropout."""

import re

from click.testing import CliRunner

from moe_repro.cli import cli
from moe_repro.components.model.zoo import MODELS, get_model
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources.parallel_planner import plan_parallel

GiB = 2**30


def test_dropout_is_on_for_gpt3_and_off_for_llama3():
    assert get_model("gpt3-175b").dropout is True
    assert not any(m.dropout for k, m in MODELS.items() if k.startswith("llama3"))


def _activations(dropout: bool, pp: int = 8, seq: int = 2048) -> tuple[float, object]:
    m, p = get_model("gpt3-175b"), load_builtin("dgx-h100")
    pl = plan_parallel(
        m,
        p,
        8,
        seq=seq,
        tp=8,
        pp=pp,
        vpp=1,
        micro_batches=16,
        global_batch=16,
        recompute=("selective",),
        flash_attention=False,
        zero=(1,),
        dropout=dropout,
    )
    c = pl.best or pl.candidates[0]
    return c.memory["activations"], c


def test_dropout_adds_korthikanti_two_masks_per_layer():
    # Korthikanti et al. Table 2, SP + selective recompute: 34 s b h / t bytes per layer with
    # dropout, of which the attention and MLP dropout masks are 1 byte each (2 s b h / t).
    with_masks, c = _activations(True)
    without, _ = _activations(False)
    s, b, h, t = 2048, c.micro_batch, 12288, 8
    layers_stage0 = 96 // 8
    in_flight = min(8, c.micro_batches)  # 1F1B stage 0 holds PP micro-batches
    assert with_masks - without == 2 * s * b * h / t * layers_stage0 * in_flight


def test_repro_plan_uses_the_models_dropout_unless_told():
    args = [
        "plan",
        "--model",
        "gpt3-175b",
        "--platform",
        "dgx-h100",
        "--nodes",
        "8",
        "--tp",
        "8",
        "--pp",
        "8",
        "--vpp",
        "1",
        "--seq",
        "2048",
        "--global-batch",
        "16",
        "--micro-batches",
        "16",
        "--recompute",
        "selective",
        "--no-flash",
        "--zero",
        "1",
        "--top",
        "1",
    ]

    def activ(extra):
        r = CliRunner().invoke(cli, args + extra)
        assert r.exit_code == 0, r.output
        row = next(line for line in r.output.splitlines() if re.match(r"^1\s", line))
        return float(row.split()[16])  # the "activ" column

    default, on, off = activ([]), activ(["--dropout"]), activ(["--no-dropout"])
    assert default == on and off < on


def test_dropout_flag_is_refused_by_the_piper_method():
    r = CliRunner().invoke(
        cli,
        [
            "plan",
            "--model",
            "gpt3-175b",
            "--platform",
            "dgx-h100",
            "--nodes",
            "8",
            "--method",
            "piper",
            "--dropout",
        ],
    )
    assert r.exit_code == 2 and "--dropout" in r.output
