"""Numbers for people: one formatter for the site's pages, the terminal tables and figure ticks.

Rules (issue 16):

- thousands separators: ``12,345``; integers below 1e9 are printed exactly (``1,048,576``);
- four significant digits, trailing zeros dropped: ``0.0031``, ``123.5``, ``1.25``;
- scientific notation only at or above 1e6 (non-integers) or below 1e-4: ``3.072e+09``;
- unit-aware where the metric declares a unit: seconds become ``3.14 ms`` / ``12.5 µs``; bytes
  (unit ``B``) become binary units, ``2.93 MiB`` (1 KiB = 1,024 B, 1 MiB = 2^20 B,
  1 GiB = 2^30 B), so "B" always means bytes and never billions. Both are given to three
  significant digits. Other units (``GB/s``, ``TFLOP/s``, ``rows``) leave the number plain and
  the unit to the column or axis label.

No imports beyond the standard library: the terminal, the HTML pages and the figures share it.
"""

from __future__ import annotations

import math
from numbers import Real

DIGITS = 4  # significant digits of a plain number
UNIT_DIGITS = 3  # significant digits of a time or size in scaled units (ms, MiB)
BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
BYTES_NOTE = "bytes in binary units, 1 KiB = 1,024 B, 1 MiB = 2^20 B, 1 GiB = 2^30 B"
TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))


def is_number(x) -> bool:
    """A real number that is not a bool (True is an int to Python, not to a reader)."""
    return isinstance(x, Real) and not isinstance(x, bool)


def _strip(text: str) -> str:
    """Drop trailing zeros of a fixed-point number ("0.003100" -> "0.0031", "8.00" -> "8")."""
    if "." in text and "e" not in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _plain(x: float, digits: int) -> str:
    """``x`` (finite, non-zero, 1e-4 <= |x| < 1e6) to ``digits`` significant digits, fixed point
    with separators; the integer part is never rounded away (12,345.6 -> "12,346")."""
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return _strip(f"{x:,.{decimals}f}")


def fmt(x, unit: str | None = None, digits: int | None = None, ascii: bool = False) -> str:
    """One value as a person reads it: ``fmt(12345)`` -> "12,345", ``fmt(0.0031)`` -> "0.0031",
    ``fmt(3.2e9)`` -> "3.2e+09", ``fmt(0.00314, "s")`` -> "3.14 ms",
    ``fmt(3221225472, "B")`` -> "3 GiB". None is "-", a bool "true"/"false", a string itself.
    ``ascii`` writes "us" for microseconds (for terminals that may not take UTF-8)."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x).lower()
    if not is_number(x):
        return str(x)
    if unit == "B":
        return fmt_bytes(x)
    if unit == "s":
        return fmt_seconds(x, ascii=ascii)
    suffix = "%" if unit == "%" else ""
    return _number(x, digits or DIGITS) + suffix


def _number(x, digits: int) -> str:
    if isinstance(x, int) and abs(x) < 10**9:
        return f"{x:,}"
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if abs(x) >= 1e6 and not (x.is_integer() and abs(x) < 1e9) or abs(x) < 1e-4:
        return _sci(x, digits)
    return _plain(x, digits)


def _sci(x: float, digits: int) -> str:
    """Scientific notation, mantissa zeros dropped: 3.2e9 -> "3.2e+09", 3e-5 -> "3e-05"."""
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{_strip(mantissa)}e{exponent}"


def fmt_bytes(x, digits: int = UNIT_DIGITS) -> str:
    """Bytes in binary units: 512 -> "512 B", 3,072,000 -> "2.93 MiB", 2^30 -> "1 GiB"."""
    if not is_number(x) or not math.isfinite(x):
        return fmt(x)
    value, unit = scale_bytes(abs(x))
    value = math.copysign(value, x)
    return f"{_number(value if unit != 'B' else x, digits)} {unit}"


def scale_bytes(x: float) -> tuple[float, str]:
    """(x in the largest binary unit it reaches, that unit): 3e6 -> (2.86, "MiB")."""
    i = 0
    while abs(x) >= 1024 and i < len(BYTE_UNITS) - 1:
        x /= 1024
        i += 1
    return x, BYTE_UNITS[i]


def fmt_seconds(x, digits: int = UNIT_DIGITS, ascii: bool = False) -> str:
    """A time: 2.5 -> "2.5 s", 0.00314 -> "3.14 ms", 1.25e-5 -> "12.5 µs", 0 -> "0 s"."""
    if not is_number(x) or not math.isfinite(x) or x == 0:
        return f"{fmt(x)} s"
    factor, unit = time_unit(abs(x))
    unit = "us" if ascii and unit == "µs" else unit
    return f"{_number(x / factor, digits)} {unit}"


def time_unit(x: float) -> tuple[float, str]:
    """(seconds per unit, unit) for the largest unit ``x`` seconds reach: 0.003 -> (1e-3, "ms")."""
    for factor, unit in TIME_UNITS:
        if x >= factor * 0.9995:  # 0.99995 ms rounds to "1 ms", not "1,000 µs"
            return factor, unit
    return TIME_UNITS[-1]


def scale_for(values, unit: str) -> tuple[float, str]:
    """How a figure shows a column of ``values`` declared in ``unit``: (divide by, axis unit).
    Seconds go to the unit of their largest value (ms, µs), bytes to a binary unit; anything
    else stays as declared."""
    big = max((abs(v) for v in values if is_number(v) and math.isfinite(v)), default=0.0)
    if unit == "s" and big:
        return time_unit(big)
    if unit == "B" and big:
        scaled, name = scale_bytes(big)
        return big / scaled, name
    return 1.0, unit


_DECIMAL = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"))
_BINARY = ((2**40, "T"), (2**30, "G"), (2**20, "M"), (2**10, "K"))


def tick(x: float, binary: bool = False, short_from: float = 1e3) -> str:
    """A short axis label: 10 -> "10", 1e3 -> "1K", 2.5e4 -> "25K", 1e6 -> "1M", 0.01 ->
    "0.01", 1e-5 -> "1e-05". With ``binary``, K/M/G are powers of 1,024 (16,384 -> "16K");
    the axis must then say so. Values below ``short_from`` keep all their digits (1,024).
    Never mathtext (no "10^3", no "2x10^1")."""
    if not is_number(x) or not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    ax = abs(x)
    for scale, suffix in _BINARY if binary else _DECIMAL:
        if ax >= scale and ax >= short_from:
            return _plain(x / scale, 3) + suffix
    return _sci(x, 3) if ax < 1e-4 else _plain(x, 4)


def short_ticks_from(values) -> float:
    """Where labels of ticks at ``values`` switch to K/M/G: from 1,000 on an axis that reaches
    10,000 (1K, 16K, 1M), never on one that stays below (64, 512, 1,024 stay as they are)."""
    return 1e3 if any(is_number(v) and abs(v) >= 1e4 for v in values) else math.inf


def binary_ticks(values) -> bool:
    """Whether ticks at ``values`` read best with K = 1,024: some label is shortened (see
    short_ticks_from) and every shortened value is a whole multiple of 1,024 (sizes such as 1K,
    16K, 1M bytes or tokens)."""
    big = [float(v) for v in values if is_number(v) and abs(v) >= short_ticks_from(values)]
    return bool(big) and all(v.is_integer() and int(v) % 1024 == 0 for v in big)


_PREFIXES = {"T": 1e12, "G": 1e9, "M": 1e6, "K": 1e3, "k": 1e3, "": 1.0}


def column_unit(values, unit: str | None, ascii: bool = False) -> tuple[float, str | None]:
    """(divide by, unit to name in the header) for a table column of ``values`` in ``unit``:
    seconds to s/ms/µs/ns and bytes to B/KiB/MiB/GiB by the column's largest value, and a unit
    with a decimal prefix (GB/s, TFLOP/s) to the prefix its largest value reaches (1e-5 GB/s is
    10 KB/s); any other unit as declared."""
    finite = [abs(float(v)) for v in values if is_number(v) and math.isfinite(v)]
    big = max(finite, default=0.0)
    if not big or not unit:
        return 1.0, unit
    if unit in ("s", "B"):
        factor, name = scale_for(finite, unit)
        return factor, ("us" if ascii and name == "µs" else name)
    prefix, rest = unit[:1], unit[1:]
    if prefix in _PREFIXES and prefix and len(rest) >= 2 and rest[0].isupper():
        base = big * _PREFIXES[prefix]
        for p in ("T", "G", "M", "K", ""):
            if base >= _PREFIXES[p] * 0.9995 or p == "":
                return _PREFIXES[p] / _PREFIXES[prefix], p + rest
    return 1.0, unit


def readable_unit(values, unit: str | None) -> tuple[float, str | None]:
    """:func:`column_unit`, but a prefixed unit (GB/s, TFLOP/s) is changed only where its values
    would need scientific notation or four leading zeros (largest below 0.01 or from 1e5 on):
    0.3 GB/s stays, 1.4e-4 TFLOP/s becomes 137 MFLOP/s. Seconds and bytes always scale."""
    if unit in ("s", "B"):
        return column_unit(values, unit)
    finite = [abs(float(v)) for v in values if is_number(v) and math.isfinite(v)]
    big = max(finite, default=0.0)
    if not big or 0.01 <= big < 1e5:
        return 1.0, unit
    return column_unit(values, unit)


def column(
    values, unit: str | None = None, digits: int = DIGITS, ascii: bool = False
) -> tuple[str | None, list[str]]:
    """A table column as a person reads it: (the unit its header names, the cells). Scaled to
    one unit for the whole column (:func:`column_unit`), so the header carries the unit and the
    cells only numbers; every cell with the same decimals (``digits`` significant digits of the
    largest value, at least two of the smallest, at most 6 decimals), thousands separators, no
    scientific notation; whole numbers stay whole.
    Cells that are not numbers are as :func:`fmt` writes them."""
    factor, name = column_unit(values, unit, ascii)
    numbers = [v for v in values if is_number(v) and math.isfinite(v)]
    whole = factor == 1.0 and all(isinstance(v, int) or float(v).is_integer() for v in numbers)
    scaled = [abs(v) / factor for v in numbers if v]
    decimals = 0
    if scaled and not whole:
        # ``digits`` significant digits for the largest value, at least two for the smallest
        decimals = min(
            6,
            max(
                0,
                digits - 1 - math.floor(math.log10(max(scaled))),
                1 - math.floor(math.log10(min(scaled))),
            ),
        )
    cells = [
        f"{v / factor:,.{decimals}f}" if is_number(v) and math.isfinite(v) else fmt(v)
        for v in values
    ]
    return name, cells
