"""Pipelined host-state AdamW (MoP Sec. 3.5) vs torch.optim.AdamW: bitwise after several steps."""

import pytest
import torch

from moe_repro.components.training.host_optimizer import HostPipelinedAdamW


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(13, 37),
        torch.nn.GELU(),
        torch.nn.Linear(37, 29),
        torch.nn.GELU(),
        torch.nn.Linear(29, 5),
    )


def _batches(seed, steps):
    g = torch.Generator().manual_seed(seed + 100)
    return [
        (torch.randn(11, 13, generator=g), torch.randn(11, 5, generator=g)) for _ in range(steps)
    ]


def _train(model, opt, batches, frozen_at=None):
    for step, (x, y) in enumerate(batches):
        frozen = frozen_at is not None and step == frozen_at
        model[2].bias.requires_grad_(not frozen)  # no gradient this step: no update, own step count
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        if isinstance(opt, HostPipelinedAdamW):
            with_grad = sum(p.grad is not None for p in opt.params)
            # with overlap every update was queued by backward's hooks, before step() was called
            assert opt.queued_during_backward == (with_grad if opt._hooks else 0)
        opt.zero_grad()


@pytest.mark.parametrize(
    "seed,chunk,workers,overlap,wd",
    [
        (0, 7, 1, False, 0.01),  # chunks of 7: no parameter size is a multiple of it
        (1, 64, 2, True, 0.1),  # two worker threads, updates started during backward
        (2, 1 << 16, 2, True, 0.0),  # one chunk per parameter, no weight decay
        (3, 100, 2, False, 0.05),
    ],
)
def test_bitwise_equal_to_torch_adamw(seed, chunk, workers, overlap, wd):
    steps, kw = 6, dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-7, weight_decay=wd)
    ref_model, our_model = _model(seed), _model(seed)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), foreach=False, **kw)
    our_opt = HostPipelinedAdamW(our_model.parameters(), chunk_elems=chunk, workers=workers, **kw)
    if overlap:
        our_opt.overlap_with_backward()
    batches = _batches(seed, steps)
    _train(ref_model, ref_opt, batches, frozen_at=2)
    _train(our_model, our_opt, batches, frozen_at=2)
    our_opt.close()
    for (name, p_ref), p_ours in zip(ref_model.named_parameters(), our_model.parameters()):
        assert torch.equal(p_ref, p_ours), name
        st = ref_opt.state[p_ref]
        i = next(k for k, q in enumerate(our_opt.params) if q is p_ours)
        assert torch.equal(st["exp_avg"], our_opt.state[i]["exp_avg"]), name
        assert torch.equal(st["exp_avg_sq"], our_opt.state[i]["exp_avg_sq"]), name
    assert our_opt.step_count == steps


def test_close_to_default_torch_adamw_and_rejects_bad_args():
    ref_model, our_model = _model(5), _model(5)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-2)  # default implementation choice
    our_opt = HostPipelinedAdamW(our_model.parameters(), lr=1e-2, chunk_elems=50)
    batches = _batches(5, 4)
    _train(ref_model, ref_opt, batches)
    _train(our_model, our_opt, batches)
    our_opt.close()
    for p_ref, p_ours in zip(ref_model.parameters(), our_model.parameters()):
        torch.testing.assert_close(p_ours, p_ref, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="chunk_elems"):
        HostPipelinedAdamW(our_model.parameters(), chunk_elems=0)
    with pytest.raises(ValueError, match="no parameters"):
        HostPipelinedAdamW([])
