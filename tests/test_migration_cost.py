import pytest

from moe_repro.components.balance.migration_cost import (
    expert_state_bytes,
    migration_latency_s,
    moves_send_bytes_per_gpu,
    worst_case_migration,
    worst_case_send_bytes_per_gpu,
)


def test_one_expert_is_48_d_f_bytes():
    # 3 matrices x 2 x 3 params x 16 B = 288 B
    assert expert_state_bytes(2, 3) == 288
    # a two-matrix FFN: 2 x 2 x 3 x 16 = 192 B
    assert expert_state_bytes(2, 3, n_mat=2) == 192


def test_worst_case_by_hand():
    # Switch-Base: 48 * 128 * 768 * 2048 / 8, worked by hand: 16 experts per GPU x 75,497,472 B
    assert worst_case_send_bytes_per_gpu(128, 768, 2048, 8) == 1_207_959_552
    # Mixtral 8x7B: one expert per GPU: 48 * 4096 * 14336
    assert worst_case_send_bytes_per_gpu(8, 4096, 14336, 8) == 2_818_572_288


def test_uneven_experts_per_gpu_is_the_average():
    assert worst_case_send_bytes_per_gpu(3, 1, 1, 2) == pytest.approx(48 * 3 / 2)


def test_latency_at_bandwidth():
    assert migration_latency_s(1e9, 50e9) == pytest.approx(0.02)
    cost = worst_case_migration(8, 4096, 14336, gpus=8, bandwidth_bytes_per_s=50e9)
    assert cost.latency_s == pytest.approx(2_818_572_288 / 50e9)


def test_incremental_moves_charge_the_sender():
    # two swaps between GPUs 0<->1 and one move 2->0, per-expert 48 B (d=f=1)
    sent = moves_send_bytes_per_gpu([(0, 1), (1, 0), (2, 0), (3, 3)], 1, 1, gpus=4)
    assert sent == [48, 48, 48, 0]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n_experts=0, d_model=1, d_ffn=1, gpus=1),
        dict(n_experts=1, d_model=1, d_ffn=1, gpus=0),
        dict(n_experts=1, d_model=-1, d_ffn=1, gpus=1),
    ],
)
def test_rejects_nonpositive_sizes(kwargs):
    with pytest.raises(ValueError):
        worst_case_send_bytes_per_gpu(**kwargs)


def test_rejects_bad_bandwidth_and_moves():
    with pytest.raises(ValueError):
        migration_latency_s(1.0, 0)
    with pytest.raises(ValueError):
        moves_send_bytes_per_gpu([(0, 5)], 1, 1, gpus=4)
