"""A grade that is not ``seed-dependent`` must not depend on which seeds it was computed at
(records/grading.py: a sampled cell is graded on MIN_SEEDS seeds; a grade that differs between
them is seed-dependent). feplb-table3 and feplb-table4 are run at seed 0 and at seed 5 (the
windows the policy's seed test compares): every cell that is not seed-dependent in either run
has the same grade in both.

To stay near a minute on a 2-core machine the traces are smaller than the defaults (256 tokens
per EP rank and micro-batch, 6 layers of 3 micro-batches instead of 4,096 tokens and 18 layers
of 4): the same code and the same grading path, on noisier traces, which makes a flip more
likely, not less.
"""

import pytest

from moe_repro.reproductions import feplb_table3, feplb_table4

PARAMS = {"tokens": 256, "layers": 6, "micro_batches": 3}


def _grades(module, seed: int) -> dict:
    result = module.REPRODUCTION.run({**PARAMS, "seed": seed})
    return {(c.row, c.column): c.verdict for c in result.cells}


@pytest.mark.parametrize(
    "module", [feplb_table3, feplb_table4], ids=["feplb-table3", "feplb-table4"]
)
def test_grades_hold_on_another_seed_window(module):
    first, second = _grades(module, 0), _grades(module, 5)
    assert first.keys() == second.keys()
    stable = [key for key in first if "seed-dependent" not in (first[key], second[key])]
    # the test must be able to fail: some cells are graded in both runs, not all seed-dependent
    assert any(
        first[k] in ("match", "close", "deviates", "claim-holds", "claim-fails") for k in stable
    )
    flipped = {k: (first[k], second[k]) for k in stable if first[k] != second[k]}
    assert not flipped, f"grades that changed with the seed set: {flipped}"
