"""The one stage split (components/model/pipeline_split.py): even, contiguous, complete, and
the optional first/last stage sizes of Megatron-LM's uneven pipeline."""

import pytest

from moe_repro.components.model.pipeline_split import stage_layers, stage_sizes


@pytest.mark.parametrize("L, PP", [(4, 1), (4, 2), (5, 2), (7, 3), (4, 4), (61, 8)])
def test_even_split_is_contiguous_complete_and_front_loaded(L, PP):
    ranges = stage_layers(L, PP)
    assert [i for r in ranges for i in r] == list(range(L))
    sizes = stage_sizes(L, PP)
    assert sizes == [len(r) for r in ranges]
    assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1


def test_first_and_last_stage_sizes_are_fixed_and_the_middle_shares_the_rest():
    assert stage_sizes(10, 4, first=1, last=1) == [1, 4, 4, 1]
    assert stage_sizes(11, 4, first=2) == [2, 3, 3, 3]
    assert stage_sizes(9, 4, last=1) == [3, 3, 2, 1]
    assert stage_sizes(5, 2, first=2, last=3) == [2, 3]
    assert stage_sizes(6, 1, first=6, last=6) == [6]
    assert [list(r) for r in stage_layers(6, 3, first=1, last=2)] == [[0], [1, 2, 3], [4, 5]]


@pytest.mark.parametrize(
    "L, PP, first, last, match",
    [
        (2, 3, None, None, "exceeds the layer count"),
        (4, 0, None, None, "must be positive"),
        (4, 3, 3, None, "leave 1 layer"),
        (4, 2, 1, 2, "all must be placed"),
        (4, 2, 0, None, "at least one layer"),
        (4, 1, 3, None, "one stage holds all"),
    ],
)
def test_impossible_splits_raise_value_error(L, PP, first, last, match):
    with pytest.raises(ValueError, match=match):
        stage_sizes(L, PP, first, last)
