"""The results store: every run saved atomically as one JSON file, never overwritten (each file
is created exclusively, so runs saved at the same moment, from any number of processes, each
keep their own file).

Layout (one directory per reproduction or suite, one file per run)::

    ROOT/reproductions/<id>/<timestamp>-<commit>.json
    ROOT/suites/<name>/<timestamp>-<commit>.json

The newest file of a directory is the latest result; history is the sorted directory. Runs are
written with :func:`moe_repro.records.atomic.atomic_write_json`, so an interrupted run leaves
either a complete file or none, and every run that finished before it stays.

Files are read as records (records/record.py): validated, older versions migrated. A file that
cannot be read is reported once, by path, through ``on_unreadable`` (default: one line on
stderr) and skipped, so one bad file never hides the others. So is anything that is not a
regular file (a FIFO named *.json is never opened), and a record filed under another name or
kind than its folder's.

ROOT defaults to ``./results`` and can be set with ``--results DIR`` or ``MOE_REPRO_RESULTS``
(set but empty counts as unset).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Callable

from moe_repro.records.atomic import atomic_create_json
from moe_repro.records.record import (
    KINDS,
    STORE_DIRS,
    ReproductionRecord,
    SuiteRecord,
    UnreadableRecord,
    dump,
    load_record,
)

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def default_root() -> Path:
    # an empty MOE_REPRO_RESULTS is unset, as the CLI's option reads it: never the current
    # directory (Path("") is ".")
    return Path(os.environ.get("MOE_REPRO_RESULTS") or "results")


def warn_on_stderr(error: UnreadableRecord) -> None:
    sys.stderr.write(f"repro: warning: skipped unreadable result {error}\n")


def _run_order(path: Path) -> tuple:
    """Sort key of a stored run, oldest first: its time stamp and commit, then the number a
    second run in the same second got ("-1", "-2", ...; plain name sorting would put
    "T-c-1.json" before "T-c.json", since "-" sorts before ".")."""
    parts = path.stem.split("-")
    if len(parts) >= 3 and parts[-1].isdigit():  # <stamp>-<commit>-<n>
        return ("-".join(parts[:-1]), int(parts[-1]))
    return (path.stem, 0)


class ResultsStore:
    def __init__(
        self,
        root: str | os.PathLike | None = None,
        on_unreadable: Callable[[UnreadableRecord], None] = warn_on_stderr,
        saves: bool = True,
    ):
        self.root = Path(root) if root is not None else default_root()
        self.saves = (
            saves  # False: reads only, save() stores nothing (a launched rank other than 0)
        )
        self.on_unreadable = on_unreadable
        self._reported: set[str] = set()

    def write_problem(self) -> str | None:
        """Why runs could not be saved here, in a few words (None: they can); commands that
        store ask before any work, so a long run never ends unable to keep its result."""
        from moe_repro.records.atomic import output_dir_problem

        return output_dir_problem(self.root)

    def _dir(self, kind: str, name: str) -> Path:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        safe = _SAFE.sub("_", name)
        if not safe.strip(".") or safe.startswith("."):  # '', '.', '..', a hidden folder
            raise ValueError(f"not a result name: {name!r}")
        return self.root / STORE_DIRS[kind] / safe

    def save(self, record: ReproductionRecord | SuiteRecord) -> Path | None:
        """Store one run; the file name sorts by time, then by commit. A store made with
        ``saves=False`` stores nothing and returns None: in a world torchrun, mpiexec or srun
        started every rank runs the command, and the CLI gives the ranks other than 0 such a
        store, so a run is kept once."""
        if not self.saves:
            return None
        env = record.environment
        stamp = env.timestamp.replace(":", "").replace("-", "").replace("+0000", "Z")
        # the file name is made of the record's content: only plain characters of it
        stamp = _SAFE.sub("_", stamp).strip(".")
        commit = _SAFE.sub("_", (env.git_commit or "nogit")[:10]).strip(".")
        directory = self._dir(record.kind, record.name)
        # two runs in the same second, even from two processes at once: each gets its own file
        # (created exclusively: a name another writer took is never overwritten)
        names = (
            f"{stamp or 'undated'}-{commit}{'' if n == 0 else f'-{n}'}.json"
            for n in range(1_000_000)
        )
        return atomic_create_json(directory, names, dump(record))

    def history(self, kind: str, name: str) -> list[Path]:
        directory = self._dir(kind, name)
        if not directory.is_dir():
            return []
        # only regular files: a FIFO named *.json would block the first reader that opened it
        # (is_file() looks with stat, opening nothing); others are named once and passed over
        files = []
        for p in sorted(directory.glob("*.json"), key=_run_order):
            if p.name.startswith("."):
                continue
            if p.is_file():
                files.append(p)
            elif str(p) not in self._reported:
                self._reported.add(str(p))
                self.on_unreadable(UnreadableRecord(p, "not a regular file (skipped unread)"))
        return files

    def read(self, path: Path) -> ReproductionRecord | SuiteRecord | None:
        """The record in ``path``, or None after reporting it (once) as unreadable."""
        try:
            record = load_record(path)  # records/inputs.py: regular files only, within a cap
            # a record filed under another name or kind than its folder's is not that result
            # (and its own name must never decide where anything is written)
            if (
                path.parent.name != _SAFE.sub("_", record.name)
                or path.parent.parent.name != STORE_DIRS[record.kind]
            ):
                raise UnreadableRecord(
                    path,
                    f"holds {record.kind} {record.name!r}, not one of "
                    f"{path.parent.parent.name}/{path.parent.name}",
                )
            return record
        except UnreadableRecord as e:
            where = e.path or str(path)
            if where not in self._reported:
                self._reported.add(where)
                self.on_unreadable(e)
            return None

    def runs(self, kind: str, name: str) -> list[ReproductionRecord | SuiteRecord]:
        """Every readable run of ``name``, oldest first."""
        return [r for r in map(self.read, self.history(kind, name)) if r is not None]

    def latest(self, kind: str, name: str) -> ReproductionRecord | SuiteRecord | None:
        """The newest readable run (an unreadable newer file is reported and passed over)."""
        for path in reversed(self.history(kind, name)):
            record = self.read(path)
            if record is not None:
                return record
        return None

    def names(self, kind: str) -> list[str]:
        base = self.root / STORE_DIRS[kind] if kind in KINDS else None
        if base is None:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        return (
            sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
            if base.is_dir()
            else []
        )
