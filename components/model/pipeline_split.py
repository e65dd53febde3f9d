"""Which layers each pipeline stage holds: the project's one stage split.

Contiguous layer ranges, as even as possible: the first ``L mod PP`` stages take one layer more
(Megatron-LM's even split; Piper Eq. 9 asks for at least one layer per stage). ``first`` and
``last`` optionally fix the layer counts of the first and the last stage, as Megatron-LM's
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` do (to give
the stages that also hold the embedding or the output head fewer layers); the stages between
them then share the remaining layers by the same even rule.

Piper's planner and the parallelism planner (components/resources) count each stage's layers
with it, and the PP x EP trainer (components/training) builds its stages from it, so the
planned and the trained split are the same split. No torch: the planners import it.
"""

from __future__ import annotations


def stage_sizes(
    n_layers: int, n_stages: int, first: int | None = None, last: int | None = None
) -> list[int]:
    """Layers per stage, first stage first (see the module docstring for the rule)."""
    if n_layers <= 0 or n_stages <= 0:
        raise ValueError(
            f"the layer count L and the stages PP must be positive, got L={n_layers}, PP={n_stages}"
        )
    if n_stages > n_layers:
        raise ValueError(
            f"PP={n_stages} exceeds the layer count L={n_layers} "
            f"(Piper Eq. 9: at least one layer per stage)"
        )
    for name, n in (("first", first), ("last", last)):
        if n is not None and n < 1:
            raise ValueError(f"the {name} stage must hold at least one layer, got {n}")
    if n_stages == 1:
        if any(n is not None and n != n_layers for n in (first, last)):
            raise ValueError(
                f"one stage holds all L={n_layers} layers, got first={first}, last={last}"
            )
        return [n_layers]
    fixed = {i: n for i, n in ((0, first), (n_stages - 1, last)) if n is not None}
    free = [i for i in range(n_stages) if i not in fixed]
    rest = n_layers - sum(fixed.values())
    if rest < len(free) or (not free and rest != 0):
        raise ValueError(
            f"first={first}, last={last} leave {rest} layer(s) of L={n_layers} for "
            f"{len(free)} other stage(s) (each needs at least one, and all must be placed)"
        )
    base, extra = divmod(rest, len(free)) if free else (0, 0)
    sizes = dict(fixed)
    for j, i in enumerate(free):
        sizes[i] = base + (1 if j < extra else 0)
    return [sizes[i] for i in range(n_stages)]


def stage_layers(
    n_layers: int, n_stages: int, first: int | None = None, last: int | None = None
) -> list[range]:
    """Each stage's contiguous range of layer indices (the sizes of :func:`stage_sizes`)."""
    out, start = [], 0
    for n in stage_sizes(n_layers, n_stages, first, last):
        out.append(range(start, start + n))
        start += n
    return out
