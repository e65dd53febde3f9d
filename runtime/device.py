"""Which device a run uses: the one rule, decided here and passed down.

- A rank of an ``nccl`` world runs on ``cuda:LOCAL_RANK`` (NCCL moves CUDA tensors only; the
  launcher's local rank is the GPU's index on its node, as torchrun and srun number them).
- A rank of a ``gloo`` or ``mpi`` world runs on the CPU (gloo's all-to-all and our mpi4py
  collectives take host buffers).
- A single-process run (a local suite, a reference) takes the device it names: ``cpu``,
  ``cuda[:N]``, or ``auto`` -- the first GPU when there is one, else the CPU.

Components and suites never pick a device themselves: they are given the result of
:func:`rank_device` (through ``RankContext.device``) or :func:`resolve_device`.

``auto`` backend: :func:`auto_backend` picks nccl when every rank of the world sees a GPU of its
own, and says why (or why not).
"""

from __future__ import annotations

import os

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def _torch():
    import torch

    return torch


def cuda_count() -> int:
    """GPUs this process sees (0 without a CUDA build or driver)."""
    torch = _torch()
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def no_gpu_reason() -> str:
    torch = _torch()
    build = torch.version.cuda or "none (CPU build)"
    return f"this machine has no CUDA GPU (torch {torch.__version__}, CUDA build {build}, cuda available: False)"


def check_device(device: str) -> None:
    """``device`` names a device this machine has: auto, cpu, or cuda[:N] with a GPU.
    Raises ValueError with a one-line reason (the CLI turns it into exit 2)."""
    kind, _, index = str(device).partition(":")
    if kind in ("auto", "cpu") and not index:
        return
    if kind != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {device!r}")
    count = cuda_count()
    if not count:
        raise ValueError(f"device {device}: {no_gpu_reason()}; use --device cpu or auto")
    if index and int(index) >= count:
        raise ValueError(f"device {device}: this machine has {count} GPU(s)")


def rank_device(backend: str, local_rank: int):
    """The device of one rank of a ``backend`` world: cuda:LOCAL_RANK under nccl, else cpu."""
    torch = _torch()
    if backend == "nccl":
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def resolve_device(requested: str = "auto", ctx=None):
    """The device a run uses. In a world (``ctx`` given) the backend decides (:func:`rank_device`)
    and ``requested`` may only agree with it; alone, ``requested`` decides (auto: a GPU if any)."""
    torch = _torch()
    requested = str(requested or "auto")
    if ctx is not None:
        device = rank_device(ctx.backend, ctx.local_rank)
        if requested.partition(":")[0] not in ("auto", device.type):
            raise ValueError(
                f"device {requested} in a {ctx.backend} world: its ranks run on "
                f"{device.type} (nccl: cuda:LOCAL_RANK; gloo, mpi: cpu); "
                f"pick the backend for the device (--backend nccl for cuda)"
            )
        return device
    check_device(requested)
    if requested == "auto":
        return torch.device("cuda", 0) if cuda_count() else torch.device("cpu")
    return torch.device(requested if ":" in requested or requested == "cpu" else "cuda:0")


def group_device(group=None):
    """Where a torch.distributed group's tensors must live: this rank's current GPU under nccl
    (set by :func:`bind` when the world started), the CPU under gloo."""
    import torch.distributed as dist

    torch = _torch()
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def bind(device) -> None:
    """Make ``device`` this process's current CUDA device (NCCL and the caching allocator use it)."""
    if device.type == "cuda":
        _torch().cuda.set_device(device)


def auto_backend(ranks_per_node: int) -> tuple[str | None, str]:
    """(``"nccl"``, why) when every rank on a node of ``ranks_per_node`` ranks sees a GPU of its
    own; (None, why not) otherwise -- the caller then picks its CPU backend.

    Under a launcher each node decides from its own LOCAL_WORLD_SIZE and GPU count; the nodes of
    one cluster partition are alike, so they decide alike."""
    count = cuda_count()
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or ranks_per_node)
    if count and local <= count:
        return "nccl", f"every rank sees a GPU ({local} ranks per node, {count} GPUs)"
    if count:
        return None, f"{local} ranks per node but {count} GPU(s)"
    return None, "no GPU"


def check_backend(backend: str, local_ranks: int = 1) -> None:
    """``backend`` can run here: nccl needs a GPU for each of the ``local_ranks`` ranks on this
    node (it moves CUDA tensors only). ValueError in one line otherwise, before any rank starts
    (the CLI turns it into exit 2, as :func:`check_device` for --device cuda)."""
    if backend != "nccl":
        return
    count = cuda_count()
    if not count:
        raise ValueError(f"backend nccl: {no_gpu_reason()}; use --backend gloo")
    if local_ranks > count:
        raise ValueError(
            f"backend nccl: {local_ranks} ranks per node but this machine has {count} "
            f"GPU(s) (one GPU per rank); use fewer ranks per node or --backend gloo"
        )


def check_world_device(device: str, backend: str) -> None:
    """A world's ranks run where :func:`rank_device` puts them: ``device`` (asked for on the
    command line) must agree with ``backend``; ValueError in one line otherwise."""
    kind = str(device or "auto").partition(":")[0]
    if kind == "auto" or backend in ("auto", "none (simulated)") or not backend:
        return
    runs_on = "cuda" if backend == "nccl" else "cpu"
    if kind != runs_on:
        raise ValueError(
            f"device {device} with backend {backend}: a {backend} world's ranks run on "
            f"{runs_on} (nccl: cuda:LOCAL_RANK; gloo, mpi: cpu); "
            f"use --backend {'nccl' if kind == 'cuda' else 'gloo'} or --device {runs_on}"
        )
