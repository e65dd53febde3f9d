"""The results store: every run saved atomically as one JSON file, never overwritten.

Layout (one directory per reproduction or suite, one file per run)::

    ROOT/reproductions/<id>/<timestamp>-<commit>.json
    ROOT/suites/<name>/<timestamp>-<commit>.json

The newest file of a directory is the latest result; history is the sorted directory. Runs are
written with :func:`moe_repro.results.atomic.atomic_write_json`, so an interrupted run leaves either a
complete file or none, and every run that finished before it stays.

ROOT defaults to ``./results`` and can be set with ``--results DIR`` or ``MOE_REPRO_RESULTS``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from moe_repro.results.atomic import atomic_write_json

KINDS = ("reproductions", "suites")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def default_root() -> Path:
    return Path(os.environ.get("MOE_REPRO_RESULTS", "results"))


class ResultsStore:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_root()

    def _dir(self, kind: str, name: str) -> Path:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        return self.root / kind / _SAFE.sub("_", name)

    def save(self, kind: str, name: str, payload: dict) -> Path:
        """Store one run; the file name sorts by time, then by commit."""
        env = payload.get("environment", {})
        stamp = env.get("timestamp", "").replace(":", "").replace("-", "").replace("+0000", "Z")
        commit = (env.get("git_commit") or "nogit")[:10]
        directory = self._dir(kind, name)
        path = directory / f"{stamp or 'undated'}-{commit}.json"
        n = 1
        while path.exists():  # two runs in the same second: keep both
            path = directory / f"{stamp or 'undated'}-{commit}-{n}.json"
            n += 1
        return atomic_write_json(path, payload)

    def history(self, kind: str, name: str) -> list[Path]:
        directory = self._dir(kind, name)
        if not directory.is_dir():
            return []
        return sorted(p for p in directory.glob("*.json") if not p.name.startswith("."))

    def latest(self, kind: str, name: str) -> dict | None:
        runs = self.history(kind, name)
        return json.loads(runs[-1].read_text()) if runs else None

    def names(self, kind: str) -> list[str]:
        base = self.root / kind
        return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
