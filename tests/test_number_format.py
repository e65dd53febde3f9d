"""Numbers for people, the same on every page and terminal table (issue 16): separators, a fixed
precision, scientific notation only for the very large and very small, and units spelled out
where the metric declares seconds or bytes ("B" is bytes, never billions)."""

from __future__ import annotations

import math

import pytest

from moe_repro.records.environment import collect_environment
from moe_repro.records.record import SuiteRecord
from moe_repro.reports import html, terminal
from moe_repro.reports.numbers import fmt, tick

CASES = [
    # (value, unit, expected)
    (None, None, "-"),
    (True, None, "true"),
    ("flat", None, "flat"),
    (0, None, "0"),
    (7, None, "7"),
    (12345, None, "12,345"),
    (-12345, None, "-12,345"),
    (1048576, None, "1,048,576"),  # an integer below 1e9 keeps every digit
    (8581545984, None, "8.582e+09"),
    (12345.6, None, "12,346"),
    (123.456, None, "123.5"),
    (1.25, None, "1.25"),
    (6144.0, None, "6,144"),
    (0.0031, None, "0.0031"),
    (0.003139068666, None, "0.003139"),
    (0.0001, None, "0.0001"),
    (3e-05, None, "3e-05"),
    (4.374e-05, None, "4.374e-05"),
    (999_999.0, None, "999,999"),
    (1234567.8, None, "1.235e+06"),
    (3.2e9, None, "3.2e+09"),
    (0.0, None, "0"),
    (math.nan, None, "nan"),
    (math.inf, None, "inf"),
    # seconds: the unit that keeps the number readable
    (0.00314, "s", "3.14 ms"),
    (1.25e-5, "s", "12.5 µs"),
    (3e-9, "s", "3 ns"),
    (2.5, "s", "2.5 s"),
    (125.0, "s", "125 s"),
    (0, "s", "0 s"),
    # bytes: binary units, spelled
    (512, "B", "512 B"),
    (1024, "B", "1 KiB"),
    (3072000.0, "B", "2.93 MiB"),
    (2**30, "B", "1 GiB"),
    (8581545984, "B", "7.99 GiB"),
    (0.0, "B", "0 B"),
    (12.345, "%", "12.35%"),
    # a unit the formatter does not scale leaves the number plain (the label carries the unit)
    (0.04886788, "GB/s", "0.04887"),
]


@pytest.mark.parametrize("value, unit, expected", CASES)
def test_formatter_table(value, unit, expected):
    assert fmt(value, unit) == expected


@pytest.mark.parametrize("value, unit, expected", [c for c in CASES if "µ" not in c[2]])
def test_html_and_terminal_share_the_formatter(value, unit, expected):
    assert html.environment().filters["num"](value, unit) == expected
    assert terminal._num(value, unit) == expected


def test_no_scientific_notation_between_1e_4_and_1e6():
    for x in (1e-4, 0.00025, 0.5, 1.0, 99.5, 1234.5, 65_536.0, 999_000.0):
        assert "e" not in fmt(x), (x, fmt(x))


@pytest.mark.parametrize(
    "value, binary, expected",
    [
        (10, False, "10"),
        (100, False, "100"),
        (1000, False, "1K"),
        (1e4, False, "10K"),
        (1e6, False, "1M"),
        (2.5e9, False, "2.5G"),
        (0.1, False, "0.1"),
        (0.001, False, "0.001"),
        (1e-5, False, "1e-05"),
        (16384, True, "16K"),
        (1048576, True, "1M"),
        (0, False, "0"),
    ],
)
def test_axis_tick_labels(value, binary, expected):
    assert tick(value, binary) == expected


def test_terminal_table_spells_seconds_and_bytes():
    run = SuiteRecord(
        suite="s",
        params=["impl"],
        environment=collect_environment(["repro"]),
        metrics=[{"name": "time_s", "unit": "s"}, {"name": "peak_bytes", "unit": "B"}],
        records=[{"impl": "pft", "time_s": 0.00314, "time_s_iqr": 0.0001, "peak_bytes": 3072000.0}],
    )
    out = terminal.format_records(run)
    header, _, row = out.splitlines()
    # the unit is in the header, the cells are numbers in it
    assert "time_s (median, ms)" in header and "peak_bytes (median, MiB)" in header
    assert "3.140" in row and "2.930" in row
    assert "e+06" not in out and "0.00314" not in out


def test_terminal_columns_share_one_unit_and_fixed_decimals():
    from moe_repro.reports.numbers import column

    # seconds: the largest value picks the unit, every cell the same decimals
    assert column([0.0001613, 0.00004194, None], "s", ascii=True) == ("us", ["161.3", "41.9", "-"])
    # a decimal-prefixed rate below 1 in its unit goes down a prefix: no 1.001e-05 GB/s
    assert column([1.001e-05, 2.5e-05], "GB/s") == ("KB/s", ["10.01", "25.00"])
    assert column([0.002484], "TFLOP/s") == ("GFLOP/s", ["2.484"])
    # bytes in a binary unit; whole numbers stay whole; no scientific notation anywhere
    assert column([3 * 2**20, 2**21], "B") == ("MiB", ["3.000", "2.000"])
    assert column([4, 128], "ranks") == ("ranks", ["4", "128"])
    name, cells = column([1e-9, 0.5, 999_999.0], None)
    assert name is None and not any("e" in c for c in cells)


def test_terminal_flags_spreads_above_half_the_median():
    run = SuiteRecord(
        suite="s",
        params=["impl"],
        environment=collect_environment(["repro"]),
        metrics=[{"name": "time_s", "unit": "s"}],
        records=[
            {"impl": "a", "time_s": 0.002, "time_s_iqr": 0.0002},
            {"impl": "b", "time_s": 0.002, "time_s_iqr": 0.0097},
        ],
    )
    lines = terminal.format_records(run).splitlines()
    assert lines[2].endswith("10.0%") and lines[3].endswith("485.0% !")
    assert lines[4].startswith("! spread (IQR / median) above 50%")
