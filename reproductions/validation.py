"""Predictions scored against published measurements of real clusters (``repro validate``).

The points are data (validation_points.json, next to this module): each one is a number its
source prints (paper or benchmark page, table, row, column, hardware), in the reproductions'
paper-value form, with the configuration the source states. Five predictors are scored:

- ``step-time``: the parallelism planner with the published configuration fixed (from the paper
  and the launch scripts its authors published, each point's ``configuration_source``); the
  measured step time is derived from the printed throughput with the source's own FLOP count
  (Narayanan et al. Eq. 3), so that ours and theirs count the same work.
- ``memory``: the planner's per-GPU memory on the binding pipeline stage, in GiB.
- ``alltoall-bandwidth``: the flow-level network simulator on the named machine's profile, on
  the link the source names as the bottleneck.
- ``gemm-time``: the time model's GEMM against bf16 GEMMs this project measured on one H200
  (reproductions/measured/): not a published number; the source names the run.
- ``attention-core``: the time model's materialised-scores attention core against the batched
  QK^T and AV products of the same measured run.

Every predicted number is analytic or simulated, never measured here; no parameter of any
predictor was set from a scored point (the data file's ``parameters`` list says where each one
comes from). Percentage error = (predicted - measured) / measured.

Why: a model is only trusted as far as it predicts numbers measured on real clusters. What each
predictor's points are and where their configurations come from: see
docs/validation-and-grading.md.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from moe_repro.components.model.hf_config import model_from_megatron_args

GiB = 2**30
PREDICTORS = ("step-time", "memory", "alltoall-bandwidth", "gemm-time", "attention-core")
UNITS = {
    "step-time": "s",
    "memory": "GiB",
    "alltoall-bandwidth": "GB/s",
    "gemm-time": "s",
    "attention-core": "s",
}
# This project's own GEMM measurements (reproductions/measured/): file, what it holds, platform.
# Replayed from CUDA graphs: the kernels' own time, which is what gemm_time models (in a step the
# host runs ahead of the GPU); the same shapes launched eagerly from Python are beside them, not
# scored (a thin GEMM's eager time is largely its launch).
MEASURED_GEMMS = (
    ("h200-gemm-curve-graph-2026-11-26.json", "curve", "h200"),
    ("h200-layer-gemms-graph-2026-11-26.json", "layer", "h200"),
)
CEILING_SHAPE = (8192, 8192, 8192)  # where gpu.achievable_gemm_tflops was measured: not scored


@dataclass
class Scored:
    point_id: str
    predictor: str
    measured: float
    predicted: float | None  # None: the predictor gave no number (the layout did not fit, ...)
    unit: str
    source: str  # paper, table, row
    how: str  # "analytic" or "simulated"
    note: str = ""
    # what the source measured (memory: "max allocated", "max reserved", "device used"); "" where
    # the predictor has a single kind of measurement
    kind: str = ""
    family: str = ""  # "MoE" or "dense" (memory points), "" elsewhere
    capacity: float | None = None  # memory points: the GPU's memory (platform profile), GiB
    # memory points: the prediction by term (GiB): the live-tensor terms, then each sourced term
    terms: dict[str, float] | None = None

    @property
    def over_capacity(self) -> bool:
        """The prediction exceeds the GPU's memory (memory points)."""
        return None not in (self.predicted, self.capacity) and self.predicted > self.capacity

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured, or None without a prediction."""
        if self.predicted is None:
            return None
        return (self.predicted - self.measured) / self.measured

    def to_dict(self) -> dict:
        return {
            "id": self.point_id,
            "predictor": self.predictor,
            "measured": self.measured,
            "predicted": self.predicted,
            "unit": self.unit,
            "error": self.error,
            "source": self.source,
            "how": self.how,
            "note": self.note,
            "measured_kind": self.kind,
            "family": self.family,
            "capacity": self.capacity,
            "terms": self.terms,
        }


@dataclass
class Summary:
    predictor: str
    points: int
    predicted: int  # points with a prediction
    mape: float | None  # mean absolute percentage error over predicted points (fraction)
    max_abs_error: float | None
    worst: str = ""
    scored: list[Scored] = field(default_factory=list)
    # per measured kind and per model family: (label, points, predicted, MAPE, max |error|)
    groups: list[tuple[str, int, int, float | None, float | None]] = field(default_factory=list)
    predicts: str = ""  # what the predictor's number is (memory: which kind of measurement)
    # memory: runs that ran, predicted over their GPU's memory (ids); runs that ran out of memory
    # (role "oom": the need is a lower bound), each scored only for direction (over_capacity)
    over_capacity: list[str] = field(default_factory=list)
    oom: list[Scored] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "predictor": self.predictor,
            "points": self.points,
            "predicted": self.predicted,
            "mape": self.mape,
            "max_abs_error": self.max_abs_error,
            "worst": self.worst,
            "predicts": self.predicts,
            "groups": [
                {"group": g, "points": n, "predicted": k, "mape": m, "max_abs_error": x}
                for g, n, k, m, x in self.groups
            ],
            "over_capacity": self.over_capacity,
            "oom": [
                {"id": x.point_id, "predicted": x.predicted, "capacity": x.capacity}
                for x in self.oom
            ],
        }


def load_points() -> dict:
    """The validation data file (package data), with the gemm-time points of this project's own
    GEMM measurements appended (gemm_points)."""
    text = resources.files("moe_repro.reproductions").joinpath("validation_points.json").read_text()
    doc = json.loads(text)
    doc["points"] = doc["points"] + gemm_points() + attention_points()
    return doc


def gemm_points() -> list[dict]:
    """One point per measured bf16 GEMM (not the batched attention products) of MEASURED_GEMMS,
    in the data file's point form; the ceiling's own shape has role ``parameter``."""
    out = []
    for name, kind, platform in MEASURED_GEMMS:
        run = json.loads(
            resources.files("moe_repro.reproductions").joinpath("measured", name).read_text()
        )["hot"]
        for m in run["points"]:
            if "batch" in m:
                continue
            shape = (m["rows"], m["k"], m["n"])
            out.append(
                {
                    "id": f"{platform}-{kind}-{'x'.join(map(str, shape))}",
                    "predictor": "gemm-time",
                    "role": "parameter" if shape == CEILING_SHAPE else "scored",
                    "published": {
                        "paper": "measured by this project",
                        "source": f"{run['device']} {kind} "
                        f"(benchmarks/gemm_shape_curve.py, {name})",
                        "row": "x".join(map(str, shape)),
                        "column": "median seconds per product",
                        "printed": repr(m["median_s"]),
                        "unit": "s",
                        "url": f"reproductions/measured/{name}",
                        "hardware": f"one {run['device']}, torch {run['torch']}, CUDA {run['cuda']}",
                    },
                    "platform": platform,
                    "gemm": {"rows": m["rows"], "k": m["k"], "n": m["n"]},
                    "spread": (m["max_s"] - m["min_s"]) / m["median_s"],
                }
            )
    return out


def attention_points() -> list[dict]:
    """One point per (batch, head width) of the batched products in the layer run of
    MEASURED_GEMMS: QK^T ([2048 x d] @ [d x 2048], k = d) and AV ([2048 x 2048] @ [2048 x d],
    n = d) measured separately; the point is their sum, the attention core's forward."""
    out = []
    for name, kind, platform in MEASURED_GEMMS:
        run = json.loads(
            resources.files("moe_repro.reproductions").joinpath("measured", name).read_text()
        )["hot"]
        prods = {(m["batch"], m["rows"], m["k"], m["n"]): m for m in run["points"] if "batch" in m}
        for (b, r, k, n), qk in sorted(prods.items()):
            av = prods.get((b, r, n, k))
            if k >= n or av is None:  # each pair once, from its QK^T (d = k < keys = n)
                continue
            out.append(
                {
                    "id": f"{platform}-attention-b{b}-s{r}-d{k}",
                    "predictor": "attention-core",
                    "role": "scored",
                    "published": {
                        "paper": "measured by this project",
                        "source": f"{run['device']} {kind} "
                        f"(benchmarks/gemm_shape_curve.py, {name})",
                        "row": f"batch {b}, {r} queries x {n} keys, d {k}",
                        "column": "median seconds of QK^T + AV",
                        "printed": repr(qk["median_s"] + av["median_s"]),
                        "unit": "s",
                        "url": f"reproductions/measured/{name}",
                        "hardware": f"one {run['device']}, torch {run['torch']}, CUDA {run['cuda']}",
                    },
                    "platform": platform,
                    "attention": {"batch": b, "queries": r, "keys": n, "d": k},
                    "parts_s": {"qk": qk["median_s"], "av": av["median_s"]},
                }
            )
    return out


def published_value(point: dict) -> float:
    return float(point["published"]["printed"].replace(",", ""))


def _source(point: dict) -> str:
    pub = point["published"]
    return f"{pub['paper'].split(',')[0]}: {pub['source'].split(' (')[0]}, {pub['row']}"


# ----------------------------------------------------------------------------------- models


def _model(spec: dict):
    from moe_repro.components.model.zoo import get_model, megatron_gpt

    if spec["kind"] == "megatron-gpt":
        return megatron_gpt(spec["layers"], spec["hidden"], spec["heads"], spec["vocab"])
    if spec["kind"] == "megatron-core":
        return model_from_megatron_args(spec)
    m = get_model(spec["key"])
    if spec.get("vocab") and spec["vocab"] != m.vocab:  # the run's tokenizer, as its log prints it
        from dataclasses import replace

        m = replace(m, vocab=spec["vocab"])
    return m


# ----------------------------------------------------------------------------------- predictors


def _plan(point: dict):
    """The planner's candidates for the published layout (everything the source fixes, fixed)."""
    from moe_repro.components.network.platform import load_builtin
    from moe_repro.components.resources.parallel_planner import plan_parallel

    p = load_builtin(point["platform"])
    lay, spec = point["layout"], point["model"]
    m = _model(spec)
    gpus = lay["gpus"]
    if gpus % p.gpus_per_node:
        raise ValueError(f"{point['id']}: {gpus} GPUs is not whole nodes of {p.name}")
    kw = {}
    if (
        "local_batch" in lay
    ):  # torchtitan: a local batch per data-parallel rank, micro-batches of mb
        kw["global_batch"] = lay["local_batch"] * lay["dp"]
        kw["micro_batches"] = lay["local_batch"] // lay["micro_batch"]
    else:
        kw["global_batch"] = lay["global_batch"]
        if "micro_batch" in lay:  # the source's own launch scripts fix it (configuration_source)
            dp = gpus // (lay["tp"] * lay["pp"] * (lay.get("cp") or 1))
            kw["micro_batches"] = lay["global_batch"] // (dp * lay["micro_batch"])
    if "vpp" in lay:
        kw["vpp"] = lay["vpp"]
    return (
        m,
        p,
        plan_parallel(
            m,
            p,
            gpus // p.gpus_per_node,
            seq=spec["seq"],
            precision=lay["precision"],
            zero=(lay["zero"],),
            recompute=(lay["recompute"],),
            tp=lay["tp"],
            pp=lay["pp"],
            cp=lay.get("cp"),
            ep=lay.get("ep"),
            etp=lay.get("etp"),
            dispatcher=lay.get("dispatcher", "alltoall"),
            sp=lay.get("sp"),
            flash_attention=lay["flash_attention"],
            dropout=bool(getattr(m, "dropout", False)),
            overlap_dp=lay.get("overlap_dp", True),
            fused_grad_accumulation=lay.get("fused_grad_accumulation", True),
            overlap_tp=lay.get("overlap_tp", True),
            **kw,
        ),
    )


def measured_step_time(point: dict) -> float:
    """A printed iteration time as it is (unit "seconds per iteration"); from a printed
    throughput, Narayanan et al. Eq. 3: F = 96 B s l h^2 (1 + s / 6h + V / 16 l h) FLOPs per
    iteration (GEMMs only, with the recomputed forward); step time = F / (n X)."""
    if point["published"]["unit"] == "seconds per iteration":
        return published_value(point)
    spec, lay = point["model"], point["layout"]
    B, s, l, h, V = lay["global_batch"], spec["seq"], spec["layers"], spec["hidden"], spec["vocab"]
    F = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return F / (lay["gpus"] * published_value(point) * 1e12)


def predict_step_time(point: dict) -> tuple[float | None, str]:
    _, _, pl = _plan(point)
    best = pl.best
    if best is None:
        why = (
            pl.candidates[0].why_not
            if pl.candidates
            else "; ".join(r["reason"] for r in pl.rejected[:1])
        )
        return None, f"no feasible layout: {why}"
    parts = ", ".join(f"{k} {v:.2f}" for k, v in best.parts.items() if v > 0)
    return best.step_s, (
        f"VPP {best.vpp}, micro-batch {best.micro_batch}, M {best.micro_batches}, "
        f"MFU {best.mfu:.1%}; seconds: {parts}"
    )


# a source's measured kind -> the memory kind the model predicts for it (memory_terms.KINDS)
MEASURED_KINDS = {"max allocated": "allocated", "max reserved": "reserved", "nvidia-smi": "device"}
MEMORY_SETTING_KEYS = (
    "framework",
    "loss",
    "optimizer",
    "expandable_segments",
    "dispatcher",
    "mlp",
    "selective",
)


def framework_memory_settings(framework: str, doc: dict | None = None) -> dict:
    """The MemorySettings fields of one framework as the memory validation set scores it (the
    data file's ``memory_settings``: torchtitan, megatron-core), for `repro plan --framework`;
    ValueError names the frameworks there."""
    doc = doc if doc is not None else load_points()
    known = doc.get("memory_settings", {})
    if framework not in known:
        raise ValueError(f"unknown framework {framework!r}; known: {', '.join(sorted(known))}")
    return {k: v for k, v in known[framework].items() if k in MEMORY_SETTING_KEYS}


def memory_settings(point: dict, doc: dict | None = None) -> dict:
    """The allocator and framework settings of a point's run: its framework's entry of the data
    file's ``memory_settings`` (named by ``settings_of``), overridden by the point's own
    ``settings``; only the MemorySettings fields (sources stay in the file)."""
    doc = doc if doc is not None else load_points()
    base = dict(doc.get("memory_settings", {}).get(point.get("settings_of", ""), {}))
    base.update(point.get("settings") or {})
    return {k: v for k, v in base.items() if k in MEMORY_SETTING_KEYS}


def _recompute_mode(c) -> tuple[str, int]:
    from moe_repro.components.resources.memory_model import ALL_LAYERS

    if c.recompute.startswith("full"):
        return "full", (c.recompute_layers or ALL_LAYERS)
    return c.recompute, 0


def predict_memory(point: dict) -> tuple[float | None, str]:
    """Per-GPU bytes on the binding stage of the point's layout (PREDICTS), in GiB: the planner
    fixes the layout (its degrees, micro-batches and recompute mode), the memory model predicts
    the kind the source measured (MEASURED_KINDS) with the run's framework settings
    (memory_settings); None with the reason where the planner gives no number for it (the point
    stays in the table as "no prediction")."""
    total, note, _ = predict_memory_terms(point)
    return total, note


def predict_memory_terms(point: dict) -> tuple[float | None, str, dict[str, float] | None]:
    """:func:`predict_memory` with the prediction by term, in GiB (StageMemory.breakdown: the
    live-tensor terms, then the sourced terms of the point's kind); None without a prediction."""
    from moe_repro.components.resources import memory_model as MM
    from moe_repro.components.resources import memory_terms as MT

    try:
        m, p, pl = _plan(point)
    except (ValueError, KeyError) as e:
        return None, f"no prediction: {e}", None
    c = pl.best or (pl.candidates[0] if pl.candidates else None)
    if c is None:
        return (
            None,
            "no prediction: the planner rejects the layout: "
            + "; ".join(r["reason"] for r in pl.rejected[:2]),
            None,
        )
    lay = point["layout"]
    # an out-of-memory point names no kind: the device's memory is what ran out
    kind = MEASURED_KINDS.get(point["measured_kind"], "device")
    cfg = memory_settings(point)
    cfg.setdefault("dispatcher", lay.get("dispatcher", "alltoall"))
    settings = MT.MemorySettings(facts=MT.device_facts(p), **cfg)
    layout = MM.MemoryLayout(
        tp=c.tp,
        cp=c.cp,
        pp=c.pp,
        vpp=c.vpp,
        ep=c.ep,
        etp=c.etp,
        dp=c.dp,
        sp=c.sp,
        micro_batch=c.micro_batch,
        micro_batches=c.micro_batches,
    )
    st = MM.per_gpu_memory(
        m,
        p,
        layout,
        point["model"]["seq"],
        kind=kind,
        zero=c.zero,
        recompute=_recompute_mode(c),
        precision=lay["precision"],
        flash_attention=lay["flash_attention"],
        dropout=bool(getattr(m, "dropout", False)),
        settings=settings,
        first_stage_layers=c.first_stage_layers or 0,
        last_stage_layers=c.last_stage_layers or 0,
    )
    mem = st.to_dict()
    terms = ", ".join(
        f"{k} {mem[k] / GiB:.1f}"
        for k in ("weights", "grads", "optimizer", "activations", "buffers")
    )
    extra = sum(b for _, b in st.extras) / GiB
    missing = list(lay.get("not_modelled") or []) + list(point.get("named_differences") or [])
    note = f"{kind}: {terms}, sourced terms {extra:.1f}" + (
        f"; not modelled: {', '.join(missing)}" if missing else ""
    )
    return st.total / GiB, note, {name: b / GiB for name, b, _ in st.breakdown()}


def predict_alltoall_bandwidth(point: dict) -> tuple[float, str]:
    """Uniform routing of ``tokens x top_k`` token copies over the EP ranks (flat all-to-all);
    bandwidth = bytes one GPU sends over the named bottleneck / simulated time."""
    from moe_repro.components.network.platform import load_builtin
    from moe_repro.components.alltoall.simulated import simulate_uniform
    from moe_repro.components.network.simulator import topology_for

    p = load_builtin(point["platform"])
    w = point["workload"]
    ep, g = w["ep"], p.gpus_per_node
    nodes = max(1, ep // g)
    topo = topology_for(p, nodes, gpus_per_node=min(ep, g))
    per_peer = w["tokens_per_rank"] * w["top_k"] * w["hidden"] * w["bytes_per_value"] / ep
    res = simulate_uniform("flat", topo, p, int(per_peer))
    local = min(ep, g)
    if w["bottleneck"] == "nvlink":
        link_bytes = per_peer * (local - 1)
    else:
        link_bytes = per_peer * (ep - local)
    return link_bytes / res.time_s / 1e9, (
        f"{nodes} node(s) x {local} GPUs, {per_peer / 1e6:.2f} MB per peer, "
        f"simulated {res.time_s * 1e3:.3f} ms"
    )


@lru_cache(maxsize=None)
def _builtin_platform(name: str):
    """A shipped profile, parsed once per process (every gemm-time point reads the same one)."""
    from moe_repro.components.network.platform import load_builtin

    return load_builtin(name)


def predict_gemm_time(point: dict) -> tuple[float, str]:
    from moe_repro.components.resources.time_model import gemm_efficiency, gemm_time

    p, g = _builtin_platform(point["platform"]), point["gemm"]
    t = gemm_time(p, g["rows"], g["k"], g["n"])
    measured_tflops = 2 * g["rows"] * g["k"] * g["n"] / published_value(point) / 1e12
    return t, (
        f"measured {measured_tflops:.0f} TFLOP/s (spread {point['spread']:.0%}); quantization "
        f"efficiency {gemm_efficiency(p, g['rows'], g['n']):.2f} of {p.gemm_flops / 1e12:.0f}"
    )


def predict_attention_core(point: dict) -> tuple[float, str]:
    from moe_repro.components.resources.time_model import attention_core_time

    p, a = _builtin_platform(point["platform"]), point["attention"]
    t = attention_core_time(p, a["queries"], a["keys"], a["batch"], a["d"], a["d"], flash=False)
    flop_s = 2.0 * a["queries"] * a["keys"] * a["batch"] * 2 * a["d"] / p.attention_flops
    parts = point["parts_s"]
    unmeasured = "gpu.achievable_attention_tflops" in p.raw.get("approximate", [])
    return t, (
        f"measured QK^T {parts['qk'] * 1e6:.0f} us + AV {parts['av'] * 1e6:.0f} us; predicted "
        f"{'HBM' if t > flop_s else 'FLOP'}-bound (FLOPs alone {flop_s * 1e6:.0f} us at "
        f"{p.attention_flops / 1e12:.0f} TFLOP/s, the profile's attention rate"
        f"{', which no measurement set' if unmeasured else ''})"
    )


# What a predictor's number is, where its points measure different things (repro validate says
# it beside the predictor). Memory: each point is predicted as the kind its source measured.
PREDICTS = {
    "memory": "the kind each source measured (max allocated, max reserved, nvidia-smi): the live "
    "tensors of the binding stage at their peak plus the sourced terms of that kind, with the "
    "settings of the point's framework (memory_settings); no profile framework overhead, no "
    "constant fitted to any point: leave-one-source-out errors equal these",
}

# predictor -> (its prediction of a point, how that number is produced)
_PREDICT = {
    "step-time": (predict_step_time, "analytic"),
    "memory": (predict_memory, "analytic"),
    "alltoall-bandwidth": (predict_alltoall_bandwidth, "simulated"),
    "gemm-time": (predict_gemm_time, "analytic"),
    "attention-core": (predict_attention_core, "analytic"),
}


def score_point(point: dict) -> Scored:
    pred = point["predictor"]
    if pred not in _PREDICT:
        raise ValueError(f"{point['id']}: unknown predictor {pred!r}")
    predict, how = _PREDICT[pred]
    # step time is derived from the printed throughput; every other point is the printed number
    measured = measured_step_time(point) if pred == "step-time" else published_value(point)
    terms = None
    if pred == "memory":
        predicted, note, terms = predict_memory_terms(point)
    else:
        predicted, note = predict(point)
    kind = family = ""
    capacity = None
    if pred == "memory":
        from moe_repro.components.network.platform import load_builtin

        kind = point["measured_kind"]
        family = "MoE" if _model(point["model"]).n_moe_layers else "dense"
        capacity = load_builtin(point["platform"]).hbm_bytes / GiB
        if point.get("role") == "oom":  # ran out of memory: the need is at least the GPU's
            measured = capacity
    return Scored(
        point["id"],
        pred,
        measured,
        predicted,
        UNITS[pred],
        _source(point),
        how,
        note,
        kind,
        family,
        capacity,
        terms,
    )


def _errors(scored: list[Scored]) -> tuple[int, int, float | None, float | None]:
    """Points, predicted points, MAPE and max |error| of a set of scored points."""
    errs = [abs(s.error) for s in scored if s.error is not None]
    if not errs:
        return len(scored), 0, None, None
    return len(scored), len(errs), statistics.fmean(errs), max(errs)


def summarise(predictor: str, scored: list[Scored]) -> Summary:
    """MAPE and max |error| over the points with a prediction (a point without one is counted
    in ``points`` and shown, never dropped), and the same per measured kind and per model family
    where the points say them."""
    groups = []
    for attr, label in (("kind", "measured as {}"), ("family", "{}")):
        for value in sorted({getattr(s, attr) for s in scored} - {""}):
            part = [s for s in scored if getattr(s, attr) == value]
            groups.append((label.format(value), *_errors(part)))
    predicts = PREDICTS.get(predictor, "")
    over = [s.point_id for s in scored if s.over_capacity]
    errs = [(abs(s.error), s.point_id) for s in scored if s.error is not None]
    if not errs:
        return Summary(predictor, len(scored), 0, None, None, "", scored, groups, predicts, over)
    worst = max(errs)
    return Summary(
        predictor,
        len(scored),
        len(errs),
        statistics.fmean(e for e, _ in errs),
        worst[0],
        worst[1],
        scored,
        groups,
        predicts,
        over,
    )


def validate(predictors: tuple[str, ...] = PREDICTORS, doc: dict | None = None) -> list[Summary]:
    """Score every ``scored`` point of the data file whose predictor is asked for."""
    doc = doc if doc is not None else load_points()
    out = []
    for name in predictors:
        pts = [p for p in doc["points"] if p["predictor"] == name and p.get("role") == "scored"]
        summary = summarise(name, [score_point(p) for p in pts])
        summary.oom = [
            score_point(p)
            for p in doc["points"]
            if p["predictor"] == name and p.get("role") == "oom"
        ]
        out.append(summary)
    return out


def track_record(predictor: str, doc: dict | None = None) -> dict:
    """How one predictor has held against its scored points, for the commands whose answers it
    predicts (`repro plan` prints the step-time one, a simulated `repro bench alltoall` the
    all-to-all one): points scored, MAPE, smallest and largest signed error, platforms and model
    families scored, and for the all-to-all the bytes per peer of its points."""
    doc = doc if doc is not None else load_points()
    (summary,) = validate((predictor,), doc)
    pts = [p for p in doc["points"] if p["predictor"] == predictor and p.get("role") == "scored"]
    errors = [x.error for x in summary.scored if x.error is not None]
    out = {
        "predictor": predictor,
        "points": len(errors),
        "mape": summary.mape,
        "min_error": min(errors, default=None),
        "max_error": max(errors, default=None),
        "platforms": sorted({p["platform"] for p in pts}),
    }
    if predictor == "step-time":
        out["model_families"] = sorted(
            {"dense GPT" if p["model"].get("kind") == "megatron-gpt" else "MoE" for p in pts}
        )
    if predictor == "alltoall-bandwidth":
        per_peer = [
            w["tokens_per_rank"] * w["top_k"] * w["hidden"] * w["bytes_per_value"] / w["ep"]
            for w in (p["workload"] for p in pts)
        ]
        out["bytes_per_peer"] = [min(per_peer), max(per_peer)]
    return out


# ----------------------------------------------------------------------------------- EP set
# Published per-GPU dispatch/combine figures of EP libraries (ep_validation_points.json), each
# predicted by the simulator's EP kernel model and turned into the library's own unit by
# components/network/ep_units.py.

EP_REGIMES = ("bandwidth", "latency")


def load_ep_cells() -> dict:
    """The EP validation data file (package data)."""
    text = (
        resources.files("moe_repro.reproductions").joinpath("ep_validation_points.json").read_text()
    )
    return json.loads(text)


def ep_routing(cell: dict):
    from moe_repro.components.network.ep_units import Routing

    s = cell["settings"]
    return Routing(
        s["ep"], s["gpus_per_node"], s["tokens_per_rank"], s["top_k"], s["experts"], s["node_limit"]
    )


def predict_ep_cell(cell: dict, platforms: dict | None = None) -> tuple[float, float, str]:
    """(predicted printed number, simulated kernel seconds, note) of one EP cell: the kernel's
    flows simulated on the cell's platform (``platforms`` maps a name to a Platform in place of
    the shipped profile: the leave-one-library-out fits pass theirs), the time turned into the
    library's unit by its definition."""
    from moe_repro.components.network.ep_units import DEFINITIONS, row_bytes, to_printed
    from moe_repro.components.network.simulator import simulate_ep_kernel

    s, pub = cell["settings"], cell["published"]
    p = (platforms or {}).get(cell["platform"]) or _builtin_platform(cell["platform"])
    r = ep_routing(cell)
    style = DEFINITIONS[pub["definition"]].row_bytes
    res = simulate_ep_kernel(
        p, r, cell["kernel"], row_bytes(style, s["hidden"], s["dtype"], s["top_k"])
    )
    printed = to_printed(pub["definition"], res.time_s, r, s["hidden"], s["dtype"])
    note = f"simulated {res.time_s * 1e6:.0f} us on {p.name}, {r.nodes} node(s) x {r.local}"
    return printed, res.time_s, note


@dataclass
class EpGroup:
    """Absolute relative errors of a group of EP cells (fractions)."""

    name: str
    cells: int
    mape: float | None
    median: float | None
    max_abs: float | None
    worst: str = ""

    def to_dict(self) -> dict:
        return {
            "group": self.name,
            "cells": self.cells,
            "mape": self.mape,
            "median_abs_error": self.median,
            "max_abs_error": self.max_abs,
            "worst": self.worst,
        }


def ep_group(name: str, scored: list[Scored]) -> EpGroup:
    errs = [(abs(x.error), x.point_id) for x in scored if x.error is not None]
    if not errs:
        return EpGroup(name, 0, None, None, None)
    worst = max(errs)
    vals = [e for e, _ in errs]
    return EpGroup(
        name, len(errs), statistics.fmean(vals), statistics.median(vals), worst[0], worst[1]
    )


def no_fit(cells: list[dict]) -> dict:
    """The EP model's fit on a set of cells: platform name -> Platform to predict with. The
    model fits nothing (every constant comes from a profile, none from a cell), so this returns
    no replacement and a held-out library is predicted with the same profiles."""
    return {}


def score_ep(doc: dict | None = None, fit=no_fit) -> dict:
    """Score every ``scored`` EP cell: in-sample (``fit`` on all cells) and leave one library
    out (``fit`` on the other libraries' cells, then predict the held-out library's). Returns
    the cells, the groups per regime and per library for both, and the held-out errors."""
    doc = doc if doc is not None else load_ep_cells()
    cells = [c for c in doc["cells"] if c.get("role") == "scored"]
    libraries = sorted({c["library"] for c in cells})

    cache = {}  # (cell, platform object) -> prediction: a fit that replaces nothing reuses it

    def run(subset, platforms, tag):
        out = []
        for c in subset:
            key = (c["id"], id(platforms.get(c["platform"])))
            if key not in cache:
                cache[key] = predict_ep_cell(c, platforms)
            printed, t, note = cache[key]
            pub = c["published"]
            out.append(
                Scored(
                    c["id"],
                    f"ep-{c['regime']}",
                    float(pub["printed"]),
                    printed,
                    pub["unit"],
                    f"{c['library']}: {pub['file']}, {pub['row']}, {pub['column']}",
                    "simulated",
                    f"{tag}{note}",
                )
            )
        return out

    in_sample = run(cells, fit(cells), "")
    held_out = []
    for lib in libraries:
        train = [c for c in cells if c["library"] != lib]
        held_out += run([c for c in cells if c["library"] == lib], fit(train), "held out: ")
    by_id = {c["id"]: c for c in cells}

    def groups(scored):
        g = {"all": ep_group("all", scored)}
        for reg in EP_REGIMES:
            g[reg] = ep_group(reg, [x for x in scored if by_id[x.point_id]["regime"] == reg])
            for scope in ("intranode", "internode"):
                sub = [
                    x
                    for x in scored
                    if by_id[x.point_id]["regime"] == reg and by_id[x.point_id]["scope"] == scope
                ]
                if sub:
                    g[f"{reg} / {scope}"] = ep_group(f"{reg} / {scope}", sub)
        for lib in libraries:
            for reg in EP_REGIMES:
                sub = [
                    x
                    for x in scored
                    if by_id[x.point_id]["library"] == lib and by_id[x.point_id]["regime"] == reg
                ]
                if sub:
                    g[f"{lib} / {reg}"] = ep_group(f"{lib} / {reg}", sub)
        return g

    return {
        "cells": cells,
        "scored": in_sample,
        "held_out": held_out,
        "groups": groups(in_sample),
        "held_out_groups": groups(held_out),
        "libraries": libraries,
        "unscored": [c for c in doc["cells"] if c.get("role") != "scored"],
        "parameters": doc.get("parameters", []),
        "not_included": doc.get("not_included", []),
    }
