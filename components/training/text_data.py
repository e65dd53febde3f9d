"""Real text that exists offline on every machine: the Python standard library's source files.

Byte-level tokens (vocabulary 256, so any model with vocab >= 256 can read them). Batches are a
pure function of (seed, step): every rank, and the single-process reference, draw the same
global batch and take their own rows, which is what makes the trainer's exactness check
possible without shipping data between processes.
"""

from __future__ import annotations

import sysconfig
from functools import lru_cache
from pathlib import Path

import torch

BYTE_VOCAB = 256


@lru_cache(maxsize=2)
def stdlib_corpus(max_bytes: int = 4_000_000) -> torch.Tensor:
    """The first ``max_bytes`` bytes of the stdlib's top-level ``*.py`` files, sorted by name."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if total < 10_000:
        raise ValueError(f"found only {total} bytes of Python source under {root}")
    blob = b"".join(chunks)[:max_bytes]
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).long()


def global_batch(seed: int, step: int, n_sequences: int, seq_len: int) -> torch.Tensor:
    """[n_sequences, seq_len + 1] windows at offsets drawn from (seed, step); inputs are [:, :-1]
    and next-token targets [:, 1:]."""
    corpus = stdlib_corpus()
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    starts = torch.randint(0, corpus.numel() - seq_len - 1, (n_sequences,), generator=g)
    return torch.stack([corpus[s : s + seq_len + 1] for s in starts.tolist()])
