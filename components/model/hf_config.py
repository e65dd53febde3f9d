"""A model from a Hugging Face ``config.json`` or from a small spec file, for ``repro plan``.

Families read (``model_type``): ``mixtral``, ``qwen2_moe``, ``qwen3_moe``, ``deepseek_v2``,
``deepseek_v3``, ``olmoe``, ``gpt_oss``. Each family's keys are listed once in ``FAMILIES``:
the keys that set the architecture (mapped onto :class:`~zoo.MoEModel`) and the keys that do not
change parameters, FLOPs or memory of training (rope, norms' epsilon, token ids, ...). Any other
key is refused by name, so a config with an architecture feature the model does not know is not
planned as if it were absent.

Anything else is described by a spec: a JSON object with ``"format": "moe-repro-model"`` and
:class:`~zoo.MoEModel`'s own field names (docs/model-spec.md). A Megatron-LM launch's model
arguments, as the memory validation set records them, are read by ``model_from_megatron_args``.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from moe_repro.components.model.zoo import MLA, MoEModel

SPEC_FORMAT = "moe-repro-model"

# Keys every family may carry that change nothing the planner computes.
_COMMON_IGNORED = frozenset(
    {
        "architectures",
        "model_type",
        "torch_dtype",
        "dtype",
        "transformers_version",
        "use_cache",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "initializer_range",
        "rms_norm_eps",
        "layer_norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "max_position_embeddings",
        "hidden_act",
        "attention_dropout",
        "attention_bias",
        "output_router_logits",
        "router_aux_loss_coef",
        "router_jitter_noise",
        "auto_map",
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "pretraining_tp",
        "norm_topk_prob",
        "clip_qkv",
        "tie_word_embeddings",
        "quantization_config",
        "_name_or_path",
        "initial_context_length",
        "aux_loss_alpha",
        "seq_aux",
        "routed_scaling_factor",
        "scoring_func",
        "topk_method",
        "n_group",
        "topk_group",
        "ep_size",
        "num_nextn_predict_layers",
        "rope_interleave",
        "router_z_loss_coef",
        "layer_types",
        "swiglu_limit",
        "experts_per_token",
        "qkv_bias",
        "mlp_only_layers",
        "decoder_sparse_step",
        "first_k_dense_replace",
        "moe_layer_freq",
        "head_dim",
    }
)

# Per family: the keys that must be present (architecture) beside the common ones.
FAMILIES: dict[str, frozenset[str]] = {
    "mixtral": frozenset(
        {
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "num_local_experts",
            "num_experts_per_tok",
            "vocab_size",
        }
    ),
    "qwen2_moe": frozenset(
        {
            "hidden_size",
            "intermediate_size",
            "moe_intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "num_experts",
            "num_experts_per_tok",
            "shared_expert_intermediate_size",
            "vocab_size",
        }
    ),
    "qwen3_moe": frozenset(
        {
            "hidden_size",
            "intermediate_size",
            "moe_intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "num_experts",
            "num_experts_per_tok",
            "vocab_size",
        }
    ),
    "deepseek_v2": frozenset(
        {
            "hidden_size",
            "intermediate_size",
            "moe_intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "n_routed_experts",
            "n_shared_experts",
            "num_experts_per_tok",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "vocab_size",
        }
    ),
    "olmoe": frozenset(
        {
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "num_experts",
            "num_experts_per_tok",
            "vocab_size",
        }
    ),
}
FAMILIES["deepseek_v3"] = FAMILIES["deepseek_v2"]
FAMILIES["gpt_oss"] = FAMILIES["mixtral"]  # the same keys; biases and attention sinks not modelled


class ModelConfigError(ValueError):
    """A config that cannot be read as a model; the message is one line naming the cause."""


def _moe_layer_count(cfg: dict, layers: int) -> int:
    """Layers whose FFN is an MoE block, from each family's interleaving keys."""
    dense_first = int(cfg.get("first_k_dense_replace", 0) or 0)
    freq = int(cfg.get("moe_layer_freq", 1) or 1)
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    dense_only = set(cfg.get("mlp_only_layers", []) or [])
    count = 0
    for i in range(layers):
        if i < dense_first or (i - dense_first) % freq or (i + 1) % step or i in dense_only:
            continue
        count += 1
    return count


def model_from_hf_config(cfg: dict, *, key: str = "", source: str = "") -> MoEModel:
    """The :class:`MoEModel` a Hugging Face ``config.json`` describes.

    Args:
        cfg: the parsed ``config.json``.
        key: the name the plan prints (default: the config's model type).
        source: where the config came from, kept on the model.
    Returns:
        The model; ``approximate`` names fields the config does not state exactly.
    Raises:
        ModelConfigError: an unknown ``model_type``, a missing architecture key, or keys
            this reader does not know (named).
    """
    family = cfg.get("model_type")
    if family not in FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        raise ModelConfigError(f"model_type {family!r} is not one this reader knows ({known})")
    required = FAMILIES[family]
    missing = sorted(k for k in required if k not in cfg)
    if missing:
        raise ModelConfigError(f"{family} config lacks {', '.join(missing)}")
    unknown = sorted(set(cfg) - required - _COMMON_IGNORED)
    if unknown:
        raise ModelConfigError(
            f"{family} config has keys this reader does not model: {', '.join(unknown)}"
        )
    layers, d = int(cfg["num_hidden_layers"]), int(cfg["hidden_size"])
    heads, kv_heads = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    common: dict[str, Any] = dict(
        key=key or family,
        name=key or family,
        layers=layers,
        d_model=d,
        top_k=int(cfg["num_experts_per_tok"]),
        n_mat=3,  # every family here uses a gated (SwiGLU) FFN
        n_heads=heads,
        n_kv_heads=kv_heads,
        head_dim=int(cfg.get("head_dim") or d // heads),
        vocab=int(cfg["vocab_size"]),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        source=source or f"Hugging Face config.json ({family})",
    )
    moe_layers = _moe_layer_count(cfg, layers)
    if family in ("mixtral", "olmoe", "gpt_oss"):
        experts = cfg.get("num_local_experts", cfg.get("num_experts"))
        if experts is None:
            raise ModelConfigError(f"{family} config gives no expert count")
        return MoEModel(
            **common,
            d_ffn=int(cfg["intermediate_size"]),
            n_experts=int(experts),
            moe_layers=None if moe_layers == layers else moe_layers,
        )
    if family in ("qwen2_moe", "qwen3_moe"):
        shared = int(cfg.get("shared_expert_intermediate_size", 0) or 0)
        return MoEModel(
            **common,
            d_ffn=int(cfg["moe_intermediate_size"]),
            n_experts=int(cfg["num_experts"]),
            n_shared=1 if shared else 0,
            d_ffn_shared=shared or None,
            moe_layers=None if moe_layers == layers else moe_layers,
            d_ffn_dense=int(cfg["intermediate_size"]) if moe_layers < layers else None,
        )
    # deepseek_v2 / deepseek_v3: MLA attention, shared experts, first layers dense
    mla = MLA(
        q_lora_rank=cfg["q_lora_rank"],
        kv_lora_rank=int(cfg["kv_lora_rank"]),
        qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
        qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
        v_head_dim=int(cfg["v_head_dim"]),
    )
    common.update(n_kv_heads=None, head_dim=None)
    return MoEModel(
        **common,
        d_ffn=int(cfg["moe_intermediate_size"]),
        n_experts=int(cfg["n_routed_experts"]),
        n_shared=int(cfg["n_shared_experts"] or 0),
        moe_layers=None if moe_layers == layers else moe_layers,
        d_ffn_dense=int(cfg["intermediate_size"]) if moe_layers < layers else None,
        attn_params="mla",
        mla=mla,
        notes="Multi-token-prediction layers (num_nextn_predict_layers) are not counted.",
    )


def model_from_spec(spec: dict, *, source: str = "") -> MoEModel:
    """A model from a spec: ``MoEModel``'s field names (docs/model-spec.md)."""
    names = {f.name for f in fields(MoEModel)}
    body = {k: v for k, v in spec.items() if k != "format"}
    unknown = sorted(set(body) - names)
    if unknown:
        raise ModelConfigError(f"model spec has unknown fields: {', '.join(unknown)}")
    needed = ("key", "name", "layers", "d_model", "d_ffn", "n_experts", "top_k")
    missing = [k for k in needed if k not in body]
    if missing:
        raise ModelConfigError(f"model spec lacks {', '.join(missing)}")
    if isinstance(body.get("mla"), dict):
        body["mla"] = MLA(**body["mla"])
    body.setdefault("source", source)
    try:
        return MoEModel(**body)
    except TypeError as e:
        raise ModelConfigError(f"model spec: {e}") from None


def load_model_file(path: str | Path) -> MoEModel:
    """A model from a JSON file: a Hugging Face ``config.json`` or a moe-repro model spec."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise ModelConfigError(f"cannot read {p}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"{p} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{p} holds a JSON {type(data).__name__}, not an object")
    if data.get("format") == SPEC_FORMAT:
        return model_from_spec(data, source=str(p))
    return model_from_hf_config(data, key=p.stem if p.stem != "config" else "", source=str(p))


def model_from_megatron_args(spec: dict) -> MoEModel:
    """A Megatron-LM GPT (dense, or with MoE layers) from a point's own launch arguments (its
    functional tests' model_config.yaml): --num-layers, --hidden-size, --num-attention-heads,
    --num-query-groups, --kv-channels, --ffn-hidden-size (default 4h), --swiglu (three matrices,
    else two with GeLU), the padded vocabulary, --untie-embeddings-and-output-weights (default
    tied); MoE: --num-experts (0: dense), --moe-router-topk, --moe-layer-freq (MoE layers),
    --moe-ffn-hidden-size (default the FFN's), --moe-shared-expert-intermediate-size; MLA:
    --q-lora-rank, --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim, --v-head-dim."""
    h = spec["hidden"]
    ffn = spec.get("ffn") or 4 * h
    shared = spec.get("shared_ffn")
    experts = spec.get("experts", 0)
    mla = spec.get("mla")
    return MoEModel(
        key=f"megatron-core-{spec['layers']}x{h}-e{experts}",
        name=f"Megatron-LM test GPT ({spec['layers']} x {h}, {experts} experts)",
        layers=spec["layers"],
        moe_layers=spec.get("moe_layers", spec["layers"]) if experts else 0,
        d_model=h,
        d_ffn=spec.get("moe_ffn") or ffn,
        d_ffn_dense=ffn,
        n_experts=max(experts, 1),
        top_k=spec.get("top_k", 1),
        n_mat=3 if spec.get("swiglu") else 2,
        n_shared=1 if shared else 0,
        d_ffn_shared=shared,
        n_heads=spec["heads"],
        n_kv_heads=spec.get("kv_heads"),
        head_dim=spec.get("head_dim") or h // spec["heads"],
        vocab=spec["vocab"],
        tie_embeddings=not spec.get("untie", False),
        attn_params="mla" if mla else "gqa",
        mla=MLA(**mla) if mla else None,
        family="megatron-test",
        source="Megatron-LM tests/functional_tests/test_cases/<model>/<case>/model_config.yaml",
    )
