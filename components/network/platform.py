"""Platform profiles: the measured or published numbers the resource model is fed with.

A profile is a JSON document (components/network/platforms/<name>.json, copy one and edit it). Fields:

- ``gpu``: ``peak_tflops`` (dense bf16, the MFU denominator), ``hbm_GB`` (C_GPU of Piper Eq. 11),
  ``hbm_GBps``, ``achievable_gemm_tflops`` and ``achievable_attention_tflops`` (what kernels reach,
  Piper Sec. IV-A: measured by micro-benchmarks; ``repro calibrate`` measures them locally).
- ``node``: ``gpus`` (g), ``nics``, ``nic_GBps`` (B_NIC of Eq. 6, one direction), ``gpu_nic_affinity``
  (which GPUs inject through which NIC), ``intra_node_alltoall_GBps_per_gpu``.
- ``network``: ``switch_group_nodes`` (N_h of Eq. 10), ``rack_nodes``, ``topology``.
- ``links``: one entry per link class (``class``, ``scope``, ``GBps``, ``latency_us``), from the
  fastest to the slowest: what a network simulator needs per hop class.
- ``efficiency.network``: the fraction of NIC line rate a flat all-to-all sustains (an assumption
  unless measured), ``framework_overhead_GB`` (M_fw), ``sources`` and ``approximate``.

Loading the built-in profiles reads package data; user files are read by the CLI and passed in
as dicts (components do no other file I/O).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

GB = 1e9


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

    @property
    def nic_bytes_per_s_per_gpu(self) -> float:
        """Injection bandwidth per GPU when every GPU of a node sends off-node at once."""
        return self.nics_per_node * self.nic_bytes_per_s / self.gpus_per_node

    def link(self, cls: str) -> dict:
        for link in self.links:
            if link["class"] == cls:
                return link
        raise KeyError(f"platform {self.name} has no link class {cls!r}")


def builtin_names() -> list[str]:
    files = resources.files("moe_repro.components.network").joinpath("platforms")
    return sorted(p.name[:-5] for p in files.iterdir() if p.name.endswith(".json"))


def load_builtin(name: str) -> Platform:
    """A shipped profile by name; ValueError naming the known ones."""
    names = builtin_names()
    if name not in names:
        raise ValueError(f"unknown platform {name!r}; known: {', '.join(names)} (or a JSON file path)")
    text = resources.files("moe_repro.components.network").joinpath("platforms", f"{name}.json").read_text()
    return from_dict(json.loads(text))


def from_dict(d: dict) -> Platform:
    """Validate a profile document; ValueError naming the missing or bad field."""
    def get(path: str, positive: bool = True):
        node = d
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ValueError(f"platform profile: missing field {path!r}")
            node = node[part]
        if positive and (not isinstance(node, (int, float)) or node <= 0):
            raise ValueError(f"platform profile: {path} must be a positive number, got {node!r}")
        return node

    eff = d.get("efficiency", {}).get("network", 1.0)
    if not 0 < eff <= 1:
        raise ValueError(f"platform profile: efficiency.network must be in (0, 1], got {eff}")
    return Platform(
        name=str(d.get("name", "custom")),
        gpus_per_node=int(get("node.gpus")),
        peak_flops=get("gpu.peak_tflops") * 1e12,
        hbm_bytes=get("gpu.hbm_GB") * GB,
        hbm_bytes_per_s=get("gpu.hbm_GBps") * GB,
        gemm_flops=get("gpu.achievable_gemm_tflops") * 1e12,
        attention_flops=get("gpu.achievable_attention_tflops") * 1e12,
        nics_per_node=int(get("node.nics")),
        nic_bytes_per_s=get("node.nic_GBps") * GB,
        intra_node_a2a_bytes_per_s=get("node.intra_node_alltoall_GBps_per_gpu") * GB,
        switch_group_nodes=int(get("network.switch_group_nodes")),
        rack_nodes=int(get("network.rack_nodes")),
        network_efficiency=float(eff),
        overhead_bytes=float(d.get("framework_overhead_GB", 0.0)) * GB,
        links=tuple(d.get("links", ())),
        raw=d,
    )


def local_profile(gemm_tflops_per_rank: float, attention_tflops_per_rank: float, copy_GBps: float,
                  ranks: int, memory_GB_per_rank: float, description: str, measured: dict) -> dict:
    """A profile document for the local machine from ``repro calibrate`` measurements.

    One rank (one process with one thread) plays one "GPU"; a node is this machine with ``ranks``
    of them. Peak = the measured single-thread GEMM ceiling (there is no datasheet peak to divide
    by, so MFU here is relative to what this machine's GEMM reaches). Links between ranks are
    shared memory: the all-to-all, NIC and link bandwidths are the measured memory-copy bandwidth
    shared by the ranks, a proxy marked approximate."""
    for name, v in (("gemm", gemm_tflops_per_rank), ("attention", attention_tflops_per_rank),
                    ("copy", copy_GBps), ("ranks", ranks), ("memory", memory_GB_per_rank)):
        if not v or v <= 0:
            raise ValueError(f"calibration measured a non-positive {name} value: {v}")
    per_rank_bw = copy_GBps / ranks
    return {
        "name": "local",
        "description": description,
        "sources": ["measured by `repro calibrate` on this machine (suites/gemm.py GEMM ceiling, "
                    "torch memory copy bandwidth, torch scaled_dot_product_attention)"],
        "measured": measured,
        "gpu": {"name": "CPU rank (1 thread)", "peak_tflops": gemm_tflops_per_rank,
                "hbm_GB": memory_GB_per_rank, "hbm_GBps": copy_GBps,
                "achievable_gemm_tflops": gemm_tflops_per_rank,
                "achievable_attention_tflops": min(attention_tflops_per_rank, gemm_tflops_per_rank)},
        "node": {"gpus": ranks, "nics": 1, "nic_GBps": per_rank_bw, "gpu_nic_affinity": [list(range(ranks))],
                 "intra_node_alltoall_GBps_per_gpu": per_rank_bw},
        "network": {"topology": "single machine (shared memory)", "switch_group_nodes": 1, "rack_nodes": 1},
        "links": [{"class": "intra_node", "scope": "shared memory between ranks", "GBps": per_rank_bw,
                   "latency_us": 5.0},
                  {"class": "nic_injection", "scope": "none: emulated nodes share memory", "GBps": per_rank_bw,
                   "latency_us": 5.0}],
        "efficiency": {"network": 1.0, "note": "links are the measured copy bandwidth"},
        "framework_overhead_GB": 0.2,
        "approximate": ["node.nic_GBps", "node.intra_node_alltoall_GBps_per_gpu", "links", "framework_overhead_GB"],
    }
