"""The registry of MoE implementations (components/moe/impls.py): what each declares it
supports, and the suites refusing by those declarations instead of by name."""

from __future__ import annotations

import pytest

from moe_repro.components.moe.impls import MOE_IMPLS, get_impl, impl_names
from moe_repro.components.moe.moe_layer import MoEConfig, MoELayer
from moe_repro.components.moe.pft import DROP_POLICIES


def test_ours_and_every_peer_form_are_registered():
    assert impl_names() == (
        "pft",
        "padded",
        "megatron",
        "megatron-nodrop",
        "deepspeed",
        "deepspeed-einsum",
    )
    assert impl_names(form="peer") == (
        "megatron",
        "megatron-nodrop",
        "deepspeed",
        "deepspeed-einsum",
    )
    for impl in MOE_IMPLS.values():
        assert impl.drop_policy is None or impl.drop_policy in DROP_POLICIES
        assert set(impl.layer_options) <= set(MoEConfig.__dataclass_fields__)
    with pytest.raises(ValueError, match="impl must be one of pft, padded"):
        get_impl("tutel")


@pytest.mark.parametrize(
    "name, point, refused",
    [
        ("deepspeed-einsum", dict(ranks=2, stage="layer"), "one rank only"),
        ("padded", dict(backward=True, stage="layer"), "no backward"),
        ("megatron", dict(ranks=4, stage="expert"), "whole layer"),
        ("pft", dict(backward=True, stage="expert"), "whole layer"),
        ("pft", dict(ranks=4, stage="expert"), None),
        ("megatron", dict(stage="dispatch_a2a"), "has stages"),
        ("deepspeed", dict(ranks=4, backward=True, stage="layer"), None),
        ("pft", dict(dtype="float16"), "runs in float32, bfloat16"),
    ],
)
def test_supports_answers_from_the_declarations(name, point, refused):
    why = get_impl(name).supports(**point)
    assert (why is None) if refused is None else (refused in why)


def test_capacity_arithmetic_is_each_implementations_own():
    # S=400, E=8, k=1, c=1.1: exactly 55; float arithmetic lands on 56 (moe_layer.expert_capacity)
    assert get_impl("pft").capacity(400, 8, 1, 1.1) == 55
    assert get_impl("megatron").capacity(400, 8, 1, 1.1) == 56
    assert get_impl("megatron-nodrop").capacity(400, 8, 1, 1.1) is None


def test_the_suites_refuse_by_the_registry():
    from moe_repro.suites.moe_layer import SUITE

    with pytest.raises(ValueError, match="one rank only"):
        SUITE.grid({"impl": ["deepspeed-einsum"], "ranks": [2], "stage": ["layer"]})
    with pytest.raises(ValueError, match="no backward"):
        SUITE.grid({"impl": ["padded"], "backward": [1]})
    # backward with no stage given: the whole layer only
    assert {p["stage"] for p in SUITE.grid({"impl": ["pft"], "backward": [1]})} == {"layer"}


def test_a_layer_from_its_config():
    cfg = MoEConfig(8, 4, 4, 2, capacity_factor=1.25, drop_policy="position")
    layer = MoELayer.from_config(cfg)
    assert (layer.d_model, layer.num_experts, layer.top_k) == (8, 4, 2)
    assert layer.capacity_factor == 1.25 and layer.drop_policy == "position"
    with pytest.raises(ValueError, match="drop_policy"):
        MoELayer.from_config(cfg.replace(drop_policy="lottery"))
