"""The grading policy: one rule per class of number, for every cell of every reproduction.

A reproduction declares which class each cell's number is (``grade_class``); it never chooses a
tolerance. The rules, stated once here and shown on the site:

- ``exact`` (counts, formulas, unit arithmetic): ``match`` within the paper's printed precision
  (half a unit of its last printed digit), otherwise ``deviates``. There is no ``close``.
- ``prediction`` (our model or simulator predicting a number the paper measured on hardware):
  ``match`` within the printed precision, ``close`` within PREDICTION_TOLERANCE, otherwise
  ``deviates``; one tolerance for all papers, fixed before results were looked at.
- ``sampled`` (Monte Carlo, generated traces): MIN_SEEDS or more seeds, each graded by the
  prediction rule; a grade that differs between seeds is ``seed-dependent``, never ``close``.
- ``other-hardware`` (measured here against another machine's measurement): magnitudes are
  ``not-comparable``; only the paper's direction and ordering claims are graded.

Claims in words ("2x", "2-3.6x", "<1%", "comparable") are read by :func:`read_claim`, one
reading for all papers. ``explained`` is a computation: the cell recomputed with the cause
removed must agree under the same class; a deviation our own component causes is never
explained and names the component (``fault``). A cell derived from another is counted once
(``derived_from``). The policy in full: see docs/validation-and-grading.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

PREDICTION_TOLERANCE = 0.15
PREDICTION_TOLERANCE_REASON = (
    "the largest error published performance predictors report against real clusters: vTrain "
    "14.7% up to 512 GPUs, ASTRA-sim 2.8-11.4% against NCCL, Calculon 3.65% mean and 8.87% max "
    "on Selene; a prediction within it is as good as the field's tools, one outside it is not"
)
MIN_SEEDS = 5
SEEDS = tuple(range(MIN_SEEDS))  # the seeds a sampled cell is computed at by default

GRADE_CLASSES = {
    "exact": "counts, formulas and unit arithmetic: match within the paper's printed precision "
    "(half a unit of its last digit), otherwise deviates",
    "prediction": f"our model or simulator predicting a number the paper measured: match within "
    f"the printed precision, close within {PREDICTION_TOLERANCE:.0%} of the "
    f"paper's value, otherwise deviates",
    "sampled": f"sampled or simulated over generated traces: computed at {MIN_SEEDS}+ seeds, each "
    f"graded by the prediction rule; a grade every seed gives stands, otherwise "
    f"seed-dependent",
    "other-hardware": "measured on this machine against another machine's measurement: "
    "magnitudes are not-comparable (shown side by side); only direction and "
    "ordering claims are graded",
}
CLASSES = tuple(GRADE_CLASSES)

AGREE = ("match", "close", "claim-holds")
DISAGREE = ("deviates", "claim-fails")
COMPARED = AGREE + DISAGREE + ("explained", "seed-dependent")


class PolicyError(ValueError):
    """A reproduction asked the policy for something it does not allow."""


def half_unit(printed: str) -> float:
    """Half a unit of the last printed digit of a number as printed ("1.21" -> 0.005,
    "2,057" -> 0.5, "~40" -> 0.5)."""
    text = printed.replace(",", "").strip().lstrip("~≈<>≤≥").strip()
    try:
        exponent = Decimal(text).as_tuple().exponent
    except InvalidOperation:
        raise PolicyError(f"not a printed number: {printed!r}") from None
    return 0.5 * 10.0 ** int(exponent)


def grade_value(paper: float, printed_half: float, ours: float, grade_class: str) -> str:
    """The grade of one number under its class (``sampled`` grades one seed: the prediction
    rule). Returns match, close, deviates or not-comparable."""
    if grade_class not in GRADE_CLASSES:
        raise PolicyError(f"grade class must be one of {', '.join(CLASSES)}, got {grade_class!r}")
    if grade_class == "other-hardware":
        return "not-comparable"
    miss = abs(ours - paper)
    if miss <= printed_half * (1 + 1e-9):
        return "match"
    if grade_class == "exact":
        return "deviates"
    return "close" if miss <= printed_half + PREDICTION_TOLERANCE * abs(paper) else "deviates"


def consensus(grades: list[str]) -> tuple[str, float]:
    """One grade from per-seed grades: the grade every seed gives, else ``seed-dependent``; and
    the fraction of seeds that agree with the paper (match, close or claim-holds)."""
    if len(grades) < MIN_SEEDS:
        raise PolicyError(f"a sampled cell needs at least {MIN_SEEDS} seeds, got {len(grades)}")
    agree = sum(g in AGREE for g in grades) / len(grades)
    first = grades[0]
    if all(g == first for g in grades):
        return first, agree
    # Seeds that all agree, some by match and some by close, agree: the weaker grade stands.
    if all(g in ("match", "close") for g in grades):
        return "close", agree
    return "seed-dependent", agree


def grade_seeds(paper: float, printed_half: float, per_seed: list[float]) -> tuple[str, float]:
    """A sampled cell: each seed graded by the prediction rule, then :func:`consensus`."""
    return consensus([grade_value(paper, printed_half, v, "prediction") for v in per_seed])


def tolerance_words(grade_class: str) -> str:
    """What a ``close`` cell of this class is within, for the page."""
    if grade_class in ("prediction", "sampled"):
        return f"{PREDICTION_TOLERANCE:.0%} of the paper's value (prediction rule)"
    return "printed precision"


# --- claims in words --------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """How a number in the paper's words is read: the interval ours must fall in."""

    text: str  # the words read, e.g. "2-3.6x"
    low: float  # -inf for an upper bound
    high: float  # +inf for a lower bound
    low_open: bool = False
    high_open: bool = False

    def holds(self, ours: float) -> bool:
        if ours is None or math.isnan(ours):
            raise PolicyError(f"no number to read {self.text!r} against")
        above = ours > self.low if self.low_open else ours >= self.low
        below = ours < self.high if self.high_open else ours <= self.high
        return above and below

    def describe(self) -> str:
        def fmt(x: float) -> str:
            return f"{x:.6g}"

        if math.isinf(self.low):
            return f"'{self.text}' read as {'<' if self.high_open else '<='} {fmt(self.high)}"
        if math.isinf(self.high):
            return f"'{self.text}' read as {'>' if self.low_open else '>='} {fmt(self.low)}"
        return f"'{self.text}' read as {fmt(self.low)} to {fmt(self.high)}"


_NUMBER = r"(\d[\d,]*(?:\.\d+)?)"
_UNIT = r"\s*(?:x|×|%|pp|us|µs|ms|s|gb|gib|tb|b)?\s*"


def read_claim(text: str) -> Reading:
    """Read a number in the paper's words, one rule for every paper:

    - a single number ("2x", "1.55x", "~40%") covers its printed precision: 2 -> 1.5 to 2.5;
    - a range ("2-3.6x", "1-3 pp") is one quantity printed at the precision of its more precise
      end, applied to both ends: "2-3.6x" -> 1.95 to 3.65, "1-3 pp" -> 0.5 to 3.5;
    - a strict bound ("<1%", "under 5", "below 2x") is taken as stated: < 1; a bound with
      "up to", "at most", "<=" includes its printed precision: "up to 1.55x" -> <= 1.555;
      lower bounds ("over 2x", ">2x", "at least 2") likewise.
    """
    words = text.strip().lower().replace("–", "-").replace("—", "-")
    # "1-3 pp": a range of two numbers
    m = re.fullmatch(rf"~?\s*{_NUMBER}{_UNIT}(?:-|to)\s*~?\s*{_NUMBER}{_UNIT}", words)
    if m:
        lo, hi = m.group(1), m.group(2)
        h = min(half_unit(lo), half_unit(hi))
        return Reading(text, _num(lo) - h, _num(hi) + h)
    bounds = (
        ("<=", "high", False),
        ("≤", "high", False),
        ("up to", "high", False),
        ("at most", "high", False),
        ("<", "high", True),
        ("under", "high", True),
        ("below", "high", True),
        ("less than", "high", True),
        (">=", "low", False),
        ("≥", "low", False),
        ("at least", "low", False),
        (">", "low", True),
        ("over", "low", True),
        ("above", "low", True),
        ("more than", "low", True),
    )
    for word, side, strict in bounds:
        m = re.fullmatch(rf"{re.escape(word)}\s*~?\s*{_NUMBER}{_UNIT}", words)
        if m:
            value = _num(m.group(1))
            slack = 0.0 if strict else half_unit(m.group(1))
            if side == "high":
                return Reading(text, -math.inf, value + slack, high_open=strict)
            return Reading(text, value - slack, math.inf, low_open=strict)
    m = re.fullmatch(rf"(?:~|about|around|≈)?\s*{_NUMBER}{_UNIT}", words)
    if m:
        value, h = _num(m.group(1)), half_unit(m.group(1))
        return Reading(text, value - h, value + h)
    raise PolicyError(
        f"cannot read {text!r} as a number in words; the policy reads a number, a "
        f"range 'a-b', or a bound ('<a', 'up to a', 'over a')"
    )


def comparable(a: float, b: float) -> bool:
    """The paper's "comparable" / "on par", read by the prediction rule: within
    PREDICTION_TOLERANCE of each other (relative to the larger)."""
    return abs(a - b) <= PREDICTION_TOLERANCE * max(abs(a), abs(b))


def _num(text: str) -> float:
    return float(text.replace(",", ""))


# --- counting ---------------------------------------------------------------------------------


def _get(cell, key):
    return cell.get(key) if isinstance(cell, dict) else getattr(cell, key, None)


def agreement(cells) -> dict[str, int]:
    """Counts over compared cells (derived cells counted once, at their source): ``compared``,
    ``agree`` (match, close, claim-holds), ``explained``, ``deviate`` (deviates, claim-fails),
    ``seed_dependent``."""
    out = {"compared": 0, "agree": 0, "explained": 0, "deviate": 0, "seed_dependent": 0}
    for cell in cells:
        verdict = _get(cell, "verdict")
        if verdict not in COMPARED or _get(cell, "derived_from"):
            continue
        out["compared"] += 1
        if verdict in AGREE:
            out["agree"] += 1
        elif verdict in DISAGREE:
            out["deviate"] += 1
        elif verdict == "explained":
            out["explained"] += 1
        else:
            out["seed_dependent"] += 1
    return out


def add_agreement(*counts: dict[str, int]) -> dict[str, int]:
    total = {"compared": 0, "agree": 0, "explained": 0, "deviate": 0, "seed_dependent": 0}
    for c in counts:
        for k in total:
            total[k] += c.get(k, 0)
    return total


def agreement_line(counts: dict[str, int]) -> str:
    """'x of y compared cells agree, e explained, z deviate, w seed-dependent' (zeros after
    'agree' left out; 'nothing compared' when y is 0)."""
    if not counts.get("compared"):
        return "nothing compared"
    parts = [f"{counts['agree']} of {counts['compared']} compared cells agree"]
    if counts.get("explained"):
        parts.append(f"{counts['explained']} explained")
    if counts.get("deviate"):
        parts.append(f"{counts['deviate']} deviate")
    if counts.get("seed_dependent"):
        parts.append(f"{counts['seed_dependent']} seed-dependent")
    return ", ".join(parts)
