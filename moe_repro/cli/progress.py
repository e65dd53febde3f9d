"""Progress lines for commands made of counted steps (``repro site build``, ``repro calibrate``):
plain lines on stderr, on a terminal and off it, each with the steps done out of the total, the
time elapsed and an estimate of the time left (elapsed per finished step x steps left)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class StepLines:
    """``label: 3/16 done, <what>, 0:12 elapsed, about 0:40 left`` on ``stream``, at most one
    line every ``every_s`` seconds (the first and the last always print)."""

    def __init__(self, label: str, stream: TextIO | None = None, every_s: float = 0.0):
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.every_s = every_s
        self.started = time.monotonic()
        self.last = -float("inf")

    def __call__(self, done: int, total: int, what: str = "") -> None:
        """Report ``done`` of ``total`` steps finished; ``what``: the step now running, or the
        one just finished, in words."""
        from moe_repro.reproductions.suite_runs import clock

        now = time.monotonic()
        if 0 < done < total and now - self.last < self.every_s:
            return
        self.last = now
        elapsed = now - self.started
        line = f"{self.label}: {done}/{total} done" + (f", {what}" if what else "")
        line += f", {clock(elapsed)} elapsed"
        if 0 < done < total:
            line += f", about {clock(elapsed / done * (total - done))} left"
        print(line, file=self.stream, flush=True)
