"""mop-table2's FSDP-best what-if candidates and the common-factor bounds, by hand."""

import pytest

from moe_repro.components.model.params import layer_params
from moe_repro.components.model.zoo import get_model
from moe_repro.reproductions import mop_table2 as T
from moe_repro.reproductions import all_reproductions
from moe_repro.reproductions.mop_table1 import largest_dense_layer


def test_what_if_bytes_1t_at_512k_by_hand():
    # Table 3: 1T on FSDP 3 x CP 4 x TP 8, EP 96, optimizer offloaded.
    m, S = get_model("mop-1t"), 524288
    base = T.fsdp_best_bytes(m, 3, 96, 4, 8, True, S)
    none = T.fsdp_best_bytes(m, 3, 96, 4, 8, True, S, recompute="none")
    got = T.what_if_bytes(m, 3, 96, 4, 8, True, S)
    assert got.keys() == T.WHAT_IF.keys()
    # 8 B/param instead of 2 + 2: the device state doubles.
    assert got["fp32 shards and grads on GPU"] == pytest.approx(
        base["dense state"] + base["expert state"]
    )
    # Logits N V / TP at 16 B instead of 6: 10 more bytes per logit.
    assert got["16 B per logit"] == pytest.approx(10 * (S / 4) * 163840 / 8, rel=1e-12)
    # One layer (dense / TP + 384 / 96 experts) at bf16 grads 2 B + fp32 copy 4 B.
    layer = largest_dense_layer(m) / 8 + layer_params(m, moe=True)[1] / 96
    assert got["FSDP2 gradient buffers"] == pytest.approx(6 * layer, rel=1e-12)
    ctx = base["checkpointed activations"] + base["layer working set"] + base["logits"]
    assert got["micro-batch 2"] == pytest.approx(ctx, rel=1e-12)
    assert got["checkpointing every 2nd layer"] == pytest.approx(
        (sum(none.values()) - sum(base.values())) / 2, rel=1e-12
    )


def test_what_if_fp32_shards_is_zero_without_offload():
    got = T.what_if_bytes(get_model("mop-120b"), 1, 16, 16, 1, False, 131072)
    assert got["fp32 shards and grads on GPU"] == 0.0


def test_context_factor_bounds_by_hand():
    # fits iff persistent + r ctx <= hbm: a fitting 60 + r 20 <= 100 gives r <= 2; an OOM
    # 60 + r 40 > 100 gives r > 1.
    got = T.context_factor_bounds({"a": (True, 60.0, 20.0), "b": (False, 60.0, 40.0)}, 100.0)
    assert got == pytest.approx((1.0, 2.0))
    assert T.context_factor_bounds({"a": (True, 60.0, 20.0)}, 100.0) == (0.0, 2.0)


def test_deviating_cells_say_what_was_ruled_out():
    res = all_reproductions()["mop-table2"].run()
    bad = {c.row for c in res.cells if c.verdict == "claim-fails"}
    assert bad == {"600B @ 128K", "1T @ 512K", "1T @ 1M"}
    for c in res.cells:
        if c.verdict == "claim-fails":
            assert c.column == "FSDP-best" and c.paper_printed == "OOM"
            assert "cause not found" in c.note and "micro-batch 2" in c.detail
            assert c.cause is None and c.note.startswith("ours: fits")
    text = " ".join(res.assumptions)
    assert "Candidates tested" in text and "common factor r" in text


def test_cells_and_figure_say_fits_or_oom_in_words():
    res = all_reproductions()["mop-table2"].run()
    # Table 2's OOM cells, typed from the paper (MoP Table 2), not from the module
    oom = (
        {("120B", c) for c in ("256K", "512K", "1M")}
        | {("600B", c) for c in ("128K", "256K", "512K", "1M")}
        | {("1T", c) for c in ("512K", "1M")}
    )
    rows = {tuple(c.row.split(" @ ")) for c in res.cells if c.paper_printed == "OOM"}
    assert rows == oom
    for c in res.cells:
        assert c.unit == "GB per rank" and c.reading
        assert c.note.startswith("ours: fits") or c.note.startswith("ours: OOM")
        # the policy's reading decides: OOM is over the HBM, a throughput at most the HBM
        assert ("over 141 GB" in c.reading) == (c.paper_printed == "OOM")
    (fig,) = res.figures
    assert fig.form == "bars"
    paper = [s for s in fig.series if s["kind"] == "paper"]
    assert len(paper) == 1 and {tuple(x.split(" @ ")) for x in paper[0]["oom"]} == oom
    assert all(y is None for y in paper[0]["y"])
