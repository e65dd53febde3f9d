"""History by commit on the site (issue 51): a planted 2x regression in one suite between two
commits is flagged on the index for exactly that suite and on its page; A/A runs flag nothing;
every history point links to the stored run it came from; machines are drawn apart; a
reproduction's page follows its agreeing cells and the cells that moved."""

from __future__ import annotations

import re

from linkcheck import broken_links
from moe_repro.records.environment import collect_environment
from moe_repro.records.record import Cell, ReproductionRecord, SuiteRecord
from moe_repro.records.store import ResultsStore
from moe_repro.reports import site

SIZES = (256, 512, 1024)
# a spread of +-2% around each value, as repeated runs on one machine show
NOISE = (1.0, 1.02, 0.98)


def suite_run(
    suite: str, commit: str, when: str, slower: float = 1.0, host: str = "box-a"
) -> SuiteRecord:
    env = collect_environment(["repro", "bench", suite])
    env.update(
        timestamp=when,
        git_commit=commit,
        git_dirty=False,
        hostname=host,
        device="Test CPU",
        cpu_model="Test CPU",
        # an idle machine's (this machine's own load must not make the gate call a change noisy)
        noise={"load_start": [0.2] * 3, "load_end": [0.3] * 3, "cpu_count": 2, "loaded": False},
    )
    records = [
        {"suite": suite, "n": n, "time_s": slower * n * 1e-6, "gflops": 2 * n**3 / (slower * n)}
        for n in SIZES
    ]
    return SuiteRecord(
        suite=suite,
        params=["n"],
        metrics=[
            {"name": "time_s", "unit": "s", "better": "lower"},
            {"name": "gflops", "unit": "GFLOP/s", "better": "higher"},
        ],
        records=records,
        environment=env,
    )


def planted_store(path, factor: float) -> ResultsStore:
    """gemm and alltoall, 3 runs at commit aaaa then 3 at commit bbbb (+-2% noise each); gemm
    is ``factor`` times slower at bbbb, alltoall the same."""
    store = ResultsStore(path)
    for i, (commit, slow) in enumerate([("aaaa111", 1.0)] * 3 + [("bbbb222", factor)] * 3):
        when = f"2026-03-0{i + 1}T10:00:00+00:00"
        noise = NOISE[i % 3]
        store.save(suite_run("gemm", commit, when, slower=slow * noise))
        store.save(suite_run("alltoall", commit, when, slower=noise))
    return store


def flagged_tiles(index: str) -> dict[str, list[str]]:
    tiles = re.findall(r'<li class="tile([^"]*)"><a href="[^"]*">([^<]+)</a>', index)
    out: dict[str, list[str]] = {}
    for classes, name in tiles:
        out.setdefault(classes.strip() or "none", []).append(name)
    return out


def test_a_planted_2x_regression_is_flagged_for_exactly_that_suite(tmp_path):
    store = planted_store(tmp_path / "results", factor=2.0)
    out = tmp_path / "site"
    index = site.build_site(store, out).read_text()
    tiles = flagged_tiles(index)
    assert tiles.get("regression") == ["gemm"], tiles
    assert "alltoall" in tiles.get("none", []), tiles
    assert "improvement" not in tiles, tiles
    page = (out / "suites" / "gemm.html").read_text()
    assert 'class="flag regression"' in page and "bbbb222" in page
    # the regression names the commit it starts at and the factor, in words
    changes = re.search(r'<ul class="changes">(.*?)</ul>', page, re.S).group(1)
    assert "regression" in changes and "2.0" in changes and "bbbb222" in changes
    calm = (out / "suites" / "alltoall.html").read_text()
    assert 'class="flag regression"' not in calm and "no change point" in calm
    # the compare page: bbbb222 against aaaa111, gemm's time slower, nothing of alltoall's
    compare = (out / "compare.html").read_text()
    moved = re.findall(r'<tr class="(\w+)"><td>suite (\w+)</td><td>(\w+)</td>', compare)
    assert {(v, s, m) for v, s, m in moved if v == "slower"} == {
        ("slower", "gemm", "time_s"),
        ("slower", "gemm", "gflops"),
    }, moved
    assert all(s == "gemm" for v, s, m in moved if v != "same"), moved
    assert broken_links(out) == []


def test_a_store_of_aa_runs_flags_nothing(tmp_path):
    store = planted_store(tmp_path / "results", factor=1.0)
    index = site.build_site(store, tmp_path / "site").read_text()
    tiles = flagged_tiles(index)
    assert set(tiles) == {"none"} and {"gemm", "alltoall"} <= set(tiles["none"]), tiles
    assert 'class="flag none">no change point' in index
    compare = (tmp_path / "site" / "compare.html").read_text()
    assert "Nothing moved past the gate" in compare and 'class="slower"' not in compare


def test_history_points_link_to_their_stored_runs_and_machines_are_apart(tmp_path):
    store = ResultsStore(tmp_path / "results")
    store.save(suite_run("gemm", "aaaa111", "2026-03-01T10:00:00+00:00", host="box-a"))
    store.save(suite_run("gemm", "bbbb222", "2026-03-02T10:00:00+00:00", host="box-a"))
    store.save(suite_run("gemm", "bbbb222", "2026-03-02T11:00:00+00:00", slower=3, host="box-b"))
    out = tmp_path / "site"
    site.build_site(store, out)
    page = (out / "suites" / "gemm.html").read_text()
    history = page[page.index('<section id="history">') :]
    links = set(re.findall(r'<a href="(\.\./runs/suites/gemm/[^"]+\.json)"', history))
    assert len(links) == 3, links  # one stored run each
    for link in links:
        assert (out / "suites" / link).resolve().is_file()
    # one chart per machine and metric, each labelled by its machine; x labels are commits
    charts = re.findall(r"<strong>(time_s by commit on [^<]+)\.</strong>", history)
    assert sorted(charts) == [
        "time_s by commit on box-a (Test CPU)",
        "time_s by commit on box-b (Test CPU)",
    ]
    svg = re.search(r"<svg class=\"history\".*?</svg>", history, re.S).group(0)
    assert ">aaaa111<" in svg and ">bbbb222<" in svg
    # box-b's 3x slower run is another machine, not a regression of box-a's line
    assert 'class="flag regression"' not in page


def repro_run(commit: str, when: str, verdict: str) -> ReproductionRecord:
    env = collect_environment(["repro", "run", "piper-table4"])
    env.update(timestamp=when, git_commit=commit, hostname="box-a")
    cells = [
        Cell(row="A", column="x", paper=1.0, ours=1.0, unit="ms", verdict="match", how="A"),
        Cell(
            row="B",
            column="x",
            paper=2.0,
            ours=2.0 if verdict == "match" else 3.0,
            unit="ms",
            verdict=verdict,
            how="A",
        ),
    ]
    return ReproductionRecord(
        id="piper-table4", paper="piper", element="Table IV", how="A", cells=cells, environment=env
    )


def test_a_reproduction_page_follows_its_cells_by_commit(tmp_path):
    store = ResultsStore(tmp_path / "results")
    store.save(repro_run("aaaa111", "2026-03-01T10:00:00+00:00", "match"))
    store.save(repro_run("bbbb222", "2026-03-02T10:00:00+00:00", "deviates"))
    out = tmp_path / "site"
    site.build_site(store, out)
    page = (out / "repro" / "piper-table4.html").read_text()
    history = page[page.index('<section id="history">') :]
    assert "2 stored runs over 2 commits on 1 machine" in history
    # the cell that moved is listed with its grade change; the other is counted as unchanged
    assert re.search(
        r"B &middot; x</td>.*?match</span> &rarr; <span class=\"grade deviates\"", history, re.S
    )
    assert "1 of 2 cells changed" in history
    assert history.count('href="../runs/reproductions/piper-table4/') >= 2


def test_noise_context_is_shown_beside_the_numbers_and_a_loaded_run_is_flagged(tmp_path):
    calm = suite_run("gemm", "aaaa111", "2026-03-01T10:00:00+00:00")
    # as records/environment.noise_context stores it
    calm.environment.noise = {
        "load_start": [0.5, 0.4, 0.3],
        "load_end": [0.7, 0.5, 0.3],
        "cpu_count": 2,
        "cpu_time_s": 1.5,
        "loaded": False,
    }
    page = site.write_suite_page(tmp_path / "calm", "gemm", [calm]).read_text()
    noise = re.search(r'<p class="noise">(.*?)</p>', page, re.S)
    assert (
        noise
        and "load 0.5 at the start, 0.7 at the end on 2 cores" in noise.group(1)
        and "1.5 s" in noise.group(1)
    )
    assert "loaded" not in noise.group(1)

    busy = suite_run("gemm", "aaaa111", "2026-03-01T10:00:00+00:00")
    busy.environment.noise = {"load_start": [9.0, 6.0, 3.0], "load_end": [12.0], "cpu_count": 2}
    page = site.write_suite_page(tmp_path / "busy", "gemm", [busy]).read_text()
    noise = re.search(r'<p class="noise warn">(.*?)</p>', page, re.S)
    assert noise and "<strong>loaded</strong>" in noise.group(1), page[:3000]
    # the stored-runs list says it too
    assert "loaded (load above the core count)" in page
