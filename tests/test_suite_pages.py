"""Suite pages answer questions (issue 16): the latest run's headline metrics against its swept
parameter, a compact table of what varies, the shared parameters once, the device that ran, and
history figures that work from one stored run to many, on a date axis."""

from __future__ import annotations

import re

import pytest

from moe_repro.records.environment import collect_environment
from moe_repro.records.record import SuiteRecord
from moe_repro.records.store import ResultsStore
from moe_repro.reports import figures, site

SIZES = (1024, 4096, 16384, 65536, 1048576)
METRICS = [
    {"name": "time_s", "unit": "s", "better": "lower"},
    {"name": "inter_node_bytes", "unit": "B", "better": "lower"},
    {"name": "busbw_GBps", "unit": "GB/s", "better": "higher"},
]


def a2a_run(when: str, algos=("flat", "halo"), sizes=SIZES, slower: float = 1.0) -> SuiteRecord:
    env = collect_environment(["repro", "bench", "alltoall"])
    env.update(timestamp=when, device="Test GPU 9000", device_type="cuda", cpu_model="Test CPU")
    records = []
    for i, algo in enumerate(algos):
        for size in sizes:
            t = slower * (1e-5 + size / 1e9) * (1 + i)
            records.append(
                {
                    "suite": "alltoall",
                    "nodes": 2,
                    "algo": algo,
                    "sizes": size,
                    "tokens": size // 256,
                    "dtype": "float32",
                    "device": "auto",
                    "time_s": t,
                    "time_s_iqr": t / 10,
                    "time_s_min": t * 0.9,
                    "time_s_max": t * 1.3,
                    "inter_node_bytes": 3 * size,
                    "busbw_GBps": size / t / 1e9,
                    "busbw_GBps_iqr": 0.1,
                    "wrong": 0,
                    "correct": True,
                    "samples": {"time_s": [t, t]},
                }
            )
    return SuiteRecord(
        suite="alltoall",
        description="synthetic all-to-all",
        params=["nodes", "algo", "sizes", "tokens", "dtype", "device"],
        metrics=METRICS,
        records=records,
        environment=env,
    )


@pytest.fixture
def drawn(monkeypatch):
    """The axes of every figure rendered while the test runs, looked at before they close."""
    seen = []
    real_close = figures.plt.close

    def keep(f):
        seen.append(f.axes[0])
        real_close(f)

    monkeypatch.setattr(figures.plt, "close", keep)
    return seen


def test_sweep_figure_plots_each_headline_metric_against_the_swept_parameter(tmp_path):
    run = a2a_run("2026-01-05T10:00:00+00:00")
    assert [m.name for m in site.headline_metrics(run)] == ["time_s", "busbw_GBps"]
    assert site.swept_param(run) == "sizes"  # 5 values; tokens moves with it, algo is a string
    fig = site.sweep_figure("alltoall", run.metrics[0], run)
    assert [s["label"] for s in fig["series"]] == ["flat", "halo"]  # tokens makes no extra lines
    assert fig["xscale"] == "log" and fig["xticks"] == list(SIZES) and fig["xticks_binary"]
    assert fig["ylabel"].startswith("time_s [ms]")  # 11 us .. 2.1 ms: drawn in ms
    flat = fig["series"][0]
    assert flat["x"] == list(SIZES) and all(
        lo < y < hi for lo, y, hi in zip(flat["lo"], flat["y"], flat["hi"])
    )
    assert "tokens changes with sizes" in fig["caption"]


def test_suite_page_has_figure_compact_table_constants_once_and_device(tmp_path):
    store = ResultsStore(tmp_path / "store")
    store.save(a2a_run("2026-01-05T10:00:00+00:00"))
    out = tmp_path / "site"
    page = site.write_suite_page(out, "alltoall", store.runs("suite", "alltoall")).read_text()
    for metric in ("time_s", "busbw_GBps"):
        assert (out / f"alltoall-sweep-{metric}.png").stat().st_size > 5000
        assert f'src="alltoall-sweep-{metric}.png"' in page
    table = re.search(r'<div class="scroll"><table class="records">(.*?)</table></div>', page, re.S)
    assert table, "the results table sits in a horizontal scroll wrapper"
    heads = [
        re.sub(r"<br>.*", "", h) for h in re.findall(r"<th(?: [^>]*)?>(.*?)</th>", table.group(1))
    ]
    assert heads == [
        "algo",
        "sizes",
        "tokens",
        "time_s",
        "IQR",
        "busbw_GBps [GB/s]",
        "IQR",
        "#wrong",
    ]
    assert len(re.findall(r"<tr>", table.group(1))) == 1 + 2 * len(SIZES)
    # the parameters every record shares: once, above the table, not as columns
    for shared in ("nodes=2", "dtype=float32"):
        assert page.count(shared) == 1
    assert "device=auto (ran on Test GPU 9000, cuda)" in page  # the device that ran, not "auto"
    assert "Test CPU" in page
    # people's numbers: separators, units, no scientific notation for these
    assert "1,048,576" in page and " ms<" in page and "e+0" not in table.group(1)
    assert (out / "alltoall.json").exists() and 'href="alltoall.csv"' in page


def test_suite_page_shows_the_summary_stored_with_the_run_and_old_runs_load_without_one(tmp_path):
    """The suite's own summary lines (Suite.summary, stored in the record when the run was
    written) appear on its page as a list; a run stored before the record had them loads with
    none, and its page has no summary list."""
    import json

    lines = [
        "mpi rbd: median |error| 9.1% over 12 cells, worst 19.9% (within the 15% goal)",
        "gloo rbd: median |error| 22.2% over 12 cells, worst 50.4% (above the 15% goal)",
    ]
    run = a2a_run("2026-01-05T10:00:00+00:00").model_copy(update={"summary": lines})
    store = ResultsStore(tmp_path / "store")
    store.save(run)
    page = site.write_suite_page(
        tmp_path / "site", "alltoall", store.runs("suite", "alltoall")
    ).read_text()
    listed = re.search(r'<ul class="summary">(.*?)</ul>', page, re.S)
    assert listed and re.findall(r"<li>(.*?)</li>", listed.group(1)) == lines

    old = json.loads(a2a_run("2026-01-06T10:00:00+00:00").model_dump_json())
    del old["summary"]
    old["schema_version"] = 2  # written before the record kept a summary
    older = tmp_path / "old"
    (older / "suites" / "alltoall").mkdir(parents=True)
    (older / "suites" / "alltoall" / "20260106T100000Z-old.json").write_text(json.dumps(old))
    (loaded,) = ResultsStore(older).runs("suite", "alltoall")
    assert loaded.summary == [] and loaded.schema_version == 3
    page = site.write_suite_page(tmp_path / "site-old", "alltoall", [loaded]).read_text()
    assert 'class="summary"' not in page


def test_bench_stores_the_suites_summary_with_its_records():
    """suite_record keeps what the suite's summary says of the records it stores."""
    from moe_repro.suites import all_suites
    from moe_repro.suites.runner import suite_record

    suite = all_suites()["alltoall-validation"]
    records = [{"backend": "mpi", "algo": "flat", "error_pct": e} for e in (-4.0, 20.0, 6.0)]
    assert (
        suite_record(suite, records).summary
        == suite.summary(records)
        == ["mpi flat: median |error| 6.0% over 3 cells, worst 20.0% (within the 15% goal)"]
    )
    assert suite_record(suite, []).summary == []


def test_history_with_one_run_is_one_point_per_grid_point(tmp_path):
    """One stored run: the history section draws its points and says a history needs more."""
    page = site.write_suite_page(
        tmp_path / "site", "alltoall", [a2a_run("2026-01-05T10:00:00+00:00")]
    ).read_text()
    history = page[page.index('<section id="history">') :]
    assert "1 stored run over 1 commit on 1 machine" in history
    assert "a history needs a second commit" in history
    assert history.count("<circle") >= 8  # the chart's lines, one point each


def test_history_with_three_runs_is_by_commit_and_caps_the_chart(tmp_path):
    """x is the commit order (labelled with commits), not a date axis; a chart draws at most 8
    grid points and the table below lists every one."""
    store = ResultsStore(tmp_path / "store")
    dates = ["2026-01-05T10:00:00+00:00", "2026-01-12T10:00:00+00:00", "2026-02-02T10:00:00+00:00"]
    for i, when in enumerate(dates):
        run = a2a_run(when, slower=1 + i / 100)
        run.environment.git_commit = f"c{i}" * 4
        store.save(run)
    runs = store.runs("suite", "alltoall")
    page = site.write_suite_page(tmp_path / "site", "alltoall", runs).read_text()
    history = page[page.index('<section id="history">') :]
    assert "3 stored runs over 3 commits" in history
    assert all(f">{c}<" in history for c in ("c0c0c0c", "c1c1c1c", "c2c2c2c"))
    assert "8 of 10 grid points (every one is in the table below)" in history
    assert "Every grid point by commit (20)" in history  # 10 points x 2 metrics


def test_nothing_numeric_swept_gives_a_dot_per_category(tmp_path, drawn):
    run = a2a_run("2026-01-05T10:00:00+00:00", algos=("flat", "halo", "rbd"), sizes=(4096,))
    fig = site.sweep_figure("alltoall", run.metrics[0], run)
    assert fig["kind"] == "dots" and [c["label"] for c in fig["categories"]] == [
        "flat",
        "halo",
        "rbd",
    ]
    assert figures.render_figure(fig)["png"].startswith(b"\x89PNG")
    ax = drawn[0]
    top_down = sorted(
        zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())), reverse=True
    )
    assert [label for _, label in top_down] == ["flat", "halo", "rbd"]  # in run order, first on top


def test_site_build_draws_suite_sweeps_and_wraps_every_table(tmp_path):
    store = ResultsStore(tmp_path / "store")
    env = collect_environment(["repro", "bench", "gemm"])
    records = [
        {
            "suite": "gemm",
            "n": n,
            "dtype": "float32",
            "device": "auto",
            "time_s": n**3 / 1e10,
            "time_s_iqr": 1e-6,
            "tflops": 2 * n**3 / (n**3 / 1e10) / 1e12,
            "wrong": 0,
        }
        for n in (64, 128, 256, 512, 1024, 2048, 4096, 8192)
    ]
    store.save(
        SuiteRecord(
            suite="gemm",
            params=["n", "dtype", "device"],
            records=records,
            metrics=[
                {"name": "time_s", "unit": "s", "better": "lower"},
                {"name": "tflops", "unit": "TFLOP/s", "better": "higher"},
            ],
            environment=env,
        )
    )
    out = tmp_path / "site"
    index = site.build_site(store, out).read_text()
    page = (out / "suites" / "gemm.html").read_text()
    assert (out / "suites" / "gemm-sweep-time_s.png").exists() and "gemm-sweep-tflops.svg" in page
    for html_page in (index, page):
        assert html_page.count("<table") == html_page.count('<div class="scroll"><table') > 0
    assert "ran on " + env["device"] in page


def test_a_rescaled_column_names_the_stored_unit_and_the_one_shown(tmp_path):
    """A gemm run on a CPU stores tflops near 1e-4: the column shows MFLOP/s, and its head says
    the metric is stored in TFLOP/s (not "tflops [MFLOP/s]", which reads as two units)."""
    store = ResultsStore(tmp_path / "store")
    store.save(
        SuiteRecord(
            suite="gemm",
            params=["n", "dtype", "device"],
            records=[
                {
                    "suite": "gemm",
                    "n": n,
                    "dtype": "float32",
                    "device": "cpu",
                    "time_s": 1.0,
                    "tflops": 1.371e-4 * n / 64,
                    "wrong": 0,
                }
                for n in (64, 128)
            ],
            metrics=[
                {"name": "time_s", "unit": "s", "better": "lower"},
                {"name": "tflops", "unit": "TFLOP/s", "better": "higher"},
            ],
            environment=collect_environment(["repro", "bench", "gemm"]),
        )
    )
    site.build_site(store, tmp_path / "site")
    page = (tmp_path / "site" / "suites" / "gemm.html").read_text()
    heads = re.findall(r"<th[^>]*>(.*?)</th>", page, flags=re.S)
    assert any("tflops [TFLOP/s, shown in MFLOP/s]" in h for h in heads), heads
    assert not any("tflops [MFLOP/s]" in h for h in heads)
    assert "137" in page and "274" in page  # the values, in MFLOP/s
