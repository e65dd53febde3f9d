"""torch's CPU random generator, draw for draw, in numpy: the same numbers without importing torch.

Why: a simulated grid point replays the messages of the real run's ranks, whose routing is drawn
with ``torch.Generator().manual_seed(seed)``; importing torch to draw a few thousand numbers
costs about a second, longer than the simulation (`repro bench alltoall --nodes 16`).

What torch does (ATen, CPU generator, pinned torch version; tests/test_torch_cpu_random.py
compares every draw used here with torch itself):
  - the engine is the 32-bit Mersenne Twister mt19937, seeded with the standard init_genrand
    of the seed's low 32 bits: numpy's legacy ``RandomState(seed)`` seeds the same engine the
    same way, and ``randint(0, 2**32, dtype=uint32)`` returns its raw 32-bit outputs, one each;
  - ``torch.rand`` (float32): one 32-bit draw r per value, (r & (2**24 - 1)) * 2**-24;
  - ``torch.randint(low, high)`` with high - low < 2**28: one 32-bit draw r per value,
    r % (high - low) + low (from 2**28 on torch takes two draws per value: not reproduced).
Only these draws are reproduced; anything else raises.
"""

from __future__ import annotations

import numpy as np

_FLOAT32_BITS = 24  # float32 mantissa digits: torch.rand keeps this many low bits of a draw
_RANDINT_32BIT_SPANS = 2**28  # torch.randint draws 32 bits per value below this span, 64 from it


class TorchCPUGenerator:
    """The draws of ``torch.Generator().manual_seed(seed)`` on the CPU, in order."""

    def __init__(self, seed: int):
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.seed = int(seed)
        self._engine = np.random.RandomState(self.seed & 0xFFFFFFFF)  # torch keeps the low 32 bits

    def _raw(self, n: int) -> np.ndarray:
        """The engine's next ``n`` 32-bit outputs."""
        return self._engine.randint(0, 2**32, size=int(n), dtype=np.uint32)

    def rand(self, *shape: int) -> np.ndarray:
        """``torch.rand(*shape, generator=g)`` (float32) as a numpy array."""
        bits = self._raw(int(np.prod(shape, dtype=np.int64))) & np.uint32((1 << _FLOAT32_BITS) - 1)
        return (bits.astype(np.float32) * np.float32(2.0**-_FLOAT32_BITS)).reshape(shape)

    def randint(self, low: int, high: int, shape: tuple[int, ...]) -> np.ndarray:
        """``torch.randint(low, high, shape, generator=g)`` (int64) as a numpy array."""
        span = int(high) - int(low)
        if not 0 < span < _RANDINT_32BIT_SPANS:
            raise ValueError(f"randint needs 0 < high - low < 2**28, got [{low}, {high})")
        return (self._raw(int(np.prod(shape, dtype=np.int64))) % np.uint32(span)).astype(
            np.int64
        ).reshape(shape) + int(low)

    def skip(self, n: int) -> None:
        """Advance past ``n`` draws of one 32-bit output each (rand or randint values)."""
        self._raw(n)
