"""The MoE step-time validation set (moe_step_points.json) and the planner scored against it.

The data file holds published MoE training measurements: each point quotes its source (file or
paper, table, row), hardware, framework, precision and parallel layout, with the provenance of
every layout field; a field the source does not state is null and named in ``not_stated``.

Scoring: for each point with a platform profile, a zoo model and the planner's inputs stated, the
planner evaluates that one layout with every degree fixed (``plan_parallel`` with tp, pp, ep, cp,
vpp, etp, sp, micro-batches, ZeRO stage and recompute mode given) and its step time is compared
with the measured one (converted from the printed unit by the data file's ``conversions``).
Nothing is fitted: the planner is called as it is. Per layout set (one model on one system, three
or more layouts) the measured and predicted per-GPU throughputs are ranked: Spearman's rho, and
the measured throughput of the planner's top pick over the best measured one.

Run ``python -m moe_repro.reproductions.moe_step_points`` for the report (``--json`` for data).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from importlib import resources

DATA = "moe_step_points.json"
REQUIRED = ("source", "where", "printed", "unit", "hardware", "gpu_generation", "vendor")
REQUIRED += ("framework", "precision", "model", "layout", "layout_provenance", "not_stated")
# what the planner needs fixed to evaluate one layout
PLANNER_KEYS = ("gpus", "tp", "pp", "cp", "ep", "micro_batch", "global_batch", "seq")
# a layout set's members are distinct layouts when these differ
LAYOUT_IDENTITY = ("gpus", "tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch", "global_batch")
LAYOUT_IDENTITY += ("seq", "recompute", "dispatcher")


def load(text: str | None = None) -> dict:
    """The data file (package data), or ``text`` parsed the same way."""
    if text is None:
        text = resources.files("moe_repro.reproductions").joinpath(DATA).read_text()
    return json.loads(text)


def number(s: str) -> float:
    """A printed value as a number: thousands separators dropped, a parenthesised variant after
    the value ignored ('338 (330)' is 338)."""
    return float(s.split("(")[0].replace(",", "").strip())


def problems(doc: dict) -> list[str]:
    """Integrity problems of the data (empty when none): required fields, the layout keys, null
    exactly where ``not_stated`` says, a known source and unit, a numeric printed value, and the
    layout arithmetic GPUs = TP x PP x CP x DP where all four are stated."""
    out = []
    keys = doc.get("layout_keys") or []
    for p in doc.get("points", []):
        pid = p.get("id", "?")
        for k in REQUIRED:
            if p.get(k) in (None, "", {}) and not (k == "not_stated" and p.get(k) == []):
                out.append(f"{pid}: no {k}")
        if p.get("source") not in doc.get("sources", {}):
            out.append(f"{pid}: unknown source {p.get('source')!r}")
        if p.get("unit") not in doc.get("conversions", {}):
            out.append(f"{pid}: unit {p.get('unit')!r} has no stated conversion")
        try:
            number(str(p.get("printed")))
        except ValueError:
            out.append(f"{pid}: printed value {p.get('printed')!r} is not a number")
        if not (p.get("model") or {}).get("name"):
            out.append(f"{pid}: model has no name")
        lay, ns = p.get("layout") or {}, set(p.get("not_stated") or [])
        for k in keys:
            if k not in lay:
                out.append(f"{pid}: layout lacks {k}")
            elif (lay[k] is None) != (k in ns):
                out.append(f"{pid}: layout {k} is {lay[k]!r} but not_stated says {k in ns}")
        if all(lay.get(k) is not None for k in ("gpus", "tp", "pp", "cp", "dp")):
            if lay["tp"] * lay["pp"] * lay["cp"] * lay["dp"] != lay["gpus"]:
                out.append(f"{pid}: TP x PP x CP x DP != GPUs")
        if all(lay.get(k) is not None for k in ("global_batch", "dp", "micro_batch")):
            if lay["global_batch"] % (lay["dp"] * lay["micro_batch"]):
                out.append(f"{pid}: global batch is not a multiple of DP x micro-batch")
    return out


def complete(p: dict) -> bool:
    return not p["not_stated"]


def generation(p: dict) -> str:
    """GPU generation or vendor family: Blackwell Ultra counts with Blackwell."""
    return p["gpu_generation"].replace(" Ultra", "")


# ------------------------------------------------------------------------------- measured


def megatron_flops_per_step(m, seq: int, global_batch: int) -> float:
    """FLOPs of one step as Megatron-LM counts them for its 'TFLOP/s/GPU' log line:
    ``num_floating_point_operations`` (NVIDIA/Megatron-LM megatron/training/training.py,
    ``transformer_flops``), for a zoo model without MTP layers. Per token: 3 (forward, wgrad,
    dgrad) x 2 (FLOPs per multiply-add) x [h x (dense FFN x ffn_factor x dense layers + (routed
    width x top-k + shared width) x ffn_factor x MoE layers) + attention x layers + h x V], with
    ffn_factor 3 for SwiGLU (2 otherwise); GQA/MHA attention = h (q + k + v) + q seq / 2 x 2 +
    q h; MLA attention as the same function writes it (latent projections with their norms'
    ``+ 1``, core attention at seq / 2). V is the model's vocabulary: Megatron pads it to a
    multiple of 128 x TP, which the sources do not print (under 0.1% of the FLOPs here)."""
    from moe_repro.components.resources.formulas import attention_widths

    h, L = m.d_model, m.layers
    ffn = 3 if m.n_mat == 3 else 2
    n_moe = m.n_moe_layers
    n_dense = L - n_moe
    shared = m.n_shared * (m.d_ffn_shared or m.d_ffn)
    mlp = h * ((m.d_ffn_dense or 0) * ffn * n_dense + (m.d_ffn * m.top_k + shared) * ffn * n_moe)
    if m.attn_params == "mla" and m.mla is not None:
        a, H = m.mla, m.heads
        q_term = (
            h * H * (a.qk_nope_head_dim + a.qk_rope_head_dim)
            if a.q_lora_rank is None
            else a.q_lora_rank * (h + H * (a.qk_nope_head_dim + a.qk_rope_head_dim) + 1)
        )
        attn = (
            q_term
            + a.kv_lora_rank * (h + H * (a.qk_nope_head_dim + a.v_head_dim) + 1)
            + h * a.qk_rope_head_dim
            + H * a.v_head_dim * h
            + seq * H * (a.qk_nope_head_dim + a.qk_rope_head_dim) / 2
            + seq * H * a.v_head_dim / 2
        )
    else:
        w = attention_widths(m)
        q, kv = w["q"], w["k"]
        attn = h * (q + 2 * kv) + q * seq / 2 * 2 + q * h
    per_token = 3 * 2 * (mlp + attn * L + h * (m.vocab or 0))
    return per_token * seq * global_batch


def _flop_count(p: dict, doc: dict | None) -> str:
    src = ((doc or {}).get("sources") or {}).get(p["source"]) or {}
    return str(src.get("flop_count", "")).split(":")[0]


def measured_step_s(p: dict, doc: dict | None = None) -> float | None:
    """The measured step time by the data file's conversion for the point's unit, or None
    where the unit has no conversion used here (TFLOP/s needs the source's own FLOP count:
    converted where ``doc`` names it for the point's source, Megatron-LM's)."""
    x, lay, unit = number(p["printed"]), p["layout"], p["unit"]
    tokens = (lay.get("global_batch") or 0) * (lay.get("seq") or 0)
    if unit == "seconds per iteration":
        return x
    if unit == "TFLOP/s per GPU" and tokens and _flop_count(p, doc) == "megatron-lm":
        from moe_repro.components.model.zoo import get_model

        if not (p["model"] or {}).get("zoo"):
            return None
        flops = megatron_flops_per_step(
            get_model(p["model"]["zoo"]), lay["seq"], lay["global_batch"]
        )
        return flops / (lay["gpus"] * x * 1e12)
    if unit == "tokens/s per GPU" and tokens:
        return tokens / (x * lay["gpus"])
    if unit.startswith("million H800 GPU hours") and tokens:
        return tokens / (14.8e12 / (x * 1e6 * 3600) * lay["gpus"])
    return None


def throughput(p: dict) -> tuple[str, float] | None:
    """The per-GPU rate a layout set ranks on: tokens/s/GPU where printed or derivable, else the
    printed TFLOP/s/GPU (also_printed counts)."""
    step = measured_step_s(p)
    lay = p["layout"]
    if p["unit"] == "tokens/s per GPU":
        return "tokens/s/GPU", number(p["printed"])
    if step and lay.get("global_batch") and lay.get("seq"):
        return "tokens/s/GPU", lay["global_batch"] * lay["seq"] / (step * lay["gpus"])
    if p["unit"] == "TFLOP/s per GPU":
        return "TFLOP/s/GPU", number(p["printed"])
    return None


# ------------------------------------------------------------------------------- predicted


def _recompute(r: str | None) -> tuple[tuple[str, ...] | None, str]:
    """(the planner's recompute mode for a stated one, a note where they differ): 'none' and
    'full' as stated; a module list (Megatron's --recompute-modules: layernorm, moe_act, moe,
    shared_expert, ...) is timed as 'none' unless it names the attention core, the one module the
    planner's 'selective' mode recomputes (Korthikanti et al. Sec. 5); the note names the
    recomputed modules left untimed. None leaves the mode to the planner."""
    if r is None:
        return None, ""
    if r in ("none", "full"):
        return (r,), ""
    if "core_attn" in r:
        return ("selective",), ""
    return ("none",), f"recompute ({r}) not timed"


# the planner's EP dispatcher (ep_time.DISPATCHERS) for a stated one; a dispatcher the EP model
# does not have (Piper's HALO, DeepSeek's own kernels) and an unstated one get Megatron-core's
# default, the flat alltoall
DISPATCHERS = {
    "DeepEP": "deepep",
    "HybridEP": "hybrid-ep",
    "flex (HybridEP)": "hybrid-ep",
    "A2A": "alltoall",
    "alltoall": "alltoall",
    "torchtitan all-to-all (default)": "alltoall",
}


def dispatcher(p: dict) -> tuple[str, str]:
    """(the planner's dispatcher, a note where it is not the stated one)."""
    stated = p["layout"].get("dispatcher")
    if stated in DISPATCHERS:
        return DISPATCHERS[stated], ""
    if stated is None:
        return "alltoall", "dispatcher not stated: alltoall"
    return "alltoall", f"dispatcher {stated!r} not modelled: alltoall"


def overlap_ep(p: dict) -> bool:
    """EP communication overlapped with another micro-batch's compute where the row says so
    (the Model Zoo's '+1f1b overlap' note, or A2A_OVERLAP=1 in its printed command: Megatron-core
    --overlap-moe-expert-parallel-comm)."""
    return "1f1b overlap" in p["where"] or p["layout_provenance"].get("a2a_overlap") == 1


def gemm_precision(p: dict) -> str:
    """The planner's GEMM precision for a point: ``fp8`` where its recipe runs the linear
    layers in FP8 (FP8 delayed / current / block scaling, MXFP8), else ``bf16``."""
    return "fp8" if "FP8" in p["precision"].upper() else "bf16"


def slurm_segment_gpus(gpus: int, gpus_per_tray: int = 4, most: int = 18) -> int:
    """GPUs per NVLink domain of a Megatron-Bridge job on 4-GPU trays: its launcher passes Slurm
    ``--segment`` = the node count up to 18, else the largest divisor of it up to 18
    (NVIDIA-NeMo/Megatron-Bridge scripts/performance/utils/executors.py, since commit 568b3a3ef,
    2025-08-28, before the 25.09 release), so every segment of that many nodes sits in one NVL72
    rack."""
    nodes = gpus // gpus_per_tray
    seg = nodes if nodes <= most else next(s for s in range(most, 0, -1) if nodes % s == 0)
    return seg * gpus_per_tray


def point_platform(p: dict, calibrated: bool = True, doc: dict | None = None):
    """The point's platform profile, or None and why. On an NVL72 profile (one node = one
    NVLink domain) a job gets nodes of the GPUs it holds in each domain: all of them when it
    fits in one, the source's stated placement otherwise (its ``nvlink_placement``; Megatron-
    Bridge's Slurm segments, :func:`slurm_segment_gpus`; the Model Zoo's printed SEGMENT per row);
    with none stated it is not placed.
    ``calibrated=False``: the profile without its measured-layer calibration."""
    import copy

    from moe_repro.components.network.platform import from_dict, load_builtin
    from moe_repro.components.resources.time_model import uncalibrated

    plat = load_builtin(p["platform"])
    if not calibrated:
        plat = uncalibrated(plat)
    gpus = p["layout"].get("gpus") or 0
    segment = p["layout_provenance"].get("nvlink_segment_nodes")
    if plat.gpus_per_node <= 8 or (not segment and gpus % plat.gpus_per_node == 0):
        return plat, ""
    if segment:  # the row's printed Slurm --segment (4-GPU trays)
        per_domain = 4 * segment
    elif gpus <= plat.gpus_per_node:
        per_domain = gpus
    else:
        src = ((doc or {}).get("sources") or {}).get(p["source"]) or {}
        if not str(src.get("nvlink_placement", "")).startswith("slurm-segment"):
            return None, (
                f"{gpus} GPUs span {plat.gpus_per_node}-GPU NVLink domains and the source "
                "does not state how they are placed in them"
            )
        per_domain = slurm_segment_gpus(gpus)
    raw = copy.deepcopy(plat.raw)
    raw["node"].update(
        gpus=per_domain, nics=per_domain, gpu_nic_affinity=[[i] for i in range(per_domain)]
    )
    plat = from_dict(raw)
    return plat, ""


def planner_inputs(
    p: dict, calibrated: bool = True, doc: dict | None = None
) -> tuple[dict | None, str]:
    """The keyword arguments that fix the point's layout for ``plan_parallel`` (with the
    platform under ``platform``), or None and why."""
    if p.get("platform") is None:
        return None, p.get("platform_note", "no platform profile")
    if not (p["model"] or {}).get("zoo"):
        return None, "model not in the zoo: " + p["model"].get("why_not", "")
    lay = p["layout"]
    missing = [k for k in PLANNER_KEYS if lay.get(k) is None]
    if missing:
        return None, "layout not stated: " + ", ".join(missing)
    plat, why_not = point_platform(p, calibrated, doc)
    if plat is None:
        return None, why_not
    if lay["gpus"] % plat.gpus_per_node:
        return None, f"{lay['gpus']} GPUs is not whole {plat.gpus_per_node}-GPU nodes"
    dp = lay.get("dp") or lay["gpus"] // (lay["tp"] * lay["pp"] * lay["cp"])
    kw = dict(
        nodes=lay["gpus"] // plat.gpus_per_node,
        seq=lay["seq"],
        global_batch=lay["global_batch"],
        precision="megatron",
        zero=(p["layout_provenance"].get("zero_stage_for_planner", 1),),
        recompute=_recompute(lay.get("recompute"))[0],
        tp=lay["tp"],
        pp=lay["pp"],
        ep=lay["ep"],
        cp=lay["cp"],
        vpp=lay.get("vpp"),
        etp=lay.get("etp"),
        micro_batches=lay["global_batch"] // (dp * lay["micro_batch"]),
        sp=lay["tp"] > 1,
        gemm_precision=gemm_precision(p),
        dispatcher=dispatcher(p)[0],
        overlap_ep=overlap_ep(p),
        platform=plat,
    )
    free = [k for k in ("etp", "recompute", "vpp") if lay.get(k) is None]
    notes = [("planner chooses: " + ", ".join(free)) if free else "", dispatcher(p)[1]]
    notes.append(_recompute(lay.get("recompute"))[1])
    return kw, "; ".join(n for n in notes if n)


MEMORY_REJECTED = "the memory model rejects this layout, which ran"


def predict_step_s(
    p: dict, calibrated: bool = True, doc: dict | None = None
) -> tuple[float | None, str]:
    """The planner's step time for the point's fixed layout, or None and why. A layout the
    memory model rejects (it ran, so the memory model is wrong there) is still timed, from the
    closest miss the planner reports, and its note says so (MEMORY_REJECTED)."""
    from moe_repro.components.model.zoo import get_model
    from moe_repro.components.resources.parallel_planner import plan_parallel

    kw, why = planner_inputs(p, calibrated, doc)
    if kw is None:
        return None, why
    plat = kw.pop("platform")
    pl = plan_parallel(get_model(p["model"]["zoo"]), plat, **kw)
    b = pl.best
    notes = [why]
    if b is None:
        misses = [c for c in pl.candidates if not c.feasible and c.step_s > 0]
        if not misses:
            return None, "rejected: " + "; ".join(r["reason"] for r in pl.rejected[:1])
        b = misses[0]
        notes.insert(0, f"{MEMORY_REJECTED} ({b.why_not})")
    if b.first_stage_layers or b.last_stage_layers:
        notes.append(f"uneven stages {b.layers_per_stage}")
    parts = ", ".join(f"{k} {v:.2f}" for k, v in b.parts.items() if v > 0)
    notes.append(f"seconds: {parts}")
    return b.step_s, "; ".join(x for x in notes if x)


# ------------------------------------------------------------------------------- scoring


@dataclass
class Scored:
    point_id: str
    measured: float | None  # seconds per step (None: the unit is not converted)
    predicted: float | None  # seconds per step (None: no prediction; ``note`` says why)
    note: str = ""
    source: str = ""

    @property
    def error(self) -> float | None:
        if self.measured is None or self.predicted is None:
            return None
        return (self.predicted - self.measured) / self.measured


@dataclass
class SetScore:
    name: str
    metric: str
    members: list[str]
    distinct_layouts: int
    measured: dict[str, float]
    predicted: dict[str, float]  # per-GPU throughput from the predicted step (tokens/s/GPU)
    rho: float | None = None
    top_pick: str | None = None
    top_pick_vs_best: float | None = None  # measured rate of the top pick / best measured rate
    note: str = ""


@dataclass
class Report:
    scored: list[Scored]
    sets: list[SetScore]
    mape: float | None = None
    max_abs_error: float | None = None
    worst: str = ""
    counts: dict = field(default_factory=dict)
    by_source: dict = field(default_factory=dict)  # source -> {"points", "mape", "max"}
    loso_mape: float | None = None  # every source held out in turn (see ``fitted_constants``)
    loso_max: float | None = None
    uncalibrated_mape: float | None = None  # every profile's calibration factor switched off
    fitted: dict = field(default_factory=dict)  # constant -> ids of the points that set it


def fitted_constants(doc: dict) -> dict[str, list[str]]:
    """Every constant of the time model that a point of this set set, with the points: none.
    The planner is called as it is: the profiles' rates come from data sheets or from
    micro-benchmarks that are not points here, and the one measured-layer calibration
    (dgx-a100's calibration.layer_forward, Korthikanti et al. Table 4) is from no point of this
    set. Kept as a function so that a constant fitted later names its points and the
    leave-one-source-out score re-derives it without them."""
    return {}


def _mape(errs: list[float]) -> float | None:
    return sum(abs(e) for e in errs) / len(errs) if errs else None


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation with average ranks for ties; None under two points or when
    either side is constant."""
    if len(xs) != len(ys) or len(xs) < 2:
        return None

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def layout_sets(points: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for p in points:
        if p.get("layout_set"):
            out.setdefault(p["layout_set"], []).append(p)
    return out


def distinct_layouts(members: list[dict]) -> int:
    return len({tuple(str(m["layout"].get(k)) for k in LAYOUT_IDENTITY) for m in members})


def score_set(name: str, members: list[dict], by_id: dict[str, Scored]) -> SetScore:
    rates = {m["id"]: throughput(m) for m in members}
    metrics = {r[0] for r in rates.values() if r}
    metric = metrics.pop() if len(metrics) == 1 and all(rates.values()) else ""
    if not metric:  # mixed units: TFLOP/s where every member prints it
        tf = {}
        for m in members:
            v = m["printed"] if m["unit"] == "TFLOP/s per GPU" else None
            v = v or next(iter((m.get("also_printed") or {}).values()), None)
            if v is not None:
                tf[m["id"]] = number(v)
        rates = {k: ("TFLOP/s/GPU", v) for k, v in tf.items()}
        metric = "TFLOP/s/GPU" if len(tf) == len(members) else "none"
    measured = {k: v[1] for k, v in rates.items() if v}
    predicted = {}
    for m in members:
        s = by_id[m["id"]]
        lay = m["layout"]
        if s.predicted and lay.get("global_batch") and lay.get("seq"):
            predicted[m["id"]] = lay["global_batch"] * lay["seq"] / (s.predicted * lay["gpus"])
    ss = SetScore(
        name, metric, [m["id"] for m in members], distinct_layouts(members), measured, predicted
    )
    both = [k for k in ss.members if k in measured and k in predicted]
    if len(both) < 2:
        ss.note = f"not ranked: {len(both)} member(s) with a measured rate and a prediction"
        return ss
    if metric != "tokens/s/GPU":
        ss.note = (
            f"ranked on predicted tokens/s/GPU against measured {metric} (same model and sequence)"
        )
    ss.rho = spearman([measured[k] for k in both], [predicted[k] for k in both])
    ss.top_pick = max(both, key=lambda k: predicted[k])
    ss.top_pick_vs_best = measured[ss.top_pick] / max(measured[k] for k in both)
    return ss


def _scored(doc: dict, calibrated: bool = True) -> list[Scored]:
    out = []
    for p in doc["points"]:
        try:
            pred, note = predict_step_s(p, calibrated, doc)
        except (ValueError, KeyError) as e:  # the planner refused its input
            pred, note = None, f"planner error: {e}"
        out.append(Scored(p["id"], measured_step_s(p, doc), pred, note, p["source"]))
    return out


def score(doc: dict | None = None, uncalibrated: bool = True) -> Report:
    """Every point scored (a prediction where the planner has what it needs), every layout set
    ranked, the error per source, the leave-one-source-out error (each source scored with every
    constant a point set re-derived without that source's points: :func:`fitted_constants`)
    and, with ``uncalibrated``, the error with every profile's calibration switched off."""
    doc = doc or load()
    scored = _scored(doc)
    by_id = {s.point_id: s for s in scored}
    sets = [score_set(n, ms, by_id) for n, ms in layout_sets(doc["points"]).items()]
    errs = [(abs(s.error), s.point_id) for s in scored if s.error is not None]
    rep = Report(scored, sets)
    if errs:
        rep.mape = sum(e for e, _ in errs) / len(errs)
        rep.max_abs_error, rep.worst = max(errs)
    pts = doc["points"]
    rep.fitted = fitted_constants(doc)
    sources = sorted({s.source for s in scored if s.error is not None})
    held_out: list[float] = []
    source_of = {s.point_id: s.source for s in scored}
    for src in sources:
        src_errs = [s.error for s in scored if s.source == src and s.error is not None]
        # no constant is set by a point (fitted_constants), so holding a source out changes
        # no prediction: its held-out errors are its in-sample errors
        moved = [c for c, ids in rep.fitted.items() if any(source_of[i] == src for i in ids)]
        if moved:
            raise NotImplementedError(f"re-derive {moved} without {src}")
        held_out += src_errs
        rep.by_source[src] = {
            "points": len(src_errs),
            "mape": _mape(src_errs),
            "max": max(abs(e) for e in src_errs),
        }
    rep.loso_mape = _mape(held_out)
    rep.loso_max = max((abs(e) for e in held_out), default=None)
    if uncalibrated:
        raw = [s.error for s in _scored(doc, calibrated=False) if s.error is not None]
        rep.uncalibrated_mape = _mape(raw)
    rep.counts = {
        "points": len(pts),
        "complete": sum(complete(p) for p in pts),
        "sources": len({p["source"] for p in pts}),
        "generations": sorted({generation(p) for p in pts}),
        "with_time": sum(s.measured is not None for s in scored),
        "predicted": sum(s.predicted is not None for s in scored),
        "scored": len(errs),
        "memory_rejected_but_timed": sum(
            MEMORY_REJECTED in s.note for s in scored if s.error is not None
        ),
    }
    return rep


def flop_check(doc: dict | None = None) -> list[tuple[str, float]]:
    """The FLOP count checked where a source prints a time or a token rate beside its TFLOP/s
    per GPU for one row: (point, megatron_flops_per_step / the FLOPs the source's own TFLOP/s
    imply), 1.0 where the count matches the source's (both printed numbers are rounded). Rows:
    the Model Zoo's step time with 'Per GPU TF', Megatron-Bridge's tokens/s per GPU with 'Model
    TFLOP / sec / GPU'. A ratio away from 1 says the zoo model is not the model the source
    counted (DeepSeek-V3's MTP layer, gpt-oss's sliding-window attention are not in the zoo)."""
    from moe_repro.components.model.zoo import get_model

    doc = doc or load()
    out = []
    for p in doc["points"]:
        also = p.get("also_printed") or {}
        lay = p["layout"]
        if not (p["model"] or {}).get("zoo") or not lay.get("seq"):
            continue
        m = get_model(p["model"]["zoo"])
        if p["unit"] == "seconds per iteration" and "Per GPU TF" in also:
            if _flop_count(p, doc) != "megatron-lm":
                continue
            f = megatron_flops_per_step(m, lay["seq"], lay["global_batch"])
            tf = number(also["Per GPU TF"])
            out.append((p["id"], f / (tf * 1e12 * lay["gpus"] * number(p["printed"]))))
        elif p["unit"] == "tokens/s per GPU" and "Model TFLOP / sec / GPU" in also:
            per_token = megatron_flops_per_step(m, lay["seq"], 1) / lay["seq"]
            tf = number(also["Model TFLOP / sec / GPU"])
            out.append((p["id"], number(p["printed"]) * per_token / (tf * 1e12)))
    return out


def passes(rep: Report, max_mape: float, min_rho: float) -> bool:
    """A pass/fail verdict on a report: MAPE at most ``max_mape`` and every ranked set's rho at
    least ``min_rho``; a report with nothing scored fails."""
    if rep.mape is None or rep.mape > max_mape:
        return False
    return all(s.rho is None or s.rho >= min_rho for s in rep.sets)


def _fmt(x: float | None, f: str = "{:.3g}") -> str:
    return "-" if x is None else f.format(x)


def render(rep: Report, doc: dict) -> str:
    pts = {p["id"]: p for p in doc["points"]}
    lines = [f"counts: {json.dumps(rep.counts)}", ""]
    lines.append(f"{'point':44} {'measured s':>10} {'predicted s':>11} {'error':>8}  note")
    for s in rep.scored:
        if s.measured is None and s.predicted is None:
            continue
        err = _fmt(s.error, "{:+.1%}")
        lines.append(
            f"{s.point_id:44} {_fmt(s.measured):>10} {_fmt(s.predicted):>11} {err:>8}  {s.note[:90]}"
        )
    lines.append("")
    lines.append(
        f"MAPE {_fmt(rep.mape, '{:.1%}')} over {rep.counts['scored']} points; "
        f"max |error| {_fmt(rep.max_abs_error, '{:.1%}')} ({rep.worst}); "
        f"leave-one-source-out MAPE {_fmt(rep.loso_mape, '{:.1%}')}, max "
        f"{_fmt(rep.loso_max, '{:.1%}')} (constants set by a point: "
        f"{', '.join(rep.fitted) or 'none'}); calibration off: "
        f"{_fmt(rep.uncalibrated_mape, '{:.1%}')}"
    )
    for src, b in rep.by_source.items():
        lines.append(
            f"  source {src}: {b['points']} points, MAPE {_fmt(b['mape'], '{:.1%}')}, "
            f"max {_fmt(b['max'], '{:.1%}')}"
        )
    unscored = [s for s in rep.scored if s.error is None]
    why: dict[str, int] = {}
    for s in unscored:
        p = pts[s.point_id]
        if s.measured is not None:
            key = s.note.split(":")[0]
        elif p["unit"] == "tokens/s per GPU":
            key = "no measured step time (global batch not stated)"
        elif p["unit"] == "TFLOP/s per GPU" and p["source"] in ("xmoe-paper", "piper-paper"):
            key = "unit not converted (TFLOP/s per GPU; the source prints no FLOP count)"
        else:
            key = f"unit not converted ({p['unit']})"
        why[key] = why.get(key, 0) + 1
    lines.append("not scored: " + "; ".join(f"{k}: {v}" for k, v in sorted(why.items())))
    by_model: dict[str, list[float]] = {}
    for pid, ratio in flop_check(doc):
        by_model.setdefault(pts[pid]["model"]["name"], []).append(ratio)
    lines.append(
        "FLOP count (Megatron-LM's, on the zoo model) / the source's own, where a row prints both: "
        + "; ".join(f"{k} {min(v):.3f}-{max(v):.3f}" for k, v in by_model.items())
    )
    lines.append("")
    for ss in rep.sets:
        lines.append(
            f"set {ss.name}: {len(ss.members)} points, {ss.distinct_layouts} distinct layouts, "
            f"ranked on {ss.metric}; rho {_fmt(ss.rho, '{:+.2f}')}; top pick {ss.top_pick or '-'} "
            f"at {_fmt(ss.top_pick_vs_best, '{:.0%}')} of the best measured {ss.note}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    doc = load()
    rep = score(doc)
    if args.json:
        print(
            json.dumps(
                {
                    "counts": rep.counts,
                    "mape": rep.mape,
                    "max_abs_error": rep.max_abs_error,
                    "worst": rep.worst,
                    "loso_mape": rep.loso_mape,
                    "uncalibrated_mape": rep.uncalibrated_mape,
                    "by_source": rep.by_source,
                    "points": [dict(vars(s), error=s.error) for s in rep.scored],
                    "sets": [vars(s) for s in rep.sets],
                },
                indent=1,
            )
        )
    else:
        print(render(rep, doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
