"""A model read from a Hugging Face config.json or a spec file (components/model/hf_config.py).

The configs in tests/data/hf_configs/ are the public model cards' config.json files, written here
(no download at run time). Where the zoo has the model, the parameter counts of the two must be
equal; elsewhere the counts are checked against the model card's headline at its printed precision.
"""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from moe_repro.cli import cli
from moe_repro.components.model.hf_config import (
    ModelConfigError,
    load_model_file,
    model_from_hf_config,
)
from moe_repro.components.model.params import param_counts
from moe_repro.components.model.zoo import get_model

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


@pytest.mark.parametrize(
    "file, zoo_key",
    [
        ("mixtral-8x7b.json", "mixtral-8x7b"),
        ("qwen3-30b-a3b.json", "qwen3-30b-a3b"),
        ("deepseek-v3.json", "deepseek-v3"),
        ("deepseek-v2.json", "deepseek-v2"),
    ],
)
def test_a_config_gives_the_zoo_models_parameter_counts(file, zoo_key):
    ours, zoo = load_model_file(CONFIGS / file), get_model(zoo_key)
    assert param_counts(ours) == param_counts(zoo)
    assert (ours.n_experts, ours.top_k, ours.n_moe_layers) == (
        zoo.n_experts,
        zoo.top_k,
        zoo.n_moe_layers,
    )


# Model cards' headline counts (billions) and the digits they print them with.
HEADLINES = [
    ("qwen2-57b-a14b.json", 57, 14, 0),  # Qwen2 technical report: 57B total, 14B activated
    ("olmoe-1b-7b-0924.json", 6.9, 1.3, 1),  # OLMoE paper: 6.9B total, 1.3B active
    ("gpt-oss-120b.json", 116.8, None, 1),  # gpt-oss model card: 116.8B total
    ("gpt-oss-20b.json", 20.9, None, 1),  # gpt-oss model card: 20.9B total
]


@pytest.mark.parametrize("file, total, active, digits", HEADLINES)
def test_configs_without_a_zoo_entry_give_the_model_cards_counts(file, total, active, digits):
    c = param_counts(load_model_file(CONFIGS / file))
    assert round(c.total / 1e9, digits) == total
    if active is not None:
        assert round(c.active / 1e9, digits) == active


def test_interleaved_and_dense_first_layers_are_counted():
    base = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
    every_other = model_from_hf_config(dict(base, decoder_sparse_step=2))
    assert every_other.n_moe_layers == 24 and every_other.d_ffn_dense == 6144
    two_dense = model_from_hf_config(dict(base, mlp_only_layers=[0, 47]))
    assert two_dense.n_moe_layers == 46
    v3 = load_model_file(CONFIGS / "deepseek-v3.json")
    assert v3.n_dense_layers == 3 and v3.d_ffn_dense == 18432


def test_unknown_keys_are_named():
    cfg = json.loads((CONFIGS / "mixtral-8x7b.json").read_text())
    with pytest.raises(ModelConfigError, match="does not model: moe_frobnicate, zeta"):
        model_from_hf_config(dict(cfg, moe_frobnicate=1, zeta=2))


def test_missing_keys_and_unknown_families_are_refused():
    cfg = json.loads((CONFIGS / "mixtral-8x7b.json").read_text())
    del cfg["num_local_experts"]
    with pytest.raises(ModelConfigError, match="lacks num_local_experts"):
        model_from_hf_config(cfg)
    with pytest.raises(ModelConfigError, match="'llama' is not one"):
        model_from_hf_config({"model_type": "llama"})


def test_a_spec_file_uses_the_zoo_field_names(tmp_path):
    spec = {
        "format": "moe-repro-model",
        "key": "my-moe",
        "name": "My MoE",
        "layers": 24,
        "d_model": 2048,
        "d_ffn": 1024,
        "n_experts": 64,
        "top_k": 8,
        "n_heads": 16,
        "vocab": 50304,
    }
    p = tmp_path / "my.json"
    p.write_text(json.dumps(spec))
    m = load_model_file(p)
    assert (m.key, m.layers, m.n_experts) == ("my-moe", 24, 64)
    p.write_text(json.dumps(dict(spec, expertz=3)))
    with pytest.raises(ModelConfigError, match="unknown fields: expertz"):
        load_model_file(p)


@pytest.mark.parametrize("file", sorted(p.name for p in CONFIGS.glob("*.json")))
def test_repro_plan_reads_each_family(file):
    r = CliRunner().invoke(
        cli, ["plan", "--model", str(CONFIGS / file), "--nodes", "16", "--platform", "dgx-h100"]
    )
    assert r.exit_code == 0, r.output
    assert "plan:" in r.output


def test_repro_plan_refuses_a_bad_config_in_one_line(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "mixtral", "hidden_size": 8}))
    r = CliRunner().invoke(
        cli, ["plan", "--model", str(p), "--nodes", "1", "--platform", "dgx-h100"]
    )
    assert r.exit_code == 2
    assert "lacks" in r.output and "Traceback" not in r.output


def test_megatron_launch_arguments_take_megatrons_defaults():
    from moe_repro.components.model.hf_config import model_from_megatron_args

    # Megatron-LM's argument defaults: --ffn-hidden-size 4h, GeLU (two matrices) unless --swiglu,
    # tied embeddings unless --untie-embeddings-and-output-weights, head dim h / heads
    dense = model_from_megatron_args({"layers": 2, "hidden": 64, "heads": 4, "vocab": 128})
    assert (dense.d_ffn, dense.n_mat, dense.tie_embeddings, dense.head_dim) == (256, 2, True, 16)
    assert dense.moe_layers == 0
    moe = model_from_megatron_args(
        {"layers": 4, "hidden": 64, "heads": 4, "vocab": 128, "experts": 8, "top_k": 2,
         "moe_ffn": 32, "swiglu": True, "untie": True}
    )  # fmt: skip
    assert (moe.n_experts, moe.top_k, moe.moe_layers, moe.d_ffn, moe.d_ffn_dense) == (
        8,
        2,
        4,
        32,
        256,
    )
    assert moe.n_mat == 3 and not moe.tie_embeddings
