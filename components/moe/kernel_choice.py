"""The ``auto`` grouped-GEMM kernel: per device, dtype and shape, the fastest correct kernel.

``auto`` is a name the layer, the trainer and the suites accept wherever a kernel of
components/moe/grouped_gemm.py is asked for. It resolves, per call, from:

1. the measured table of this machine, when one exists: written by a run of the expert-gemm
   suite (suites/grouped_gemm.py, its summary) from its records, keeping per (device type,
   dtype, tokens per expert T, K, M) the kernel with the highest median TFLOP/s among those
   with no wrong element. The table is a JSON file cached per machine (its file name and
   content carry the machine's identity: device name, CPU model, core count, torch version);
   a table of another machine is ignored. A call takes the entry of its device type and dtype
   nearest to its shape (distance in log2 of T, K and M), among kernels that can run here,
   if that entry is within NEAR_FACTOR of the call's T, K and M each; a table measured only
   at other shapes says nothing about this one (kernel rankings cross with shape), and the
   fallback rule applies. A call that will be differentiated takes only entries that timed
   forward + backward (``passes``); the expert-gemm suite times the forward.
2. otherwise the documented fallback rule: ``grouped_mm`` (one ``torch._grouped_mm`` kernel)
   where this torch provides it for the device and dtype (probed once with a tiny forward and
   backward), else ``padded_bmm`` (one batched matmul). Never ``sequential``: a Python loop
   of one GEMM per expert, kept as the reference.

The choice is recorded: :class:`Choice` says the kernel and why (``table`` or ``fallback``);
the expert MLP keeps its last one, and the moe-layer suite writes it into each record.

Why measured, not fixed: which kernel is fastest depends on the device, the dtype and the
tokens per expert (Piper Fig. 4's curves cross).

Where the table lives: ``$MOE_REPRO_KERNEL_TABLE`` if set, else
``~/.cache/moe_repro/kernel-table-<machine id>.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from moe_repro.records.environment import cpu_model
from moe_repro.runtime.device import cuda_count
from moe_repro.components.lazy_import import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

AUTO = "auto"
FORWARD, TRAINING = "forward", "forward+backward"  # what a table entry's rate timed
# How far (ratio in each of T, K, M) a measured shape speaks for a call's shape: one doubling
# step of the expert-gemm suite's T sweep either side.
NEAR_FACTOR = 2.0
FALLBACK_ORDER = ("grouped_mm", "padded_bmm")


@dataclass(frozen=True)
class Choice:
    """The kernel ``auto`` resolved to, and from what (``table`` or ``fallback``)."""

    kernel: str
    source: str


def machine_identity(device_type: str = "cpu") -> dict:
    """What makes a measured table valid: the device, the CPU, its cores, torch's version."""
    ident = {
        "device_type": device_type,
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 0,
        "torch": str(torch.__version__),
    }
    if device_type == "cuda" and cuda_count():
        ident["device_name"] = torch.cuda.get_device_name()
    return ident


def _identity_key(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]


def table_path(device_type: str = "cpu") -> Path:
    """Where this machine's table for ``device_type`` is cached."""
    env = os.environ.get("MOE_REPRO_KERNEL_TABLE")
    if env:
        return Path(env)
    key = _identity_key(machine_identity(device_type))
    return Path.home() / ".cache" / "moe_repro" / f"kernel-table-{device_type}-{key}.json"


def table_from_records(records: Iterable[dict]) -> list[dict]:
    """Entries of the table from expert-gemm records: per (device, dtype, T, K, M) the kernel
    with the highest TFLOP/s among those with no wrong element (``dense`` is not a kernel)."""
    best: dict[tuple, dict] = {}
    for r in records:
        if r.get("variant") in (None, "dense", AUTO) or "tflops" not in r:
            continue
        if int(r.get("wrong", 0) or 0) != 0:
            continue
        key = (
            str(r.get("device_type", "cpu")),
            str(r["dtype"]),
            int(r["tokens_per_expert"]),
            int(r["K"]),
            int(r["M"]),
        )
        if key not in best or float(r["tflops"]) > best[key]["tflops"]:
            best[key] = {
                "device": key[0],
                "dtype": key[1],
                "tokens_per_expert": key[2],
                "K": key[3],
                "M": key[4],
                "kernel": str(r["variant"]),
                "tflops": float(r["tflops"]),
                "threads": int(r.get("threads", 0) or 0),  # 0: torch's default
                "passes": str(r.get("passes", FORWARD)),  # what was timed
            }
    return list(best.values())


def write_table(entries: list[dict], device_type: str = "cpu", path: Path | None = None) -> Path:
    """Merge ``entries`` into this machine's table (newer entries replace the same shapes)."""
    path = path or table_path(device_type)
    ident = machine_identity(device_type)
    old = load_table(device_type, path) if path.exists() else []
    merged = {_shape_key(e): e for e in old}
    merged.update({_shape_key(e): e for e in entries})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"machine": ident, "entries": list(merged.values())}, indent=1))
    tmp.replace(path)
    load_table.cache_clear()
    return path


def _shape_key(e: dict) -> tuple:
    return (e["device"], e["dtype"], e["tokens_per_expert"], e["K"], e["M"])


@cache
def load_table(device_type: str = "cpu", path: Path | None = None) -> list[dict]:
    """This machine's entries ([] when no table, or when the file is another machine's)."""
    path = path or table_path(device_type)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("machine") != machine_identity(device_type):
        return []
    entries = data.get("entries")
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


@cache
def _grouped_mm_works(device_type: str, dtype: "torch.dtype") -> bool:
    """Whether torch._grouped_mm runs forward and backward here for this dtype (probed once)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:  # with grad whatever the caller's mode: the first call may come under no_grad
        with torch.inference_mode(False), torch.enable_grad():
            return _probe_grouped_mm(torch.device(device_type), dtype)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return False


def _probe_grouped_mm(dev: "torch.device", dtype: "torch.dtype") -> bool:
    """A tiny forward and backward (fixed values: the global random state is left alone)."""
    x = torch.ones(4, 16, device=dev, dtype=dtype, requires_grad=True)
    w = torch.ones(2, 16, 16, device=dev, dtype=dtype, requires_grad=True)
    offs = torch.tensor([1, 4], dtype=torch.int32, device=dev)
    torch._grouped_mm(x, w, offs=offs).backward(torch.ones(4, 16, device=dev, dtype=dtype))
    return x.grad is not None and w.grad is not None


def fallback_kernel(device_type: str, dtype: "torch.dtype") -> str:
    """The rule when no table exists: grouped_mm where torch runs it, else padded_bmm."""
    return "grouped_mm" if _grouped_mm_works(device_type, dtype) else "padded_bmm"


def _dtype_name(dtype: "torch.dtype") -> str:
    return str(dtype).removeprefix("torch.")


def choose_kernel(
    device_type: str,
    dtype: "torch.dtype",
    tokens_per_expert: float,
    k: int,
    m: int,
    runnable: Iterable[str] = FALLBACK_ORDER,
    training: bool = False,
) -> Choice:
    """The kernel ``auto`` runs for this device type, dtype and shape (see module docstring),
    among the ``runnable`` kernels (grouped_gemm.grouped_gemm_names(): the registry is not
    imported here, it imports this module). ``training``: the call will be differentiated, and
    only entries that timed forward + backward speak for it (a forward-only ranking is not the
    training one: the kernels' backward passes differ more than their forwards)."""
    nearest = nearest_entry(device_type, dtype, tokens_per_expert, k, m, runnable, training)
    if nearest is not None:
        return Choice(str(nearest["kernel"]), "table")
    return Choice(fallback_kernel(device_type, dtype), "fallback")


def nearest_entry(
    device_type: str,
    dtype: "torch.dtype",
    tokens_per_expert: float,
    k: int,
    m: int,
    runnable: Iterable[str] | None = None,
    training: bool = False,
) -> dict | None:
    """This machine's table entry for the device type and dtype nearest to the shape (among
    ``runnable`` kernels; None: any), if within NEAR_FACTOR in each of T, K and M; else None.
    Its ``tflops`` is the fastest kernel's measured rate there (at its ``threads``)."""
    name = _dtype_name(dtype)
    entries = [
        e
        for e in load_table(device_type)
        if e.get("device") == device_type
        and e.get("dtype") == name
        and (runnable is None or e.get("kernel") in set(runnable))
        and (not training or e.get("passes") == TRAINING)
    ]
    if not entries:
        return None

    def gaps(e: dict) -> list[float]:  # |log2| ratios in T, K and M
        return [
            abs(math.log2(max(a, 1.0)) - math.log2(max(float(b), 1.0)))
            for a, b in ((tokens_per_expert, e["tokens_per_expert"]), (k, e["K"]), (m, e["M"]))
        ]

    nearest = min(entries, key=lambda e: sum(gaps(e)))
    return nearest if max(gaps(nearest)) <= math.log2(NEAR_FACTOR) else None


def resolve(
    name: str,
    x: "torch.Tensor",
    w: "torch.Tensor",
    tokens_per_group: "torch.Tensor",
    runnable: Iterable[str] = FALLBACK_ORDER,
) -> Choice:
    """``name`` itself when it names a kernel; for ``auto`` the choice for x [N, K] times
    w [G, K, M] with the groups' mean rows as the tokens per expert, as a training call when
    grad is on and x or w requires it."""
    if name != AUTO:
        return Choice(name, "named")
    groups = max(1, int(w.shape[0]))
    training = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
    return choose_kernel(
        x.device.type,
        x.dtype,
        x.shape[0] / groups,
        int(w.shape[1]),
        int(w.shape[2]),
        runnable,
        training,
    )
