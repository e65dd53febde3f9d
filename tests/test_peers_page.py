"""The "moe-repro vs Megatron-core vs DeepSpeed" page: built from stored suite runs, it shows each
implementation's time per stage, the ratio to ours, the peers' versions and the check results,
and says how to produce it when nothing is stored."""

from __future__ import annotations

from moe_repro.records.environment import collect_environment
from moe_repro.records.record import SuiteRecord
from moe_repro.records.store import ResultsStore as Store
from moe_repro.reports.peers_page import write_peers_page


def stored_run(
    store: Store, times_ms: dict[tuple[str, str], float], peer_of: dict[str, str]
) -> None:
    records = []
    for (impl, stage), ms in times_ms.items():
        t = ms / 1e3
        records.append(
            {
                "suite": "moe-dispatch",
                "impl": impl,
                "stage": stage,
                "tokens": 64,
                "peer": peer_of.get(impl, ""),
                "time_s": t,
                "time_s_iqr": t / 10,
                "time_s_min": t * 0.9,
                "time_s_max": t * 1.2,
                "wrong": 0,
                "correct": True,
            }
        )
    store.save(
        SuiteRecord(
            suite="moe-dispatch",
            description="d",
            params=["impl", "stage", "tokens"],
            metrics=[{"name": "time_s", "unit": "s", "better": "lower"}],
            records=records,
            environment=collect_environment(["repro", "bench"]),
        )
    )


def test_page_shows_times_ratios_versions_and_checks(tmp_path):
    store = Store(tmp_path / "store")
    stored_run(
        store,
        {
            ("pft", "gating"): 2.0,
            ("pft", "total"): 8.0,
            ("megatron", "gating"): 1.0,
            ("megatron", "total"): 12.0,
            ("deepspeed", "gating"): 5.0,
        },
        {"megatron": "megatron-core==0.16.1", "deepspeed": "deepspeed==0.19.8"},
    )
    page = write_peers_page(store, tmp_path / "site").read_text()
    assert "megatron-core==0.16.1" in page and "deepspeed==0.19.8" in page
    assert "0.50x" in page and "1.50x" in page and "2.50x" in page  # 1/2, 12/8, 5/2
    assert "12.0 (1.20)" in page  # 12 ms with its IQR, no scientific notation
    assert (tmp_path / "site" / "peers-moe-dispatch.png").stat().st_size > 1000
    assert "Traceback" not in page and "Not yet run" not in page


def test_page_without_peer_runs_says_how_to_make_them(tmp_path):
    store = Store(tmp_path / "store")
    stored_run(store, {("pft", "total"): 8.0}, {})  # a run with no peer is not a comparison
    page = write_peers_page(store, tmp_path / "site").read_text()
    assert (
        "Not yet run" in page
        and 'pip install -e ".[peers]" &amp;&amp; repro bench moe-dispatch' in page
    )


def stored_layer_run(
    store: Store, times_ms: dict[tuple[int, str], float], backward: int = 1
) -> None:
    """A moe-layer run at several ranks counts, whole-layer passes; spread: IQR t/10, min 0.9t, max 1.2t."""
    peer_of = {"megatron": "megatron-core==0.16.1", "deepspeed": "deepspeed==0.19.8"}
    records = []
    for (ranks, impl), ms in times_ms.items():
        t = ms / 1e3
        records.append(
            {
                "suite": "moe-layer",
                "impl": impl,
                "stage": "layer",
                "ranks": ranks,
                "backward": backward,
                "tokens": 256,
                "peer": peer_of.get(impl, ""),
                "time_s": t,
                "time_s_iqr": t / 10,
                "time_s_min": t * 0.9,
                "time_s_max": t * 1.2,
                "wrong": 0,
                "correct": True,
            }
        )
    store.save(
        SuiteRecord(
            suite="moe-layer",
            description="l",
            params=["impl", "stage", "ranks", "backward", "tokens"],
            metrics=[{"name": "time_s", "unit": "s", "better": "lower"}],
            records=records,
            environment=collect_environment(["repro", "bench"]),
        )
    )


def test_page_shows_multi_rank_forward_backward_ratios_per_ranks_count(tmp_path):
    store = Store(tmp_path / "store")
    stored_layer_run(
        store,
        {
            (2, "pft"): 40.0,
            (2, "megatron"): 60.0,
            (2, "deepspeed"): 100.0,
            (4, "pft"): 80.0,
            (4, "megatron"): 56.0,
            (4, "deepspeed"): 280.0,
        },
    )
    page = write_peers_page(store, tmp_path / "site").read_text()
    section = page.split("Expert-parallel layer, forward + backward")[1].split("Equivalence")[0]
    assert "No expert-parallel run stored" not in section
    rows = section.split("<tr><td>")[1:]
    assert [r.split("<")[0] for r in rows] == ["2", "4"]
    # ranks 2: 60/40 and 100/40; ranks 4: 56/80 and 280/80
    assert "1.50x" in rows[0] and "2.50x" in rows[0] and "0.70x" in rows[1] and "3.50x" in rows[1]
    assert "1.00x" in rows[0] and "1.00x" in rows[1]  # ours against itself
    assert "280 (28.0) [252-336]" in rows[1]  # median (IQR) [min-max], no scientific notation
    assert "megatron-core==0.16.1" in section and "deepspeed==0.19.8" in section


def test_multi_rank_section_leaves_out_forward_only_and_one_rank_runs(tmp_path):
    store = Store(tmp_path / "store")
    stored_layer_run(store, {(2, "pft"): 40.0, (2, "megatron"): 60.0}, backward=0)
    stored_layer_run(store, {(1, "pft"): 40.0, (1, "megatron"): 60.0}, backward=1)
    page = write_peers_page(store, tmp_path / "site").read_text()
    section = page.split("Expert-parallel layer, forward + backward")[1].split("Equivalence")[0]
    assert "No expert-parallel run stored" in section and "1.50x" not in section
