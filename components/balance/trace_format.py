"""A routing-trace format that other tools can read: raw tensors plus a checksummed manifest.

A trace directory holds

    manifest.json
    tensors/L<layer>_S<step>.<name>.bin      raw little-endian bytes, C order

where ``name`` is ``expert_ids`` (int64 [T, k]), ``gates`` (float32 [T, k]) and, for workloads
with uneven sources, ``source_position`` (float64 [T]). ``manifest.json`` says which format it
is (``format``, ``version``), how the trace was made (``generator``: the workload's name,
family, sizes and parameters; ``seed``; ``steps``; ``layers``; ``description``: what in it is
real and what sampled) and, per tensor, its file, dtype, shape and sha256. Any language reads a
tensor with the dtype and shape alone (numpy: ``np.fromfile(path, dtype).reshape(shape)``).

:func:`load_trace` checks every tensor against its sha256, dtype and shape and the routing
rules (ids in range, k distinct experts per token, gates finite, non-negative and summing to 1)
and raises ``TraceError`` with one line naming what is wrong; :func:`verify_trace` also
regenerates the routings from the manifest's generator and compares them bit for bit. A trace
is written to a temporary directory and renamed into place, so a reader never sees half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from moe_repro.components.balance.workloads import Routing, Workload, get_workload

FORMAT, VERSION = "moe-repro-routing-trace", 1
DTYPES = {"int64": torch.int64, "float32": torch.float32, "float64": torch.float64}
EXPECTED = {"expert_ids": "int64", "gates": "float32", "source_position": "float64"}


class TraceError(ValueError):
    """A trace that does not match its manifest or breaks a routing rule."""


def _dtype_name(t: torch.Tensor) -> str:
    for name, dtype in DTYPES.items():
        if t.dtype == dtype:
            return name
    raise TraceError(f"dtype {t.dtype} is not one of {', '.join(DTYPES)}")


def _bytes(t: torch.Tensor) -> bytes:
    # little-endian C-order bytes; every platform torch supports here is little-endian
    return t.contiguous().numpy().tobytes()


def save_trace(
    directory: str | os.PathLike, workload: Workload, seed: int, steps: int, overwrite: bool = False
) -> dict:
    """Write ``steps`` steps of every layer of ``workload`` at ``seed``; returns the manifest."""
    target = Path(directory)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists (pass overwrite=True to replace it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        (tmp / "tensors").mkdir()
        tensors = {}
        for layer in range(workload.num_layers):
            for step in range(steps):
                r = workload.routing(seed, step, layer=layer)
                parts = {
                    "expert_ids": r.expert_ids,
                    "gates": r.gates,
                    "source_position": r.source_position,
                }
                for name, t in parts.items():
                    if t is None:
                        continue
                    data = _bytes(t)
                    rel = f"tensors/L{layer}_S{step}.{name}.bin"
                    (tmp / rel).write_bytes(data)
                    tensors[f"L{layer}_S{step}.{name}"] = {
                        "file": rel,
                        "dtype": _dtype_name(t),
                        "shape": list(t.shape),
                        "sha256": hashlib.sha256(data).hexdigest(),
                    }
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "generator": workload.generator_params(),
            "description": workload.description,
            "seed": seed,
            "steps": steps,
            "layers": workload.num_layers,
            "tensors": tensors,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def read_manifest(directory: str | os.PathLike) -> dict:
    path = Path(directory) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise TraceError(f"{path}: no manifest") from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise TraceError(
            f"{path}: format {manifest.get('format')!r} version "
            f"{manifest.get('version')!r}, expected {FORMAT!r} version {VERSION}"
        )
    for key in ("generator", "seed", "steps", "layers", "tensors"):
        if key not in manifest:
            raise TraceError(f"{path}: missing field {key!r}")
    return manifest


def _load_tensor(directory: Path, key: str, entry: dict) -> torch.Tensor:
    path = directory / entry["file"]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"{key}: missing file {entry['file']}") from None
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise TraceError(f"{key}: sha256 does not match the manifest ({entry['file']})")
    name = key.split(".", 1)[1]
    if entry["dtype"] != EXPECTED.get(name):
        raise TraceError(f"{key}: dtype {entry['dtype']}, expected {EXPECTED.get(name)}")
    dtype = DTYPES[entry["dtype"]]
    count = 1
    for n in entry["shape"]:
        count *= int(n)
    if count * torch.empty((), dtype=dtype).element_size() != len(data):
        raise TraceError(
            f"{key}: {len(data)} bytes do not hold shape {entry['shape']} of {entry['dtype']}"
        )
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(entry["shape"]).clone()


def load_trace(directory: str | os.PathLike) -> tuple[dict, list[list[Routing]]]:
    """(manifest, routings[layer][step]), every tensor checked (module docstring)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    experts = int(manifest["generator"]["num_experts"])
    out = []
    for layer in range(int(manifest["layers"])):
        row = []
        for step in range(int(manifest["steps"])):
            parts = {}
            for name in EXPECTED:
                key = f"L{layer}_S{step}.{name}"
                if key in manifest["tensors"]:
                    parts[name] = _load_tensor(directory, key, manifest["tensors"][key])
                elif name != "source_position":
                    raise TraceError(f"manifest lists no tensor {key}")
            routing = Routing(parts["expert_ids"], parts["gates"], parts.get("source_position"))
            check_routing(routing, experts, f"layer {layer} step {step}")
            row.append(routing)
        out.append(row)
    return manifest, out


def check_routing(r: Routing, num_experts: int, where: str = "") -> None:
    """Raise TraceError on a routing that breaks a rule of the format."""
    ids, gates = r.expert_ids, r.gates
    if ids.dim() != 2 or ids.shape != gates.shape or ids.shape[0] == 0:
        raise TraceError(
            f"{where}: expert_ids {list(ids.shape)} and gates {list(gates.shape)} "
            "must both be [tokens > 0, k]"
        )
    if int(ids.min()) < 0 or int(ids.max()) >= num_experts:
        raise TraceError(f"{where}: expert id outside 0..{num_experts - 1}")
    if ids.shape[1] > 1 and bool((ids.sort(dim=1).values.diff(dim=1) == 0).any()):
        raise TraceError(f"{where}: a token names the same expert twice")
    if not bool(torch.isfinite(gates).all()) or bool((gates < 0).any()):
        raise TraceError(f"{where}: gates must be finite and non-negative")
    if not torch.allclose(
        gates.double().sum(1), torch.ones(len(gates), dtype=torch.float64), atol=1e-5
    ):
        raise TraceError(f"{where}: gates of a token must sum to 1")
    pos = r.source_position
    if pos is not None and (pos.shape != (ids.shape[0],) or bool(((pos < 0) | (pos >= 1)).any())):
        raise TraceError(f"{where}: source_position must be [tokens] in [0, 1)")


def verify_trace(directory: str | os.PathLike) -> dict:
    """Load (checking every tensor), regenerate from the manifest's generator, compare bit for
    bit; returns the manifest or raises TraceError naming the first difference."""
    manifest, routings = load_trace(directory)
    gen = manifest["generator"]
    workload = get_workload(gen["workload"], gen["num_experts"], gen["top_k"], gen["tokens"])
    if workload.generator_params() != gen:
        raise TraceError(
            f"generator parameters {gen} differ from this version's {workload.generator_params()}"
        )
    for layer, row in enumerate(routings):
        for step, got in enumerate(row):
            want = workload.routing(int(manifest["seed"]), step, layer=layer)
            for name in EXPECTED:
                a, b = getattr(got, name), getattr(want, name)
                if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
                    raise TraceError(
                        f"layer {layer} step {step}: {name} differs from a fresh "
                        f"{gen['workload']} at seed {manifest['seed']}"
                    )
    return manifest
