"""Rank targets for tests/test_supervision.py (importable by rank processes via PYTHONPATH)."""

import os
import time
from pathlib import Path


def sleep_after_reporting(ctx, pid_dir: str, seconds: float = 120.0):
    """Write this rank's pid where the test can see it, then sleep (a long-running rank)."""
    Path(pid_dir, f"rank-{ctx.rank}.pid").write_text(str(os.getpid()))
    time.sleep(seconds)
    return ctx.rank
