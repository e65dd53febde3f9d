"""Shared by the feplb-* reproductions: the PP/EP configurations, the routing traces they replay,
the replay through the balancers (components/balance/load_balance_eval.py), the statistics of
the traces themselves, and the sampling error of everything averaged over them; cached per process.

GLM-5 routing traces are not public. Every number here comes from a *synthetic* trace
(components/balance/routing_trace.py: log-normal expert popularity with skew, random-walk drift,
per-micro-batch noise, seeded), shaped like FEPLB's setting: 128 experts, top-8, the EP ranks
as token sources, ``tokens`` tokens per EP rank and micro-batch (an assumption: FEPLB does not
print its micro-batch size), ``layers`` = 18 MoE layers (FEPLB Sec. 3.1: the reduced-layer GLM-5
has 18 layers; its metrics are "averaged over the full training run"). PP changes which layers
a stage holds, not one layer's balance, so a PP/EP row differs from another only through EP
(and its own trace seed).

Why 18 layers and not fewer: in the synthetic generator each layer draws its own expert
popularity and the micro-batches of one layer share it (drift 0.05), so the layers are the
independent samples. With 2 layers the table's numbers were one draw: over seeds 0-4 the
Before LB straggler at EP = 2 ranged 1,547-5,624 and FasterMoE's reduction -2% to -72%. Every
averaged number therefore comes with a 95% interval over the layers (:func:`bootstrap_interval`),
a cell is ``close`` when the paper's value lies inside it, and a claim about an ordering or a
trend is graded only when the interval of the difference excludes 0 (:func:`direction`).
4 micro-batches per layer (3 replayed; the first only seeds the history) keep the cost down:
more micro-batches of one layer add little, they share its popularity.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from moe_repro.components.balance import get_balancer
from moe_repro.components.balance.base import BalanceStep
from moe_repro.components.balance.load_balance_eval import MethodStats, evaluate_trace
from moe_repro.components.provenance import cached_in
from moe_repro.components.balance.routing_trace import (GemmTimeModel, RoutingTrace,
                                                        contiguous_ranks, device_loads,
                                                        synthetic_trace)
from moe_repro.components.model.zoo import get_model
from moe_repro.components.moe.moe_layer import ExpertPlacement
from moe_repro.components.network.platform import load_builtin
from moe_repro.reproductions.spec import Tolerance

CONFIGS = (("4/2", 2), ("4/4", 4), ("2/8", 8))   # FEPLB Sec. 3.1: PP=4/EP=2, 4/4, 2/8

DEFAULTS = {"tokens": 4096, "layers": 18, "micro_batches": 4, "skew": 1.0, "drift": 0.05,
            "noise": 0.3, "seed": 0, "dyn": 4, "tau": 0, "max_num_dyn": 8}

BOOTSTRAP = 2000   # resamples of the layers for the 95% intervals


def check(params: dict) -> None:
    for key in ("tokens", "layers", "micro_batches", "dyn", "max_num_dyn"):
        if int(params[key]) <= 0:
            raise ValueError(f"{key} must be positive, got {params[key]}")
    if int(params["micro_batches"]) < 2:
        raise ValueError("micro_batches must be >= 2 (the first one only seeds the history)")
    for key in ("skew", "drift", "noise"):
        if float(params[key]) < 0:
            raise ValueError(f"{key} must be >= 0")


def straggler_table_layout(unit: str) -> dict:
    """FEPLB Tables 3 and 4 as printed: PP/EP rows; Before LB, then FasterMoE and FEPLB each with
    the reduction in parentheses (reports/html.py ``paper_grid``)."""
    def method(name: str) -> dict:
        columns = [{"label": unit, "column": name}]
        if name != "Before LB":
            columns.append({"label": "vs Before LB (%)", "column": f"{name} vs Before LB"})
        return {"label": name, "columns": columns}

    return {"corner": "PP/EP", "rows": [row for row, _ in CONFIGS],
            "groups": [method(name) for name in ("Before LB", "FasterMoE", "FEPLB")]}


def trace_for(params: dict, ep: int, keep_tokens: bool = False) -> RoutingTrace:
    m = get_model("glm5-moe")
    key = (int(params["layers"]), int(params["micro_batches"]), m.n_experts, m.top_k,
           int(params["tokens"]), ep, float(params["skew"]), float(params["drift"]),
           float(params["noise"]), int(params["seed"]) * 1000 + ep)
    if not keep_tokens and (*key, True) in _TRACES:   # the same routing, tokens kept
        return _TRACES[(*key, True)]
    if (*key, keep_tokens) not in _TRACES:
        if len(_TRACES) >= 8:
            _TRACES.pop(next(iter(_TRACES)))
        layers, mbs, experts, top_k, tokens, ep_, skew, drift, noise, seed = key
        _TRACES[(*key, keep_tokens)] = synthetic_trace(
            layers, mbs, experts, top_k, tokens, ep_, skew=skew, drift=drift, noise=noise,
            seed=seed, keep_tokens=keep_tokens)
    return _TRACES[(*key, keep_tokens)]


_TRACES: dict = {}


def gemm_model() -> GemmTimeModel:
    """Roofline time of one GLM-5 expert on an H100 (dgx-h100 profile: achievable bf16 GEMM
    rate and HBM bandwidth). A model, not a measurement."""
    m, p = get_model("glm5-moe"), load_builtin("dgx-h100")
    return GemmTimeModel(m.d_model, m.d_ffn, p.gemm_flops, p.hbm_bytes_per_s, n_mat=m.n_mat)


def balancer_knobs(params: dict, dyn: int | None = None) -> dict:
    """The knobs of the registered balancers these reproductions use (FasterMoE gets the same
    weight-buffer budget, max_num_dyn, as FEPLB)."""
    return {"dyn": dyn or int(params["dyn"]), "tau": int(params["tau"]),
            "max_num_dyn": int(params["max_num_dyn"]), "max_shadows": int(params["max_num_dyn"])}


# --- the replay, per layer ------------------------------------------------------------------------

def evaluate_layers(params: dict, ep: int, dyn: int | None = None,
                    methods=("Before LB", "FasterMoE", "FEPLB"),
                    history: str = "previous",
                    next_if_unfit: bool = False) -> list[dict[str, MethodStats]]:
    """The replay of each layer on its own (GEMM times always modelled): [layer] -> method ->
    MethodStats over that layer's replayed micro-batches. ``history``: what the methods that
    plan from history see, "previous" (the previous micro-batch's counts, as in training),
    "actual" (this micro-batch's own counts: routing predicted exactly, a diagnostic that takes
    the trace's predictability out) or "unrelated" (the same micro-batch of the next layer, whose
    popularity is drawn independently: history that says nothing about this micro-batch, the
    stalest any history could be; a diagnostic). ``next_if_unfit``: FEPLB's balancer tries the
    next busiest dynamic expert when the busiest does not fit the gap (not FEPLB Sec. 2's rule;
    a diagnostic). Cached per method."""
    if history not in HISTORIES:
        raise ValueError(f"history must be one of {', '.join(HISTORIES)}, got {history!r}")
    base = (tuple(sorted((k, params[k]) for k in DEFAULTS)), ep, dyn or int(params["dyn"]), history,
            bool(next_if_unfit))

    def replay(name: str) -> list[MethodStats]:
        trace, model = trace_for(params, ep), gemm_model()
        knobs = {**balancer_knobs(params, dyn), "next_if_unfit": int(bool(next_if_unfit))}
        return [evaluate_trace(_layer_trace(trace, layer, history), methods=(name,),
                               gemm_model=model, **knobs)[name]
                for layer in range(trace.num_layers)]

    # cached_in: a cached replay still says it was simulated (components/provenance.py)
    per_method = {name: cached_in(_CACHE, (*base, name), lambda name=name: replay(name))
                  for name in methods}
    layers = len(per_method[methods[0]])
    return [{name: per_method[name][layer] for name in methods} for layer in range(layers)]


HISTORIES = ("previous", "actual", "unrelated")


def _layer_trace(trace: RoutingTrace, layer: int, history: str) -> RoutingTrace:
    """One layer as a trace of its own. With history "actual" or "unrelated", every replayed
    micro-batch becomes a pseudo-layer of two micro-batches, [history, replayed], so the replay's
    "previous" counts are the ones chosen; the same micro-batches are replayed either way."""
    if history == "previous":
        return RoutingTrace(trace.counts[layer:layer + 1], trace.top_k, trace.source)
    replayed = trace.counts[layer, 1:]
    seen = replayed if history == "actual" else trace.counts[(layer + 1) % trace.num_layers, 1:]
    counts = torch.stack([seen, replayed], dim=1).contiguous()
    words = "actual counts" if history == "actual" else "the next layer's counts"
    return RoutingTrace(counts, trace.top_k, f"{trace.source} (history = {words})")


_CACHE: dict = {}


def evaluate(params: dict, ep: int, dyn: int | None = None, with_gemm: bool = False,
             methods=("Before LB", "FasterMoE", "FEPLB")) -> dict[str, MethodStats]:
    """Means over every layer and replayed micro-batch (each layer replays as many). GEMM times
    are always modelled (``with_gemm`` is kept for callers; it changes nothing)."""
    layers = evaluate_layers(params, ep, dyn, methods)
    out = {}
    for name in methods:
        rows = [layer[name] for layer in layers]
        out[name] = MethodStats(
            token_straggler=_mean([s.token_straggler for s in rows]),
            gemm_straggler_s=_mean([s.gemm_straggler_s for s in rows]),
            samples=sum(s.samples for s in rows),
            gemm_makespan_s=_mean([s.gemm_makespan_s for s in rows]))
    return out


def per_layer(params: dict, ep: int, method: str, metric: str = "token_straggler",
              dyn: int | None = None, history: str = "previous",
              next_if_unfit: bool = False) -> list[float]:
    """One metric of one method, per layer (the independent samples)."""
    return [getattr(layer[method], metric)
            for layer in evaluate_layers(params, ep, dyn, methods=(method,), history=history,
                                         next_if_unfit=next_if_unfit)]


def feplb_unmoved(params: dict, ep: int) -> tuple[int, int]:
    """(micro-batches where FEPLB's balancer moves nothing, replayed micro-batches): its first
    pick, the busiest dynamic expert of the most loaded device, does not fit the gap to the
    least loaded one (FEPLB Sec. 2's rule; the whole-expert limit of Sec. 3.2)."""
    knobs = {**get_balancer("FEPLB").knobs, **balancer_knobs(params)}
    trace = trace_for(params, ep)
    placement = ExpertPlacement.contiguous(trace.num_experts, ep)
    plans = [get_balancer("FEPLB").run(BalanceStep(placement, trace.counts[layer, mb],
                                                   trace.counts[layer, mb - 1]), knobs).decision
             for layer in range(trace.num_layers) for mb in range(1, trace.num_micro_batches)]
    return sum(not plan.moves for plan in plans), len(plans)


# --- statistics -------------------------------------------------------------------------------

def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def change_pct(value: float, base: float) -> float:
    """100 (value - base) / base: FEPLB Tables 3-4's '(-55%)'."""
    return 100.0 * (value - base) / base


def bootstrap_interval(stat, *groups, resamples: int = BOOTSTRAP, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of ``stat(*groups)`` over resamples of the layers: each group (one
    EP configuration's per-layer values, or per-layer tuples) is resampled with replacement,
    independently of the others. Seeded, so a run is reproducible. The per-layer values are
    heavy-tailed (one layer can hold 3x the next one's straggler), so a percentile interval
    rather than mean +- 2 standard errors."""
    rng = random.Random(seed)
    values = sorted(stat(*[[g[rng.randrange(len(g))] for _ in g] for g in groups])
                    for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    return values[int(tail * resamples)], values[min(resamples - 1, int((1.0 - tail) * resamples))]


def interval_tolerance(ours: float, interval: tuple[float, float], paper: float | None) -> Tolerance:
    """``close`` when the paper's value lies inside our interval: the slack on the paper's side
    of ours (the interval need not be symmetric)."""
    lo, hi = interval
    if paper is None:
        return Tolerance(abs=max(hi - ours, ours - lo, 0.0))
    return Tolerance(abs=max(hi - ours, 0.0) if paper >= ours else max(ours - lo, 0.0))


def fmt(x: float, sign: bool = False) -> str:
    """A number for a note: thousands separated from 1,000 on, else 3 significant digits."""
    text = f"{abs(x):,.0f}" if abs(x) >= 1000 else f"{abs(x):.3g}"
    return ("-" if x < 0 else "+" if sign else "") + text


def interval_note(interval: tuple[float, float], unit: str = "") -> str:
    lo, hi = interval
    return f"95% interval over the trace's layers {fmt(lo)} to {fmt(hi)}{unit} (bootstrap)"


def direction(interval: tuple[float, float]) -> bool | None:
    """A difference whose interval excludes 0: True (positive), False (negative); None when
    our sampling error cannot tell."""
    lo, hi = interval
    if lo > 0:
        return True
    if hi < 0:
        return False
    return None


def fastermoe_over_feplb_cell(repro, column: str, pairs: list, params: dict):
    """The FasterMoE / FEPLB ratio at EP = 8 (row "2/8") over per-layer (FasterMoE, FEPLB) pairs,
    graded with its bootstrap interval; both FEPLB tables print it."""
    cell = estimate_cell(repro, "2/8", column, ratio_of(pairs), bootstrap_interval(ratio_of, pairs),
                         "x", trace_note(params, 8), "x")
    if cell.verdict == "deviates":
        cell.note += "; not explained: it follows from the two reductions, which deviate"
    return cell


def lead_grows_claim(repro, fm_fe: dict, what: str, paper_ratios: str):
    """The claim both FEPLB tables grade (Fig. 5 caption, "increasingly outperforming FasterMoE
    as EP grows"): the FasterMoE / FEPLB ratio of ``what`` rises at each EP step. ``fm_fe``: EP ->
    per-layer (FasterMoE, FEPLB) pairs; ``paper_ratios``: the paper's, as its tables imply."""
    eps = sorted(fm_fe)
    lead, lead_int = trend([fm_fe[ep] for ep in eps], ratio_of, increasing=True)
    ratios = {ep: ratio_of(fm_fe[ep]) for ep in eps}
    return repro.claim("2/8", "FEPLB's lead over FasterMoE grows with EP", lead, ratios[eps[-1]], "x",
                       note=claim_note(lead, lead_int, "x",
                                       f"FasterMoE / FEPLB {what} at EP = "
                                       + ", ".join(map(str, eps)) + ": "
                                       + ", ".join(f"{ratios[ep]:.2f}x" for ep in eps)
                                       + f" (paper: {paper_ratios}; holds if it grows at each step)"))


def estimate_cell(repro, row: str, column: str, ours: float, interval: tuple[float, float],
                  unit: str, note: str, interval_unit: str = ""):
    """A cell for a number estimated from the trace: graded ``close`` when the paper's value
    lies inside our 95% interval over the layers (the note gives the interval)."""
    pv = repro.paper_value(row, column)
    tol = interval_tolerance(ours, interval, None if pv is None else pv.value)
    return repro.compare(row, column, ours, unit, note=f"{note}; {interval_note(interval, interval_unit)}",
                         tolerance=tol)


def trend(groups, stat, increasing: bool) -> tuple[bool | None, list[tuple[float, float]]]:
    """Does stat(group) rise (``increasing``) or fall from each group to the next? True when
    every step's interval of stat(next) - stat(this) is on that side of 0, False when one step
    is on the other side, None when a step cannot be told apart from 0 (and none contradicts)."""
    verdict, intervals = True, []
    for a, b in zip(groups, groups[1:]):
        interval = bootstrap_interval(lambda ga, gb: stat(gb) - stat(ga), a, b)
        intervals.append(interval)
        d = direction(interval)
        if d is None:
            verdict = None if verdict else verdict
        elif d != increasing:
            verdict = False
    return verdict, intervals


def claim_note(holds: bool | None, intervals, unit: str, text: str) -> str:
    """A claim's note: what was tested, and the interval(s) of the change it was decided on."""
    spans = ", ".join(f"{fmt(lo, True)} to {fmt(hi, True)}{unit}" for lo, hi in intervals)
    if holds is None:
        return (f"{text}; not decided: our sampling error cannot tell (95% interval of the "
                f"difference {spans})")
    return f"{text}; 95% interval of the difference {spans}"


def mean_of(group) -> float:
    return _mean(group)


def change_of(pairs) -> float:
    """Percent change of the mean of the first items vs the mean of the second ones."""
    return change_pct(_mean(p[0] for p in pairs), _mean(p[1] for p in pairs))


def ratio_of(pairs) -> float:
    return _mean(p[0] for p in pairs) / _mean(p[1] for p in pairs)


# E[max of n independent standard normals] (tables of normal order statistics): 0.564, 1.029,
# 1.424 for n = 2, 4, 8. With independent experts a device's excess over the mean is about
# sigma_device x E[max of EP normals], and sigma_device, relative to a device's load, grows like
# sqrt(EP) (E / EP experts per device), so the straggler at a fixed load per device grows by
# sqrt(EP) E[max of EP] / (sqrt(2) E[max of 2]) from EP = 2: 2.58x at EP = 4, 5.05x at EP = 8.
EXPECTED_MAX_NORMAL = {2: 0.5642, 4: 1.0294, 8: 1.4236}


def independent_growth(ep: int) -> float:
    """The straggler's growth from EP = 2 to ``ep`` for independent experts (see above)."""
    return (ep ** 0.5 * EXPECTED_MAX_NORMAL[ep]) / (2 ** 0.5 * EXPECTED_MAX_NORMAL[2])


@dataclass(frozen=True)
class Imbalance:
    """One micro-batch's imbalance under plain EP (Before LB)."""

    straggler: float          # max - mean rows per device
    device_max_mean: float    # max / mean rows per device
    expert_max_mean: float    # max / mean rows per expert
    idle_share: float         # (max - mean) / max rows per device: the share the others wait
    expert_max: float         # rows of the busiest expert
    device_gap: float         # max - min rows per device


def imbalance(expert_counts, rank_of_expert, world: int) -> Imbalance:
    c = torch.as_tensor(expert_counts, dtype=torch.int64)
    d = device_loads(c, rank_of_expert, world).double()
    mean_d, max_d = float(d.mean()), float(d.max())
    return Imbalance(straggler=max_d - mean_d, device_max_mean=max_d / mean_d,
                     expert_max_mean=float(c.max()) / float(c.double().mean()),
                     idle_share=(max_d - mean_d) / max_d, expert_max=float(c.max()),
                     device_gap=max_d - float(d.min()))


def prediction_error(previous_counts, counts) -> float:
    """How far the previous micro-batch's per-expert counts (the history FasterMoE predicts
    from) are from this one's: sum |c - c_prev| / sum c."""
    c = torch.as_tensor(counts, dtype=torch.float64)
    p = torch.as_tensor(previous_counts, dtype=torch.float64)
    return float((c - p).abs().sum() / c.sum())


@dataclass(frozen=True)
class TraceStats:
    """The Before LB imbalance of one EP configuration's trace: means over the replayed
    micro-batches (the first of each layer only seeds the history, as in the replay), and the
    per-layer token straggler (the independent samples)."""

    ep: int
    rows_per_device: float
    straggler: float
    device_max_mean: float
    expert_max_mean: float
    idle_share: float
    expert_max: float
    device_gap: float
    prediction_error: float
    layer_stragglers: tuple[float, ...]
    layer_prediction_errors: tuple[float, ...]


def trace_stats(params: dict, ep: int) -> TraceStats:
    key = (tuple(sorted((k, params[k]) for k in DEFAULTS)), ep)
    if key not in _STATS:
        trace = trace_for(params, ep)
        ranks = contiguous_ranks(trace.num_experts, ep)
        samples, errors, layers, layer_errors = [], [], [], []
        for layer in range(trace.num_layers):
            row, err = [], []
            for mb in range(1, trace.num_micro_batches):
                counts = trace.expert_counts(layer, mb)
                row.append(imbalance(counts, ranks, ep))
                err.append(prediction_error(trace.expert_counts(layer, mb - 1), counts))
            samples += row
            errors += err
            layers.append(_mean(s.straggler for s in row))
            layer_errors.append(_mean(err))
        _STATS[key] = TraceStats(
            ep=ep, rows_per_device=float(trace.counts[0, 0].sum()) / ep,
            straggler=_mean(s.straggler for s in samples),
            device_max_mean=_mean(s.device_max_mean for s in samples),
            expert_max_mean=_mean(s.expert_max_mean for s in samples),
            idle_share=_mean(s.idle_share for s in samples),
            expert_max=_mean(s.expert_max for s in samples),
            device_gap=_mean(s.device_gap for s in samples),
            prediction_error=_mean(errors), layer_stragglers=tuple(layers),
            layer_prediction_errors=tuple(layer_errors))
    return _STATS[key]


_STATS: dict = {}


# --- claims in words ---------------------------------------------------------------------------

def strictly_increasing(values) -> bool:
    xs = list(values)
    return all(a < b for a, b in zip(xs, xs[1:]))


def strictly_decreasing(values) -> bool:
    return strictly_increasing([-x for x in values])


def derived_printed(numerator: str, denominator: str, digits: int) -> str:
    """A ratio of two printed paper values, printed to ``digits`` decimals (a derived paper
    value: its source says which printed numbers it divides)."""
    return f"{float(numerator.replace(',', '')) / float(denominator.replace(',', '')):.{digits}f}"


# --- notes ------------------------------------------------------------------------------------

def trace_note(params: dict, ep: int) -> str:
    """Which trace a cell's number comes from (short; the full description is in assumptions)."""
    return f"synthetic trace, EP={ep}, seed={int(params['seed']) * 1000 + ep}"


def trace_assumption(params: dict) -> str:
    return (f"Trace: synthetic, 128 experts, top-8, EP sources x {params['tokens']} tokens per "
            f"micro-batch, {params['layers']} layers x {params['micro_batches']} micro-batches, "
            f"skew={params['skew']}, drift={params['drift']}, noise={params['noise']}; GLM-5 "
            f"routing is not public. The trace's imbalance differs from GLM-5's (feplb-table3's "
            f"'trace:' cells): it grows much faster with EP.")


def printed_percentage_note(value: str, base: str, printed_pct: str) -> str | None:
    """Check a printed '(-55%)' against the printed values it relates (paper self-consistency)."""
    v, b = float(value.replace(",", "")), float(base.replace(",", ""))
    implied = 100.0 * (v - b) / b
    if round(implied) == float(printed_pct):
        return None
    return (f"paper: {value} vs {base} is {implied:+.1f}%, printed {printed_pct}% "
            f"(rounding differs from the table's own values)")


ASSUMPTIONS = [
    "Routing: synthetic (components/routing_trace.synthetic_trace); GLM-5 traces are not public.",
    "FasterMoE: shadows predicted from the previous micro-batch, greedy while the predicted "
    "maximum load drops, at most max_num_dyn shadows (components/balance/fastermoe_shadow.py).",
    "FEPLB: dynamic experts re-picked from the previous micro-batch (the Router Predictor), "
    "greedy balancer on the actual counts with tau and max_num_dyn: the busiest dynamic expert "
    "of the most loaded device, copied whole while it fits the gap to the least loaded one "
    "(Sec. 2; components/balance/feplb.py).",
    "Micro-batch 0 of each layer only seeds the history; every method is averaged over the same "
    "micro-batches, each layer with equal weight; standard errors are over layers.",
]
