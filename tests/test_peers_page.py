"""The "moe-repro vs Megatron-core vs DeepSpeed" page: built from stored suite runs, it shows each
implementation's time per stage, the ratio to ours, the peers' versions and the check results,
and says how to produce it when nothing is stored."""

from __future__ import annotations

from moe_repro.records.environment import collect_environment
from moe_repro.records.record import SuiteRecord
from moe_repro.records.store import ResultsStore as Store
from moe_repro.reports.peers_page import write_peers_page


def stored_run(store: Store, times_ms: dict[tuple[str, str], float], peer_of: dict[str, str]) -> None:
    records = []
    for (impl, stage), ms in times_ms.items():
        t = ms / 1e3
        records.append({"suite": "moe-dispatch", "impl": impl, "stage": stage, "tokens": 64,
                        "peer": peer_of.get(impl, ""), "time_s": t, "time_s_iqr": t / 10,
                        "time_s_min": t * 0.9, "time_s_max": t * 1.2, "wrong": 0, "correct": True})
    store.save(SuiteRecord(suite="moe-dispatch", description="d", params=["impl", "stage", "tokens"],
                           metrics=[{"name": "time_s", "unit": "s", "better": "lower"}],
                           records=records, environment=collect_environment(["repro", "bench"])))


def test_page_shows_times_ratios_versions_and_checks(tmp_path):
    store = Store(tmp_path / "store")
    stored_run(store, {("pft", "gating"): 2.0, ("pft", "total"): 8.0,
                       ("megatron", "gating"): 1.0, ("megatron", "total"): 12.0,
                       ("deepspeed", "gating"): 5.0},
               {"megatron": "megatron-core==0.16.1", "deepspeed": "deepspeed==0.19.8"})
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
    assert "Not yet run" in page and 'pip install -e ".[peers]" &amp;&amp; repro bench moe-dispatch' in page
