"""Real routing traces: train a small MoE transformer on CPU, *without* an auxiliary balance
loss, on offline text (the Python standard library's source, components/training/text_data.py), and
record every MoE layer's per-expert token counts at every step (Piper Sec. VI, Fig. 9: load
imbalance over training comes from the router itself when nothing balances it).

The model is components/model/moe_transformer.py's single-stage model (router -> padding-free MoE
layer); each layer's ``route`` is wrapped to count the experts it picks. The trace's micro-batch
axis is the training step; ``sources`` splits each step's sequences over that many would-be EP
ranks (consecutive sequences per rank), so the balancers can replay it.
"""

from __future__ import annotations

from typing import Callable

import torch

from moe_repro.components.provenance import produced
from moe_repro.components.model.moe_transformer import StageModule, TransformerConfig, lm_loss
from moe_repro.components.balance.routing_trace import RoutingTrace, counts_from_top_experts
from moe_repro.components.training.text_data import BYTE_VOCAB, global_batch


def fig9_config(n_experts: int = 16, top_k: int = 2, n_layers: int = 4) -> TransformerConfig:
    """Small CPU model with Piper Fig. 9's expert count (16); sizes are ours, not Piper's 350M."""
    return TransformerConfig(
        vocab=BYTE_VOCAB,
        d_model=64,
        n_heads=4,
        n_layers=n_layers,
        d_ffn=64,
        n_experts=n_experts,
        top_k=top_k,
        seq_len=64,
        aux_loss_coef=0.0,
    )


def train_and_record(
    cfg: TransformerConfig,
    steps: int,
    batch: int,
    sources: int = 4,
    lr: float = 3e-3,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[RoutingTrace, list[float]]:
    """Train ``steps`` AdamW steps; return the routing trace [L, steps, sources, E] and losses.
    ``progress(done, steps)`` is called after each step (a long run can say how far it is)."""
    produced("measured")  # the routing of a real training run on this machine
    if steps <= 0 or batch <= 0 or sources <= 0 or batch % sources:
        raise ValueError("need steps, batch > 0 and batch divisible by sources")
    torch.manual_seed(seed)
    model = StageModule(cfg, list(range(cfg.n_layers)), True, True, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    counts = torch.zeros(cfg.n_layers, steps, sources, cfg.n_experts, dtype=torch.int64)
    current: dict[int, torch.Tensor] = {}

    def wrap(layer_id, layer):
        route = layer.route

        def recorded(x):
            out = route(x)
            current[layer_id] = out.top_experts.detach()
            return out

        layer.route = recorded

    for i, block in enumerate(model.layers.values()):
        # Module.__getattr__ is typed Tensor | Module: mypy cannot name the submodule's type
        wrap(i, block.moe.layer)  # type: ignore[union-attr]
    losses = []
    for step in range(steps):
        data = global_batch(seed, step, batch, cfg.seq_len)
        logits = model(data[:, :-1])
        loss = lm_loss(logits, data[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        for i in range(cfg.n_layers):  # rows are (sequence, position) flattened: sequence-major
            counts[i, step] = counts_from_top_experts(current[i], cfg.n_experts, sources)
        if progress is not None:
            progress(step + 1, steps)
    source = (
        f"real: {cfg.n_layers}-layer MoE (d_model {cfg.d_model}, {cfg.n_experts} experts, "
        f"top-{cfg.top_k}, no aux loss) trained {steps} steps x {batch} x {cfg.seq_len} bytes "
        f"of Python stdlib source on CPU, seed {seed}"
    )
    return RoutingTrace(counts, cfg.top_k, source, meta={"losses": losses}), losses
