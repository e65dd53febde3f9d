"""Platform profiles: the measured or published numbers the resource model is fed with.

A profile is a JSON document (components/network/platforms/<name>.json, copy one and edit it)
with sections ``gpu`` (peak and achievable GEMM / attention rates, HBM size and bandwidth,
optional SM count: Piper Sec. IV-A, Eq. 11), ``node`` (GPUs, NICs and B_NIC of Piper Eq. 6,
GPU-NIC affinity, the intra-node links), ``network`` (switch groups and racks of Eq. 10, the
fabric beyond the NICs, the simulator's per-message cost), ``links`` (one entry per link class,
fastest first), ``efficiency`` (network and NVLink fractions of line rate, framework overhead,
sources), an optional ``calibration.layer_forward`` (a published layer time the time model
scales its kernel times by) and an optional ``ep_kernels`` (what a GPU-initiated put reaches on
the NIC and NVLink, ``nic_GBps`` / ``nvlink_GBps``, a put's latency ``put_latency_us``, a NIC
message rate ``nic_message_rate_Mps`` and an issue cost ``per_message_us``: read only by the EP
kernel model, simulator.ep_kernel_platform). Each field, its unit and who reads
it: see docs/simulator.md.

Why: the planners, the time model and the simulator read every machine through one document,
so a number has one source that the profile names (``sources``, ``approximate``). Loading the
built-in profiles reads package data; :func:`load_platform` also reads a user's profile file by
path (the only file I/O in components/). See docs/simulator.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

GB = 1e9
ON_NODE_CLASSES = ("intra_package", "intra_node")  # link classes inside a node (efficiency.nvlink)


def link_bytes_per_s(GBps: float, on_node: bool, nvlink_efficiency: float) -> float:
    """Bytes per second an application moves over a link the profile gives at ``GBps`` line
    rate: an on-node link (NVLink, a package's fabric) at line rate x ``efficiency.nvlink``, any
    other as given (docs/simulator.md). Every reader of an on-node rate goes through here."""
    return GBps * GB * (nvlink_efficiency if on_node else 1.0)


@dataclass(frozen=True)
class Platform:
    name: str
    gpus_per_node: int
    peak_flops: float  # per GPU, FLOP/s
    hbm_bytes: float
    hbm_bytes_per_s: float
    gemm_flops: float  # achievable
    attention_flops: float  # achievable
    nics_per_node: int
    nic_bytes_per_s: float
    intra_node_a2a_bytes_per_s: float  # per GPU
    switch_group_nodes: int
    rack_nodes: int
    network_efficiency: float
    overhead_bytes: float
    links: tuple[dict, ...]
    raw: dict
    sm_count: int = 0  # streaming multiprocessors; 0: no shape-dependent GEMM rate
    nvlink_efficiency: float = 1.0  # efficiency.nvlink: on-node rates are line rate x this

    @property
    def nic_bytes_per_s_per_gpu(self) -> float:
        """Injection bandwidth per GPU when every GPU of a node sends off-node at once."""
        return self.nics_per_node * self.nic_bytes_per_s / self.gpus_per_node

    def link(self, cls: str) -> dict:
        for link in self.links:
            if link["class"] == cls:
                return link
        raise KeyError(f"platform {self.name} has no link class {cls!r}")


# Profile fields a network simulation reads (the GPU's rates and the framework's memory do not
# enter it): the ones of these a profile lists under ``approximate`` are what a simulated
# all-to-all rests on without a measurement.
NETWORK_FIELDS = ("links", "network", "node", "efficiency.network", "efficiency.nvlink")


def unmeasured_network_values(p: Platform) -> list[str]:
    """``field = value`` for every field of ``p``'s ``approximate`` list that a network simulation
    reads (NETWORK_FIELDS), in the profile's order; a field without one value (``links[*]...``)
    is named alone."""
    out = []
    for field_path in p.raw.get("approximate", []):
        if not any(
            field_path == f or field_path.startswith(f + ".") or field_path.startswith(f + "[")
            for f in NETWORK_FIELDS
        ):
            continue
        node: Any = p.raw
        for key in field_path.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        out.append(
            f"{field_path} = {node:g}"
            if isinstance(node, (int, float)) and not isinstance(node, bool)
            else field_path
        )
    return out


def builtin_names() -> list[str]:
    files = resources.files("moe_repro.components.network").joinpath("platforms")
    return sorted(p.name[:-5] for p in files.iterdir() if p.name.endswith(".json"))


def load_builtin(name: str) -> Platform:
    """A shipped profile by name; ValueError naming close matches or the known ones."""
    import difflib

    names = builtin_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(names)}"
        raise ValueError(f"unknown platform {name!r}; {hint} (or a JSON file path)")
    text = (
        resources.files("moe_repro.components.network")
        .joinpath("platforms", f"{name}.json")
        .read_text()
    )
    return from_dict(json.loads(text))


def load_platform(name_or_path: str) -> Platform:
    """A shipped profile by name, or a profile file (a copied and edited one) by path: a name
    ending in .json or naming an existing file is a path. ValueError, naming the file and what
    is wrong, for a missing file, bad JSON or a bad profile."""
    from pathlib import Path

    from moe_repro.records.inputs import PLATFORM_LIMIT, InputError, read_input

    def there(p: Path, test) -> bool:
        try:
            return test(p)
        except OSError:  # e.g. a name longer than the file system allows: no such file
            return False

    path = Path(name_or_path)
    if not (name_or_path.endswith(".json") or there(path, Path.is_file)):
        return load_builtin(name_or_path)
    if not there(path, Path.exists):
        raise ValueError(f"platform file {name_or_path[:80]!r} not found")
    try:
        # read within PLATFORM_LIMIT, a FIFO or device refused unread (records/inputs.py);
        # JSON's NaN and Infinity are not numbers a profile may hold: refuse them while parsing
        doc = json.loads(
            read_input(path, PLATFORM_LIMIT).decode("utf-8"), parse_constant=_refuse_constant
        )
    except InputError as e:
        raise ValueError(f"platform file {e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f"platform file {name_or_path}: not valid JSON ({e.msg}, line {e.lineno})"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"platform file {name_or_path}: {e}") from None
    try:
        return from_dict(doc)
    except ValueError as e:
        raise ValueError(f"platform file {name_or_path}: {e}") from None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a finite number")


def _number(value, where: str, positive: bool = True) -> float:
    """A finite JSON number (JSON NaN/Infinity and booleans are refused), positive if asked."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"platform profile: {where} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"platform profile: {where} must be positive, got {value!r}")
    return value


def _count(value, where: str) -> int:
    """A positive whole number (2.0 is accepted as 2; 2.5 is not)."""
    v = _number(value, where)
    if v != int(v):
        raise ValueError(f"platform profile: {where} must be a whole number, got {value!r}")
    return int(v)


# The most GPUs (and NICs) one node may hold: the largest single NVLink domains sold hold 72 to
# 576 GPUs; a larger count is a typo, and the simulator would model millions of ranks.
MAX_GPUS_PER_NODE = 1024


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true/false"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _object_at(d: dict, path: str) -> None:
    """An optional section, if present, is a JSON object (a number there is named, not an
    AttributeError deep inside)."""
    node = d
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return
        node = node[part]
    if not isinstance(node, dict):
        raise ValueError(
            f"platform profile: {path} must be an object, got {_kind(node)} ({node!r:.40})"
        )


def _check_affinity(affinity, gpus: int, nics: int) -> None:
    """node.gpu_nic_affinity: one list per NIC of the GPUs (0..gpus-1) that inject through it."""
    if affinity is None:
        return
    where = "node.gpu_nic_affinity"
    if not isinstance(affinity, list) or len(affinity) > nics:
        raise ValueError(
            f"platform profile: {where} must be a list of at most node.nics={nics} "
            f"lists of GPU indices, got {_kind(affinity)} ({affinity!r:.40})"
        )
    seen = set()
    for nic, members in enumerate(affinity):
        if not isinstance(members, list):
            raise ValueError(
                f"platform profile: {where}[{nic}] must be a list of GPU indices, "
                f"got {_kind(members)} ({members!r:.40})"
            )
        for gpu in members:
            if (
                isinstance(gpu, bool)
                or not isinstance(gpu, int)
                or not 0 <= gpu < gpus
                or gpu in seen
            ):
                raise ValueError(
                    f"platform profile: {where}[{nic}] holds {gpu!r}: GPU indices are "
                    f"0..{gpus - 1}, each on one NIC"
                )
            seen.add(gpu)


# calibration.layer_forward: a measured forward of one dense GPT layer (time_model.calibration_terms)
CALIBRATION_LAYER_NUMBERS = ("measured_ms", "hidden", "heads", "ffn", "seq", "micro_batch", "tp")


def _check_calibration(cal) -> None:
    if cal is None:
        return
    for key in CALIBRATION_LAYER_NUMBERS:
        if key not in cal:
            raise ValueError(f"platform profile: missing field 'calibration.layer_forward.{key}'")
        v = _number(cal[key], f"calibration.layer_forward.{key}")
        if key != "measured_ms":
            _count(v, f"calibration.layer_forward.{key}")
    if cal["hidden"] % cal["heads"]:
        raise ValueError(
            "platform profile: calibration.layer_forward.hidden must be a multiple of heads"
        )
    for key in ("dropout", "flash_attention"):
        if not isinstance(cal.get(key), bool):
            raise ValueError(
                f"platform profile: calibration.layer_forward.{key} must be true or false"
            )
    if not str(cal.get("source", "")).strip():
        raise ValueError(
            "platform profile: calibration.layer_forward.source must name the measurement"
        )


def from_dict(d: dict) -> Platform:
    """Validate a profile document; ValueError naming the missing or bad field."""
    if not isinstance(d, dict):
        raise ValueError(f"platform profile must be a JSON object, got {type(d).__name__}")

    def get(path: str, positive: bool = True):
        node = d
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ValueError(f"platform profile: missing field {path!r}")
            node = node[part]
        return _number(node, path, positive)

    for path in (
        "gpu",
        "node",
        "network",
        "efficiency",
        "node.intra_node",
        "network.fabric",
        "calibration",
        "calibration.layer_forward",
    ):
        _object_at(d, path)
    _check_calibration(d.get("calibration", {}).get("layer_forward"))
    if not isinstance(d.get("links", []), list):
        raise ValueError(f"platform profile: links must be a list, got {_kind(d['links'])}")
    eff = d.get("efficiency", {}).get("network", 1.0)
    if not (isinstance(eff, (int, float)) and 0 < eff <= 1):
        raise ValueError(f"platform profile: efficiency.network must be in (0, 1], got {eff}")
    nvlink = d.get("efficiency", {}).get("nvlink", 1.0)
    if not (isinstance(nvlink, (int, float)) and not isinstance(nvlink, bool) and 0 < nvlink <= 1):
        raise ValueError(f"platform profile: efficiency.nvlink must be in (0, 1], got {nvlink!r}")
    for i, link in enumerate(d.get("links", ())):
        if not isinstance(link, dict) or "class" not in link:
            raise ValueError(f"platform profile: links[{i}] must be an object with a 'class'")
        for key in ("GBps", "latency_us", "taper"):
            if key in link:
                _number(link[key], f"links[{i}].{key}", positive=key != "latency_us")
    gpus = _count(get("node.gpus"), "node.gpus")
    if gpus > MAX_GPUS_PER_NODE:
        raise ValueError(
            f"platform profile: node.gpus must be <= {MAX_GPUS_PER_NODE} (GPUs in one "
            f"node), got {gpus}"
        )
    nics = _count(get("node.nics"), "node.nics")
    if nics > MAX_GPUS_PER_NODE:
        raise ValueError(f"platform profile: node.nics must be <= {MAX_GPUS_PER_NODE}, got {nics}")
    _check_affinity(d["node"].get("gpu_nic_affinity"), gpus, nics)
    overhead = _number(d.get("framework_overhead_GB", 0.0), "framework_overhead_GB", positive=False)
    if overhead < 0:
        raise ValueError(f"platform profile: framework_overhead_GB must be >= 0, got {overhead!r}")
    platform = Platform(
        name=str(d.get("name", "custom")),
        gpus_per_node=gpus,
        peak_flops=get("gpu.peak_tflops") * 1e12,
        hbm_bytes=get("gpu.hbm_GB") * GB,
        hbm_bytes_per_s=(
            get("gpu.achievable_hbm_GBps")
            if "achievable_hbm_GBps" in d["gpu"]
            else get("gpu.hbm_GBps")
        )
        * GB,
        gemm_flops=get("gpu.achievable_gemm_tflops") * 1e12,
        attention_flops=get("gpu.achievable_attention_tflops") * 1e12,
        nics_per_node=nics,
        nic_bytes_per_s=get("node.nic_GBps") * GB,
        intra_node_a2a_bytes_per_s=link_bytes_per_s(
            get("node.intra_node_alltoall_GBps_per_gpu"), True, nvlink
        ),
        switch_group_nodes=_count(get("network.switch_group_nodes"), "network.switch_group_nodes"),
        rack_nodes=_count(get("network.rack_nodes"), "network.rack_nodes"),
        network_efficiency=float(eff),
        overhead_bytes=float(overhead) * GB,
        links=tuple(d.get("links", ())),
        raw=d,
        sm_count=_count(d["gpu"]["sm_count"], "gpu.sm_count") if "sm_count" in d["gpu"] else 0,
        nvlink_efficiency=float(nvlink),
    )
    net = d.get("network", {})
    for key in ("per_message_us", "host_GBps"):
        if key in net:
            _number(net[key], f"network.{key}", positive=key == "host_GBps")
    if not isinstance(net.get("self_copies", False), bool):
        raise ValueError(
            f"platform profile: network.self_copies must be true or false, "
            f"got {net['self_copies']!r}"
        )
    if "window" in net and net["window"] != 0:
        _count(net["window"], "network.window")
    if net.get("latency_model", "overlapped") not in ("overlapped", "serial"):
        raise ValueError(
            f"platform profile: network.latency_model must be overlapped or serial, "
            f"got {net['latency_model']!r}"
        )
    fabric_of(platform)  # validate now, not when a simulation first reads it
    intra_node_of(platform)
    return platform


def _taper(value, where: str) -> float:
    t = _number(value, where)
    if t > 1:
        raise ValueError(f"platform profile: {where} must be in (0, 1] (1 = non-blocking), got {t}")
    return float(t)


def fabric_of(p: Platform) -> dict:
    """The fabric beyond the NICs, normalised: ``{"kind": "fat_tree" | "dragonfly", "levels":
    [{"name", "nodes", "taper"}, ...]}`` (innermost level first) or ``{"kind": "rail",
    "rail_group_nodes", "spine_taper"}``. See docs/simulator.md for the profile forms."""
    f = p.raw.get("network", {}).get("fabric")
    if f is None:  # the legacy form: switch groups and racks, tapers on their link classes
        links = {lk["class"]: lk for lk in p.links}
        taper = lambda *names: next(
            (float(links[n]["taper"]) for n in names if "taper" in links.get(n, {})), 1.0
        )
        group, rack = p.switch_group_nodes, p.rack_nodes
        levels = [{"name": "switch_group", "nodes": group, "taper": taper("switch_group")}]
        if rack >= group and rack // group > 0:
            levels.append(
                {
                    "name": "rack",
                    "nodes": group * (rack // group),
                    "taper": taper("inter_rack", "inter_group"),
                }
            )
        return {"kind": "fat_tree", "levels": levels}
    if not isinstance(f, dict):
        raise ValueError("platform profile: network.fabric must be an object")
    kind = f.get("kind")
    if kind == "rail":
        return {
            "kind": "rail",
            "rail_group_nodes": _count(
                f.get("rail_group_nodes"), "network.fabric.rail_group_nodes"
            ),
            "spine_taper": _taper(f.get("spine_taper", 1.0), "network.fabric.spine_taper"),
        }
    if kind == "dragonfly":
        switch = _count(f.get("switch_nodes"), "network.fabric.switch_nodes")
        group = _count(f.get("group_nodes"), "network.fabric.group_nodes")
        if group % switch:
            raise ValueError(
                f"platform profile: network.fabric.group_nodes ({group}) must be a "
                f"multiple of switch_nodes ({switch})"
            )
        return {
            "kind": "dragonfly",
            "levels": [
                {
                    "name": "switch",
                    "nodes": switch,
                    "taper": _taper(
                        f.get("intra_group_taper", 1.0), "network.fabric.intra_group_taper"
                    ),
                },
                {
                    "name": "group",
                    "nodes": group,
                    "taper": _taper(f.get("global_taper", 1.0), "network.fabric.global_taper"),
                },
            ],
        }
    if kind == "fat_tree":
        levels, below = [], 1
        for i, lv in enumerate(f.get("levels") or []):
            where = f"network.fabric.levels[{i}]"
            if not isinstance(lv, dict):
                raise ValueError(f"platform profile: {where} must be an object")
            nodes = _count(lv.get("nodes"), f"{where}.nodes")
            if nodes % below:
                raise ValueError(
                    f"platform profile: {where}.nodes ({nodes}) must be a multiple of "
                    f"the level below ({below})"
                )
            levels.append(
                {
                    "name": str(lv.get("name", f"level{i}")),
                    "nodes": nodes,
                    "taper": _taper(lv.get("taper", 1.0), f"{where}.taper"),
                }
            )
            below = nodes
        return {"kind": "fat_tree", "levels": levels}
    raise ValueError(
        f"platform profile: network.fabric.kind must be fat_tree, dragonfly or rail, got {kind!r}"
    )


def intra_node_of(p: Platform) -> dict:
    """The intra-node links, normalised: ``{"kind": "port"}``, ``{"kind": "switch",
    "bytes_per_s"}`` or ``{"kind": "graph", "pairs": {(a, b): bytes_per_s}, "other_bytes_per_s"}``
    (both directions of every listed pair), rates times ``efficiency.nvlink``."""
    spec = p.raw.get("node", {}).get("intra_node")
    eff = p.nvlink_efficiency
    if spec is None:
        return {"kind": "port"}
    kind = spec.get("kind") if isinstance(spec, dict) else None
    g = p.gpus_per_node
    if kind == "switch":
        return {
            "kind": "switch",
            "bytes_per_s": link_bytes_per_s(
                _number(spec.get("GBps_per_gpu"), "node.intra_node.GBps_per_gpu"), True, eff
            ),
        }
    if kind == "graph":
        pairs = {}
        for i, entry in enumerate(spec.get("pairs") or []):
            where = f"node.intra_node.pairs[{i}]"
            if not (isinstance(entry, list) and len(entry) == 3):
                raise ValueError(f"platform profile: {where} must be [gpu, gpu, GBps]")
            a, b = entry[:2]
            if (
                not all(
                    isinstance(x, int) and not isinstance(x, bool) and 0 <= x < g for x in (a, b)
                )
                or a == b
            ):
                raise ValueError(
                    f"platform profile: {where} names GPUs outside 0..{g - 1} or a self-link"
                )
            pairs[(a, b)] = pairs[(b, a)] = link_bytes_per_s(_number(entry[2], where), True, eff)
        other = link_bytes_per_s(
            _number(spec.get("other_pairs_GBps"), "node.intra_node.other_pairs_GBps"), True, eff
        )
        return {"kind": "graph", "pairs": pairs, "other_bytes_per_s": other}
    raise ValueError(
        f"platform profile: node.intra_node.kind must be switch or graph, got {kind!r}"
    )


def local_profile(
    gemm_tflops_per_rank: float,
    attention_tflops_per_rank: float,
    copy_GBps: float,
    ranks: int,
    memory_GB_per_rank: float,
    description: str,
    measured: dict,
) -> dict:
    """A profile document for the local machine from ``repro calibrate`` measurements.

    One rank (one process with one thread) plays one "GPU"; a node is this machine with ``ranks``
    of them. Peak = the measured single-thread GEMM ceiling (there is no datasheet peak to divide
    by, so MFU here is relative to what this machine's GEMM reaches). Links between ranks are
    shared memory: the all-to-all, NIC and link bandwidths are the measured memory-copy bandwidth
    shared by the ranks, a proxy marked approximate."""
    for name, v in (
        ("gemm", gemm_tflops_per_rank),
        ("attention", attention_tflops_per_rank),
        ("copy", copy_GBps),
        ("ranks", ranks),
        ("memory", memory_GB_per_rank),
    ):
        if not v or v <= 0:
            raise ValueError(f"calibration measured a non-positive {name} value: {v}")
    per_rank_bw = copy_GBps / ranks
    return {
        "name": "local",
        "description": description,
        "sources": [
            "measured by `repro calibrate` on this machine (suites/gemm.py GEMM ceiling, "
            "torch memory copy bandwidth, torch scaled_dot_product_attention)"
        ],
        "measured": measured,
        "gpu": {
            "name": "CPU rank (1 thread)",
            "peak_tflops": gemm_tflops_per_rank,
            "hbm_GB": memory_GB_per_rank,
            "hbm_GBps": copy_GBps,
            "achievable_gemm_tflops": gemm_tflops_per_rank,
            "achievable_attention_tflops": min(attention_tflops_per_rank, gemm_tflops_per_rank),
        },
        "node": {
            "gpus": ranks,
            "nics": 1,
            "nic_GBps": per_rank_bw,
            "gpu_nic_affinity": [list(range(ranks))],
            "intra_node_alltoall_GBps_per_gpu": per_rank_bw,
        },
        "network": {
            "topology": "single machine (shared memory)",
            "switch_group_nodes": 1,
            "rack_nodes": 1,
        },
        "links": [
            {
                "class": "intra_node",
                "scope": "shared memory between ranks",
                "GBps": per_rank_bw,
                "latency_us": 5.0,
            },
            {
                "class": "nic_injection",
                "scope": "none: emulated nodes share memory",
                "GBps": per_rank_bw,
                "latency_us": 5.0,
            },
        ],
        "efficiency": {"network": 1.0, "note": "links are the measured copy bandwidth"},
        "framework_overhead_GB": 0.2,
        "approximate": [
            "node.nic_GBps",
            "node.intra_node_alltoall_GBps_per_gpu",
            "links",
            "framework_overhead_GB",
        ],
    }
