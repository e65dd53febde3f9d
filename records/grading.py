"""The grading policy: one rule per class of number, for every cell of every reproduction.

A reproduction declares which class each cell's number is (``grade_class``) and what quantity it
is (``quantity``: a value, a ratio such as a speedup, a percent change); it never chooses a
tolerance. The rules, stated once here and shown on the site:

- direction first: a ratio (neutral 1), a percent change or a signed value (neutral 0) whose
  printed value lies on one side of neutral must be on that side before its magnitude counts.
- ``exact``: ``match`` within the printed precision (half a unit of the last digit), else deviates.
- ``prediction``: ``match`` within the printed precision, else ``close`` within
  PREDICTION_TOLERANCE of the value (a ratio on its log, a change on 1 + change), never both
  added; only where `repro validate` scores the predictor on the platform, otherwise the class
  is ``prediction (unscored)``, graded alike but counted apart.
- ``sampled``: MIN_SEEDS or more seeds, each graded by the prediction rule; a grade that differs
  between seeds is ``seed-dependent``, never ``close``.
- ``other-hardware``: magnitudes are ``not-comparable``; only direction and ordering claims count.

Agreement only evidence can earn: a value equal to what the computation gives without the
method (``without``), or a number reused from another cell, is ``not-evidence``; a claim that
holds under every perturbation of its input (:func:`can_fail`) is ``echo``. Claims in words are
read by :func:`read_claim`; a range is one claim. ``explained`` is a recomputation; a convention
is accepted only by :func:`judge_convention`. The policy in full: docs/validation-and-grading.md.
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
MIN_SEEDS = 9
SEEDS = tuple(range(MIN_SEEDS))  # the seeds a sampled cell is computed at by default
UNSCORED = "prediction (unscored)"

GRADE_CLASSES = {
    "exact": "counts, formulas and unit arithmetic: match within the paper's printed precision "
    "(half a unit of its last digit), otherwise deviates",
    "prediction": f"a predictor `repro validate` scores on this platform predicting a number the "
    f"paper measured: match within the printed precision, close within "
    f"{PREDICTION_TOLERANCE:.0%} of the value (never both added), otherwise deviates",
    UNSCORED: f"a model or simulator `repro validate` does not score on this platform: graded "
    f"as a prediction, counted apart (its {PREDICTION_TOLERANCE:.0%} has no track record here)",
    "sampled": f"sampled or simulated over generated traces: computed at {MIN_SEEDS}+ seeds, each "
    f"graded by the prediction rule; a grade every seed gives stands, otherwise "
    f"seed-dependent",
    "other-hardware": "measured on this machine against another machine's measurement: "
    "magnitudes are not-comparable (shown side by side); only direction and "
    "ordering claims are graded",
}
CLASSES = tuple(GRADE_CLASSES)
# What a number is, for direction and magnitude: its neutral value and how a miss is measured.
QUANTITIES = {
    "value": "a plain value: its sign is its direction (neutral 0), the miss relative to it",
    "ratio": "a ratio or speedup: the side of 1 first, then the miss on the log ratio",
    "change": "a percent change against a baseline: the side of 0 first, then the miss relative "
    "to the underlying ratio 1 + change/100",
    "reduction": "a percent saved against a baseline: the side of 0 first, then the miss "
    "relative to the underlying ratio 1 - reduction/100",
}
NEUTRAL = {"value": 0.0, "ratio": 1.0, "change": 0.0, "reduction": 0.0}

AGREE = ("match", "close", "claim-holds")
DISAGREE = ("deviates", "claim-fails")
COMPARED = AGREE + DISAGREE + ("explained", "seed-dependent")
NOT_EVIDENCE = "not-evidence"
MARGIN_UNITS = 0.1  # a recomputation inside the printed precision by less is reported as such


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


def _side(x: float, neutral: float) -> int:
    return (x > neutral) - (x < neutral)


def wrong_side(paper: float, printed_half: float, ours: float, quantity: str = "value") -> bool:
    """Direction first: the paper's printed value lies on one side of neutral (its whole printed
    interval does) and ours does not lie on that side."""
    neutral = NEUTRAL[quantity]
    if paper - printed_half <= neutral <= paper + printed_half:
        return False  # the printed value states no direction
    return _side(ours, neutral) != _side(paper, neutral)


def relative_miss(paper: float, ours: float, quantity: str = "value") -> float:
    """How far ours is from the paper in relative terms of the underlying quantity: a value
    relative to itself, a ratio on its log (exp|ln(ours/paper)| - 1), a percent change relative
    to its ratio 1 + change/100."""
    if quantity == "ratio":
        if paper <= 0 or ours <= 0:
            return math.inf
        return math.exp(abs(math.log(ours / paper))) - 1.0
    if quantity == "change":
        paper, ours = 1.0 + paper / 100.0, 1.0 + ours / 100.0
    elif quantity == "reduction":
        paper, ours = 1.0 - paper / 100.0, 1.0 - ours / 100.0
    if paper == 0:
        return math.inf
    return abs(ours - paper) / abs(paper)


def grade_value(
    paper: float, printed_half: float, ours: float, grade_class: str, quantity: str = "value"
) -> str:
    """The grade of one number under its class (``sampled`` grades one seed: the prediction
    rule): match within the printed precision; else the direction first, then (classes with a
    tolerance) close within PREDICTION_TOLERANCE of the underlying quantity. Returns match,
    close, deviates or not-comparable."""
    if grade_class not in GRADE_CLASSES:
        raise PolicyError(f"grade class must be one of {', '.join(CLASSES)}, got {grade_class!r}")
    if quantity not in QUANTITIES:
        raise PolicyError(f"quantity must be one of {', '.join(QUANTITIES)}, got {quantity!r}")
    if grade_class == "other-hardware":
        return "not-comparable"
    if abs(ours - paper) <= printed_half * (1 + 1e-9):
        return "match"
    if grade_class == "exact" or wrong_side(paper, printed_half, ours, quantity):
        return "deviates"
    return "close" if relative_miss(paper, ours, quantity) <= PREDICTION_TOLERANCE else "deviates"


def same_as_without(ours: float, without: float) -> bool:
    """The value equals what the same computation gives without the method (to rounding)."""
    return math.isclose(ours, without, rel_tol=1e-9, abs_tol=1e-9)


def coincidence(verdict: str, factor_verdicts: list[str]) -> bool:
    """A cell computed from other graded cells agrees while one of them deviates: the agreement
    is the deviations cancelling, not evidence."""
    return verdict in (*AGREE, "seed-dependent") and any(v in DISAGREE for v in factor_verdicts)


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


def grade_seeds(
    paper: float,
    printed_half: float,
    per_seed: list[float],
    quantity: str = "value",
    without: list[float] | None = None,
) -> tuple[str, float]:
    """A sampled cell: each seed graded by the prediction rule, then :func:`consensus`. A seed
    whose value equals ``without`` (the same computation without the method) is not evidence:
    every seed so makes the cell ``not-evidence``, some seeds make it ``seed-dependent``."""
    grades = [grade_value(paper, printed_half, v, "prediction", quantity) for v in per_seed]
    if without is not None:
        if len(without) != len(per_seed):
            raise PolicyError("without gives one value per seed")
        grades = [
            NOT_EVIDENCE if g in AGREE and same_as_without(v, w) else g
            for g, v, w in zip(grades, per_seed, without)
        ]
    return consensus(grades)


def tolerance_words(grade_class: str, quantity: str = "value") -> str:
    """What a ``close`` cell of this class is within, for the page."""
    if grade_class in ("prediction", UNSCORED, "sampled"):
        on = {
            "value": "the paper's value",
            "ratio": "the paper's ratio, on the log ratio",
            "change": "the underlying ratio 1 + change/100",
            "reduction": "the underlying ratio 1 - reduction/100",
        }[quantity]
        return f"{PREDICTION_TOLERANCE:.0%} of {on} (prediction rule)"
    return "printed precision"


def margin_units(paper: float, printed_half: float, value: float) -> float:
    """How far inside the printed precision ``value`` lands, in units of the last printed digit
    (0.5: on the printed value; negative: outside)."""
    return (printed_half - abs(value - paper)) / (2 * printed_half)


# --- conventions and counterfactuals ----------------------------------------------------------


@dataclass(frozen=True)
class Judged:
    """The policy's judgement of a convention tried on a whole table."""

    accepted: bool
    broken: tuple  # keys of cells that agree without it and not with it
    moved: tuple  # keys whose printed digits it changes
    why: str


def judge_convention(entries: dict) -> Judged:
    """One rule for a convention (a unit, a rounding, a stated input) offered to explain cells:
    it is applied to every cell of the table, ``entries``: key -> (paper, printed_half, ours,
    recount) with ``recount`` ours under the convention. It is accepted only if it breaks no cell
    that agrees without it, and at least two cells whose printed digits it changes agree under
    it: a convention that brings one cell into agreement is fitted to that cell, and the rest of
    the table cannot contradict it. Accepted, it explains only the cells that agree under it."""

    def agrees(paper, half, v):
        return abs(v - paper) <= half * (1 + 1e-9)

    def digits(half, v):
        return round(v / (2 * half))

    broken = tuple(
        k for k, (p, h, o, r) in entries.items() if agrees(p, h, o) and not agrees(p, h, r)
    )
    moved = tuple(k for k, (p, h, o, r) in entries.items() if digits(h, o) != digits(h, r))
    if broken:
        return Judged(False, broken, moved, "it breaks cells that agree without it")
    held = [k for k in moved if agrees(entries[k][0], entries[k][1], entries[k][3])]
    if len(held) < 2:
        return Judged(
            False,
            broken,
            moved,
            "it brings fewer than two cells of the table into agreement: fitted to one, it "
            "cannot be contradicted",
        )
    return Judged(True, broken, moved, f"it holds on every cell of the table ({len(held)} agree)")


def can_fail(test, perturbations) -> bool:
    """The counterfactual behind ``echo``: run ``test`` (the claim, on our numbers computed from
    an input) on each perturbed input. A claim that holds for every perturbation cannot fail and
    is not evidence; one that fails for some can."""
    outcomes = [bool(test(p)) for p in perturbations]
    if not outcomes:
        raise PolicyError("a counterfactual needs at least one perturbed input")
    return not all(outcomes)


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


COUNT_KEYS = (
    "compared",
    "agree",
    "explained",
    "deviate",
    "seed_dependent",
    "not_evidence",
    "unscored",
    "unscored_agree",
)


def agreement(cells) -> dict[str, int]:
    """Counts over compared cells (derived cells counted once, at their source): ``compared``,
    ``agree`` (match, close, claim-holds), ``explained``, ``deviate`` (deviates, claim-fails),
    ``seed_dependent``; apart from them ``not_evidence`` and the unscored predictions
    (``unscored``, of which ``unscored_agree`` agree), never counted as agreement."""
    out = dict.fromkeys(COUNT_KEYS, 0)
    for cell in cells:
        verdict = _get(cell, "verdict")
        if _get(cell, "derived_from"):
            continue
        if verdict == NOT_EVIDENCE:
            out["not_evidence"] += 1
            continue
        if verdict not in COMPARED:
            continue
        if _get(cell, "grade_class") == UNSCORED:
            out["unscored"] += 1
            out["unscored_agree"] += verdict in AGREE
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
    total = dict.fromkeys(COUNT_KEYS, 0)
    for c in counts:
        for k in total:
            total[k] += c.get(k, 0)
    return total


def agreement_line(counts: dict[str, int]) -> str:
    """'x of y compared cells agree, e explained, z deviate, w seed-dependent; n not evidence;
    u unscored predictions (a agree)' (zeros after 'agree' left out; 'nothing compared' when
    nothing was compared and nothing stands apart)."""
    apart = []
    if counts.get("not_evidence"):
        apart.append(f"{counts['not_evidence']} not evidence")
    if counts.get("unscored"):
        apart.append(
            f"{counts['unscored']} {UNSCORED} ({counts.get('unscored_agree', 0)} agree, "
            f"counted apart)"
        )
    if not counts.get("compared"):
        return "; ".join(["nothing compared", *apart])
    parts = [f"{counts['agree']} of {counts['compared']} compared cells agree"]
    if counts.get("explained"):
        parts.append(f"{counts['explained']} explained")
    if counts.get("deviate"):
        parts.append(f"{counts['deviate']} deviate")
    if counts.get("seed_dependent"):
        parts.append(f"{counts['seed_dependent']} seed-dependent")
    return "; ".join([", ".join(parts), *apart])
