"""Expert-migration cost model (Piper Sec. VI-A, Table IV).

Moving an expert moves its weights together with everything training keeps per weight. Piper
counts 16 bytes per parameter (fp32 master copy, Adam's two moments and the gradient, with
bf16 working weights folded in) and 3 d_model x d_ffn parameters per expert (a SwiGLU FFN), so
one expert costs 48 d_model d_ffn bytes. In the worst case, a complete reassignment of one
layer's E experts over G GPUs, each GPU sends E/G experts:

    send_bytes_per_gpu = bytes_per_param * n_mat * E * d_model * d_ffn / G        (Table IV)
    latency_s          = send_bytes_per_gpu / bandwidth_bytes_per_s

Table IV uses G = 8 and 50 GB/s (average intra-node all-to-all bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bytes of training state per parameter that move with an expert (Piper Sec. VI-A).
PIPER_BYTES_PER_PARAM = 16
#: Matrices per expert that Piper's formula charges (3: SwiGLU), whatever the model's FFN.
PIPER_N_MAT = 3


def expert_state_bytes(
    d_model: int, d_ffn: int, n_mat: int = PIPER_N_MAT, bytes_per_param: int = PIPER_BYTES_PER_PARAM
) -> int:
    """Bytes moved when one expert migrates: its weights and their training state."""
    _check_positive(d_model=d_model, d_ffn=d_ffn, n_mat=n_mat, bytes_per_param=bytes_per_param)
    return bytes_per_param * n_mat * d_model * d_ffn


def worst_case_send_bytes_per_gpu(
    n_experts: int,
    d_model: int,
    d_ffn: int,
    gpus: int,
    n_mat: int = PIPER_N_MAT,
    bytes_per_param: int = PIPER_BYTES_PER_PARAM,
) -> float:
    """Bytes each GPU sends when all E experts of a layer are reassigned over G GPUs.

    E need not divide by G (Table IV does not require it); the result is then the average.
    """
    _check_positive(n_experts=n_experts, gpus=gpus)
    return expert_state_bytes(d_model, d_ffn, n_mat, bytes_per_param) * n_experts / gpus


def migration_latency_s(send_bytes: float, bandwidth_bytes_per_s: float) -> float:
    """Time to send ``send_bytes`` at a sustained bandwidth (no latency term, as in Table IV)."""
    if bandwidth_bytes_per_s <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth_bytes_per_s}")
    if send_bytes < 0:
        raise ValueError(f"send_bytes must be non-negative, got {send_bytes}")
    return send_bytes / bandwidth_bytes_per_s


def moves_send_bytes_per_gpu(
    moves: list[tuple[int, int]],
    d_model: int,
    d_ffn: int,
    gpus: int,
    n_mat: int = PIPER_N_MAT,
    bytes_per_param: int = PIPER_BYTES_PER_PARAM,
) -> list[int]:
    """Bytes each GPU sends for a list of (source_gpu, destination_gpu) expert moves.

    This is what an incremental migration (Alg. 2 swaps: two moves per swap) costs; the
    migration takes as long as the busiest sender.
    """
    per_expert = expert_state_bytes(d_model, d_ffn, n_mat, bytes_per_param)
    sent = [0] * gpus
    for src, dst in moves:
        if not (0 <= src < gpus and 0 <= dst < gpus):
            raise ValueError(f"move {src}->{dst} outside 0..{gpus - 1}")
        if src != dst:
            sent[src] += per_expert
    return sent


@dataclass(frozen=True)
class MigrationCost:
    send_bytes_per_gpu: float
    latency_s: float


def worst_case_migration(
    n_experts: int,
    d_model: int,
    d_ffn: int,
    gpus: int = 8,
    bandwidth_bytes_per_s: float = 50e9,
    n_mat: int = PIPER_N_MAT,
    bytes_per_param: int = PIPER_BYTES_PER_PARAM,
) -> MigrationCost:
    send = worst_case_send_bytes_per_gpu(n_experts, d_model, d_ffn, gpus, n_mat, bytes_per_param)
    return MigrationCost(send, migration_latency_s(send, bandwidth_bytes_per_s))


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
