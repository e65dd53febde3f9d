"""Every figure reproduction draws the paper's figure in the paper's form: the same x and y
quantities, the paper's legend entries as our series, its categories by name, and the values the
paper prints or states drawn as "paper" points or "paper-range" bands.

The expected forms below are typed from the papers (captions, and the text that describes each
figure; the reader's transcription piper-review.md where the Piper figures' bar values are only
given there), never copied from the reproductions. The papers as we have them carry captions and
text, not the plotted axes, so no axis scale is stated anywhere and none is required; a
categorical axis must stay linear, the only scale on which the renderer labels categories.

Where the paper draws bars (Piper Fig. 12 and 13, X-MoE Fig. 11) ours must be drawn as bars, and
the bars Piper Fig. 13 prints as OOM (piper-review.md 9.5's table) must be OOM slots.

Reproductions are run at their smallest parameters; the ones that start real ranks are marked
slow. A form a reproduction we do not own misses is marked xfail(strict) with what to change.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from decimal import Decimal

import pytest

from moe_repro.reproductions import all_reproductions

SERIES_KINDS = {"ours", "paper", "paper-range", "limit"}


@dataclass(frozen=True)
class Form:
    source: str  # where the paper says it
    figure: str  # which of our figures draws the paper's
    x: tuple[str, ...]  # the x quantity: the x label names one of these
    y: tuple[str, ...]  # the y quantity: the y label names one of these
    unit: tuple[str, ...] = ()  # the y unit: the y label contains one of these
    ours: tuple[tuple[str, ...], ...] = ()  # legend entries we reproduce: an "ours" series each
    legend: tuple[tuple[str, ...], ...] = ()  # legend entries drawn from the paper: any series each
    categories: tuple[tuple[str, ...], ...] = ()  # x categories, by name
    xvalues: tuple[float, ...] = ()  # x values the paper names
    values: tuple[tuple, ...] = ()  # (x or None, printed y): a "paper" point each
    ranges: tuple[tuple, ...] = ()  # (x or None, lo, hi): a "paper-range" band each
    min_ours: int = 1  # "various models": at least this many ours series
    bars: bool = False  # the paper draws bars: form "bars" or "stacked-bars"
    oom: tuple[tuple, ...] = ()  # (legend entry, x category) the paper prints as OOM


def _norm(text) -> str:
    text = re.sub(r"\s+", " ", str(text).lower()).strip()
    return re.sub(r"\s*=\s*", "=", text)


def _names(text, word: str) -> bool:
    """``text`` names ``word``: as a whole word (not "expert 1" inside "expert 10")."""
    return (
        re.search(r"(?<![a-z0-9])" + re.escape(_norm(word)) + r"(?![a-z0-9])", _norm(text))
        is not None
    )


def _any_names(text, words) -> bool:
    return any(_names(text, w) for w in words)


def _half_unit(printed: str) -> float:
    return 0.5 * 10.0 ** Decimal(printed).as_tuple().exponent


def _x_is(x, want) -> bool:
    if want is None:
        return True
    if isinstance(want, str):
        return isinstance(x, str) and _names(x, want)
    return not isinstance(x, str) and x is not None and math.isclose(float(x), float(want))


# Reproduction parameters: the smallest run that still draws every figure of the paper's.
SMALL = {
    "piper-fig3": {
        "models": "mixtral-8x7b,deepseek-v3",
        "seq_lens": "64,128",
        "heads": 1,
        "repeats": 1,
    },
    "piper-fig4": {
        "models": "mixtral-8x7b,deepseek-v3",
        "tokens_per_expert": "8,16",
        "shape_div": 64,
        "local_experts": 2,
        "repeats": 1,
    },
    "piper-fig5": {"real": 0},
    "piper-fig8": {"nodes": "1,8,16,512", "bytes_per_peer": "256"},
    "piper-fig9": {"steps": 3, "batch": 4},
    "xmoe-fig3": {"shape_div": 64, "measured_seq": 64},
    "xmoe-fig4": {"tokens": 256},
    "feplb-fig4": {"tokens": 128, "micro_batches": 3, "layers": 1},
    "feplb-fig6": {"tokens": 128, "micro_batches": 3, "layers": 1},
    "xmoe-fig11": {
        "ranks": 2,
        "tokens": 32,
        "d_model": 16,
        "d_ffn": 8,
        "experts": 4,
        "top_k": 2,
        "repeats": 1,
        "timeout_s": 120.0,
    },
    "xmoe-fig12": {
        "nodes": 2,
        "gpus_per_node": 1,
        "tokens": 32,
        "hidden": 32,
        "experts": 8,
        "top_k": 2,
        "repeats": 1,
        "simulate": False,
    },  # the simulated 32-GPU point draws no breakdown
    "xmoe-fig13": {
        "seq": 16,
        "hidden": 8,
        "dense_ffn": 8,
        "experts": 2,
        "expert_ffn": 4,
        "top_k": 1,
        "tp_degrees": "2",
    },
}
SLOW = {"xmoe-fig11", "xmoe-fig12", "xmoe-fig13"}  # real ranks: 6-10 s each at the sizes above

PIPER_FIG11 = (
    ("Mixtral 8x22B", "129.4"),
    ("Mixtral 8x7B", "117.5"),
    ("Llama 4 Maverick", "112.4"),
    ("Llama 4 Scout", "109.6"),
    ("Arctic", "104.2"),
    ("DeepSeek-V3", "84.3"),
    ("Kimi K2", "81.7"),
    ("DeepSeek-V2", "78.3"),
)
PIPER_FIG12 = (
    ("Mixtral 8x7B", "102.8", "53.8"),
    ("Mixtral 8x22B", "55.4", "29.0"),
    ("Llama 4 Scout", "74.2", "38.8"),
    ("Llama 4 Maverick", "37.8", "19.8"),
    ("DeepSeek-V2", "46.8", "24.5"),
)
PIPER_FIG13 = {
    "DeepSpeed-MoE": ("20.40", None, None, None),
    "DeepSpeed-TED": ("20.40", None, None, None),
    "Tutel": ("33.00", "4.70", None, None),
    "X-MoE": ("44.0", "24.20", "24.10", "10.20"),
    "Piper": ("90.44", "57.83", "46.89", "36.96"),
}
XMOE_SIZES = ("Small", "Medium", "Large", "Super")
XMOE_FIG17_MODELS = ("Mixtral-8x7b", "Mixtral-8x22b", "DeepSeek-MoE", "DeepSeek-v3", "Arctic")
TFLOPS = ("TFLOPS", "TFLOP/s")

FORMS = {
    "piper-fig3": [
        Form(
            "Piper Fig. 3: 'Achievable throughput for various models for different sequence lengths'",
            "piper-fig3",
            x=("sequence length",),
            y=("TFLOP/s", "throughput"),
            unit=TFLOPS,
            min_ours=2,
        )
    ],
    "piper-fig4": [
        Form(
            "Piper Fig. 4 'MoE GEMM Performance'; Sec. IV-A2: (num_tokens, batch_size, expert_dimension) "
            "tuples, fine-grained experts' tall and skinny GEMMs",
            "piper-fig4-models",
            x=("tokens per expert", "tokens"),
            y=("TFLOP/s", "throughput"),
            unit=TFLOPS,
            min_ours=2,
        )
    ],
    "piper-fig5": [
        Form(
            "Piper Fig. 5: 'All-to-all bandwidth for various message sizes'; Sec. IV-B: 'we vary the number "
            "of GPUs from 2 to 64 spanning 1-8 nodes'",
            "piper-fig5",
            x=("message size", "bytes per GCD", "bytes"),
            y=("bandwidth", "busbw"),
            unit=("GB/s",),
            ours=(("2 GCDs", "2 GPUs"), ("64 GCDs", "64 GPUs"), ("1 node",), ("8 nodes",)),
        )
    ],
    "piper-fig8": [
        Form(
            "Piper Fig. 8: 'Latency comparison of Neighborhood-all_to_all algorithm against the RCCL "
            "based torch.dist.all_to_all'; Sec. V-D: 'across varying node counts and message sizes'",
            "piper-fig8",
            x=("nodes",),
            y=("latency",),
            ours=(("HALO", "Neighborhood-all_to_all"), ("torch.dist.all_to_all", "RCCL")),
            min_ours=2,
        ),
        Form(
            "Piper Sec. V-D: 'HALO achieves 1.1x - 9x lower latency for configurations of 16 nodes or more'",
            "piper-fig8-speedup",
            x=("nodes",),
            y=("/ HALO latency", "speedup"),
            ranges=((16, "1.1", "9"),),
        ),
    ],
    "piper-fig9": [
        Form(
            "Piper Fig. 9: 'Expert load distribution during the training process ... with 16 experts'; "
            "Sec. VI: 'becomes balanced after almost one billion token consumption'",
            "piper-fig9-layer0",
            x=("tokens",),
            y=("expert load", "load"),
            ours=tuple((f"expert {e}",) for e in range(16)),
        ),
        Form(
            "Piper Sec. VI: 'expert-routing distribution in different layer'",
            "piper-fig9",
            x=("tokens",),
            y=("load",),
            ours=(("layer 0",), ("layer 1",)),
            min_ours=2,
        ),
    ],
    "piper-fig10": [
        Form(
            "Piper Fig. 10: 'estimating its per-GPU memory requirement ... we can train this model with at "
            "least 64 nodes'; Sec. VII: 'required memory for various node count with different distribution "
            "strategies' (Sec. III: expert-data parallelism Eq. 2, pipelined GPipe Eq. 3 and 1F1B Eq. 4)",
            "piper-fig10",
            x=("nodes",),
            y=("memory per GPU", "per-GPU memory"),
            unit=("GB",),
            ours=(("EDP", "expert-data"), ("GPipe",), ("1F1B",)),
            values=((64, None),),
        )
    ],
    "piper-fig11": [
        Form(
            "Piper Fig. 11: 'Training efficiency of a single layer of the SOTA models'; bars as transcribed "
            "in piper-review.md 9.3",
            "piper-fig11",
            x=("model",),
            y=TFLOPS,
            unit=TFLOPS,
            categories=tuple((m,) for m, _ in PIPER_FIG11),
            values=PIPER_FIG11,
        )
    ],
    "piper-fig12": [
        Form(
            "Piper Fig. 12: 'Training throughput of SOTA MoE models using Piper (sequence length 4096)'; "
            "bars as transcribed in piper-review.md 9.4",
            "piper-fig12",
            x=("model",),
            y=("throughput",),
            unit=TFLOPS,
            categories=tuple((m,) for m, *_ in PIPER_FIG12),
            values=tuple((m, t) for m, t, _ in PIPER_FIG12),
            bars=True,
        ),
        Form(
            "Piper Fig. 12 MFU (piper-review.md 9.4)",
            "piper-fig12-mfu",
            x=("model",),
            y=("MFU",),
            unit=("%",),
            categories=tuple((m,) for m, *_ in PIPER_FIG12),
            values=tuple((m, u) for m, _, u in PIPER_FIG12),
            bars=True,
        ),
    ],
    "piper-fig13": [
        Form(
            "Piper Fig. 13: 'Throughput comparison against SOTA MoE training frameworks ... small, medium, "
            "large, and super model'; Sec. VII-C names Tutel, DeepSpeed MoE, DeepSpeed TED, X-MoE; bars as "
            "transcribed in piper-review.md 9.5",
            "piper-fig13",
            x=("model",),
            y=("throughput",),
            unit=TFLOPS,
            ours=(("Piper",),),
            legend=tuple((name,) for name in PIPER_FIG13),
            categories=tuple((s,) for s in XMOE_SIZES),
            values=tuple(
                (size, v)
                for vals in PIPER_FIG13.values()
                for size, v in zip(XMOE_SIZES, vals)
                if v is not None
            ),
            bars=True,
            oom=tuple(
                ((name,), size)
                for name, vals in PIPER_FIG13.items()
                for size, v in zip(XMOE_SIZES, vals)
                if v is None
            ),
        )
    ],
    "piper-fig14": [
        Form(
            "Piper Fig. 14 'Scaling M10B models with experts'; Sec. VII-D: 16 experts on 8 nodes (64 GPUs), "
            "'512 GPUs at 39.38 TFLOPs', '1024 GPUs at 33 TFLOPs' (64 GPUs' 45.15: piper-review.md 9.6)",
            "piper-fig14",
            x=("GPUs",),
            y=("TFLOPS",),
            unit=TFLOPS,
            values=((64, "45.15"), (512, "39.38"), (1024, "33")),
        )
    ],
    "xmoe-fig3": [
        Form(
            "X-MoE Fig. 3: 'The MoE layer memory distribution of M_conv and M_spec'; Sec. 3.2 and Takeaway-2: "
            "per-GPU memory, the bottleneck shifting 'from model parameters to activations, particularly in "
            "the dispatch and combine stages'",
            "xmoe-fig3",
            x=("component",),
            y=("memory", "GiB", "GB"),
            unit=("GiB", "GB"),
            ours=(("M_conv",), ("M_spec",)),
            categories=(("weights", "parameters", "model states"), ("dispatch",), ("combine",)),
        )
    ],
    "xmoe-fig4": [
        Form(
            "X-MoE Fig. 4 'Redundancy rate of all dispatched tokens'; Sec. 3.3: 'up to 75.1%, depending on "
            "the EP size'",
            "xmoe-fig4",
            x=("EP size",),
            y=("redundancy rate", "redundancy"),
            unit=("%",),
            values=((None, "75.1"),),
        )
    ],
    "xmoe-fig11": [
        Form(
            "X-MoE Fig. 11: 'Forward MoE layer time breakdown comparison between DeepSpeed-MoE and "
            "X-MoE'; Sec. 5.4.1: 'gating, buffer dispatching, dispatch alltoall, expert computation, "
            "combine alltoall, and buffer combining'",
            "xmoe-fig11-breakdown",
            x=("stage",),
            y=("time",),
            unit=("ms",),
            ours=(("DeepSpeed-MoE",), ("X-MoE",)),
            categories=(
                ("gating",),
                ("buffer dispatch", "buffer dispatching"),
                ("dispatch alltoall",),
                ("expert", "expert computation"),
                ("combine alltoall",),
                ("buffer combine", "buffer combining"),
            ),
            bars=True,
        ),
        Form(
            "X-MoE Sec. 5.4.1 (Small): gating, buffer dispatch and buffer combine 'accelerated by 5.7x, "
            "35.7x and 8.1x'; 'the overall layer time is reduced by 62.3%', i.e. 1 / (1 - 0.623) faster",
            "xmoe-fig11-speedup",
            x=("stage",),
            y=("speedup",),
            values=(
                ("gating", "5.7"),
                ("buffer dispatch", "35.7"),
                ("buffer combine", "8.1"),
                ("layer", f"{1 / (1 - 0.623):.2f}"),
            ),
        ),
    ],
    "xmoe-fig12": [
        Form(
            "X-MoE Fig. 12: 'Dispatching time breakdown: With and without RBD'; Sec. 5.4.2: 'inter-node "
            "alltoall communication (shadowed area)', 'intra-node alltoall (yellow)'",
            "xmoe-fig12-breakdown",
            x=("stage",),
            y=("time",),
            unit=("ms",),
            ours=(("w/o RBD", "without RBD"), ("w/ RBD", "with RBD")),
            categories=(("inter-node",), ("intra-node",)),
        )
    ],
    "xmoe-fig13": [
        Form(
            "X-MoE Fig. 13: 'X-MoE's maximum allocated memory across GPUs w/ and w/o SSMB'; Sec. 5.4.3: "
            "'varying the TP degree from 1 to 4'",
            name,
            x=("TP degree",),
            y=("memory",),
            unit=("MiB", "GB"),
            ours=(("w/ SSMB",), ("w/o SSMB",)),
        )
        for name in ("xmoe-fig13-scaled", "xmoe-fig13-full")
    ],
    "xmoe-fig17": [
        Form(
            "X-MoE App. C.2 on Fig. 17: 'we calculate the ratio r of ... Mixtral-8x7b, Mixtral-8x22b, "
            "DeepSeek-MoE, DeepSeek-v3, and Arctic ... the upper region is the advantage region of SSMB ... "
            "plot the advantage region borderline for three sequence lengths, S = 2048, 4096, 8192'",
            "xmoe-fig17",
            x=("model",),
            y=("r",),
            ours=tuple((m,) for m in XMOE_FIG17_MODELS) + (("S=2048",), ("S=4096",), ("S=8192",)),
            categories=tuple((m,) for m in XMOE_FIG17_MODELS),
        )
    ],
    "xmoe-fig19": [
        Form(
            "X-MoE Fig. 19: 'The average all-to-all time of the MoE training workload across varying GPU "
            "scale'; App. D: 'scaling from 8 to 1024 GPUs', times in ms (Fig. 18)",
            "xmoe-fig19",
            x=("GPUs",),
            y=("all-to-all time",),
            unit=("ms",),
            xvalues=(8, 1024),
        )
    ],
    "feplb-fig4": [
        Form(
            "FEPLB Fig. 4: 'EP communication time (Dispatch and Combine) for Before LB, FasterMoE (pipe = 1 "
            "and pipe = 2), and FEPLB ... FEPLB introduces no measurable overhead (<<1%)'; Sec. 3.3: 'pipe = 2 "
            "incurs 46.8% additional dispatch time and 40.2% additional combine time ... overhead below 1%'",
            "feplb-fig4",
            x=("method",),
            y=("dispatch", "combine", "communication time"),
            unit=("%",),
            ours=(("dispatch",), ("combine",)),
            categories=(("FasterMoE pipe=1",), ("FasterMoE pipe=2",), ("FEPLB",)),
            values=(("FasterMoE pipe=2", "46.8"), ("FasterMoE pipe=2", "40.2")),
            ranges=(("FEPLB", "0", "1"),),
        )
    ],
    "feplb-fig6": [
        Form(
            "FEPLB Fig. 6: 'Token straggler as a function of the dynamic expert count dyn = 2, 4, 8 across "
            "three PP/EP configurations' (Sec. 3.1: PP/EP 4/2, 4/4, 2/8)",
            "feplb-fig6",
            x=("dyn",),
            y=("token straggler",),
            unit=("tokens",),
            ours=(("4/2",), ("4/4",), ("2/8",)),
            xvalues=(2, 4, 8),
        ),
        Form(
            "FEPLB Sec. 3.5: 'dyn = 2 to 4 adds 1-3 percentage points, and 4 to 8 another 1-3 points'",
            "feplb-fig6-steps",
            x=("dyn",),
            y=("reduction",),
            unit=("percentage points", "pp"),
            ranges=(("dyn 2->4", "1", "3"), ("dyn 4->8", "1", "3")),
        ),
    ],
}

# Forms the reproductions we do not own miss today, and what to change (strict: they flip to a
# failure once fixed, so the mark is removed then).
TO_FIX: dict[str, str] = {}


@functools.lru_cache(maxsize=None)
def _result(rid: str):
    return all_reproductions()[rid].run(SMALL.get(rid))


def _cases():
    for rid, forms in FORMS.items():
        marks = []
        if rid in SLOW:
            marks += [pytest.mark.slow, pytest.mark.multiprocess]
        if rid in TO_FIX:
            marks.append(pytest.mark.xfail(strict=True, reason=TO_FIX[rid]))
        yield pytest.param(rid, id=rid, marks=marks)


def test_every_figure_reproduction_has_a_form():
    """A figure reproduction added to the catalog gets its paper form here too."""
    figs = {r.id for r in all_reproductions().values() if "Fig" in r.element}
    assert figs == set(FORMS), figs ^ set(FORMS)


def _problems(rid: str, form: Form, figures: dict) -> list[str]:
    fig = figures.get(form.figure)
    if fig is None:
        return [f"no figure {form.figure!r} (ours: {sorted(figures)})"]
    out = []
    where = f"{form.figure}"
    if not _any_names(fig.xlabel, form.x):
        out.append(f"{where}: x label {fig.xlabel!r} names none of {form.x}")
    if not _any_names(fig.ylabel, form.y):
        out.append(f"{where}: y label {fig.ylabel!r} names none of {form.y}")
    if form.unit and not any(u.lower() in fig.ylabel.lower() for u in form.unit):
        out.append(f"{where}: y label {fig.ylabel!r} has none of the units {form.unit}")
    for s in fig.series:
        if s.get("kind", "ours") not in SERIES_KINDS:
            out.append(f"{where}: series {s['label']!r} has kind {s.get('kind')!r}")
    ours = [s for s in fig.series if s.get("kind", "ours") == "ours"]
    if len(ours) < form.min_ours:
        out.append(f"{where}: {len(ours)} series of ours, the paper's has at least {form.min_ours}")
    for entry in form.ours:
        if not any(_any_names(s["label"], entry) for s in ours):
            out.append(f"{where}: no series of ours is the paper's {entry[0]!r}")
    for entry in form.legend:
        if not any(_any_names(s["label"], entry) for s in fig.series):
            out.append(f"{where}: the paper's {entry[0]!r} is not drawn")
    xs = [x for s in fig.series if s.get("kind") != "limit" for x in s["x"]]
    if form.categories and fig.xscale != "linear":
        out.append(f"{where}: categorical x on a {fig.xscale} scale")
    for entry in form.categories:
        if not any(isinstance(x, str) and _any_names(x, entry) for x in xs):
            out.append(
                f"{where}: no x category is {entry[0]!r} (x: {sorted(set(map(str, xs)))[:8]})"
            )
    for want in form.xvalues:
        if not any(_x_is(x, want) for x in xs):
            out.append(f"{where}: x does not reach {want}")
    paper = [s for s in fig.series if s.get("kind") == "paper"]
    for x, printed in form.values:
        hit = any(
            _x_is(px, x)
            and (
                printed is None
                or (py is not None and abs(py - float(printed)) <= _half_unit(printed))
            )
            for s in paper
            for px, py in zip(s["x"], s["y"])
        )
        if not hit:
            out.append(
                f"{where}: the paper's {printed or 'point'} at x={x} is not drawn as a paper point"
            )
    if form.bars and getattr(fig, "form", "lines") not in ("bars", "stacked-bars"):
        out.append(
            f"{where}: the paper draws bars, ours is drawn as {getattr(fig, 'form', 'lines')!r}"
        )
    for entry, x in form.oom:
        if not any(
            _any_names(s["label"], entry) and any(_x_is(v, x) for v in s.get("oom") or [])
            for s in fig.series
        ):
            out.append(f"{where}: the paper's OOM for {entry[0]!r} at {x!r} is not drawn as OOM")
    bands = [s for s in fig.series if s.get("kind") == "paper-range"]
    for x, lo, hi in form.ranges:
        hit = any(
            math.isclose(s["lo"], float(lo))
            and math.isclose(s["hi"], float(hi))
            and (
                x is None
                or (isinstance(x, str) and any(_x_is(v, x) for v in s["x"]))
                or (not isinstance(x, str) and math.isclose(min(s["x"]), x))
            )
            for s in bands
        )
        if not hit:
            out.append(f"{where}: the paper's {lo}-{hi} (x={x}) is not drawn as a paper-range band")
    return out


@pytest.mark.parametrize("rid", list(_cases()))
def test_figure_is_drawn_in_the_papers_form(rid):
    figures = {f.name: f for f in _result(rid).figures}
    problems = [p for form in FORMS[rid] for p in _problems(rid, form, figures)]
    assert not problems, "\n".join(problems)
