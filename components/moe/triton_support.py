"""Whether the Triton kernels (components/moe/triton_kernels.py) can run here, without importing
Triton: the registries ask this before offering them, and refuse them in one line otherwise.

Triton compiles its kernels for a CUDA GPU. On a CPU it can run them in interpreter mode
(``TRITON_INTERPRET=1``, read when the kernels are defined): numpy executes each program
instance, which is exact for fp32 and fp16 (bf16 loads and ``tl.dot`` are wrong under the
interpreter, so the kernels refuse bf16 there).
"""

from __future__ import annotations

import importlib.util
import os
import sys

INSTALL_HINT = "pip install 'moe-repro[triton]'"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_unavailable() -> str | None:
    """Why the Triton kernels cannot run in this process (None: they can)."""
    if importlib.util.find_spec("triton") is None:
        return f"triton is not installed ({INSTALL_HINT})"
    if interpreting():
        language = sys.modules.get("triton.language")
        if language is not None and type(language.zeros).__name__ == "JITFunction":
            return (
                "triton was imported before TRITON_INTERPRET=1 was set, so its library is "
                "compiled, not interpreted: set the variable before Python starts"
            )
        return None
    from moe_repro.runtime.device import cuda_count

    if not cuda_count():
        return (
            "Triton compiles for a CUDA GPU and this machine has none; set TRITON_INTERPRET=1 "
            "to run its kernels in interpreter mode on the CPU"
        )
    return None


def require_triton(*tensors) -> None:
    """ValueError (one line) when the kernels cannot run on these tensors here."""
    why = triton_unavailable()
    if why:
        raise ValueError(f"Triton kernels refused: {why}")
    import torch

    for t in tensors:
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(
                f"Triton kernels refused: {t.dtype} (they take float32, float16, "
                f"and bfloat16 on a GPU)"
            )
        if t.device.type == "cpu" and not interpreting():
            raise ValueError(
                "Triton kernels refused: CPU tensors need interpreter mode (TRITON_INTERPRET=1)"
            )
        if t.dtype == torch.bfloat16 and interpreting():
            raise ValueError(
                "Triton kernels refused: bfloat16 is not exact in interpreter mode "
                "(use float32 or float16 there)"
            )
