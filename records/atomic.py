"""The one writer of every output path.

What a path names decides how it is written:

- a regular file, or a path that does not exist yet: atomically. A temporary file is written in
  the destination directory, flushed and fsynced, then renamed over the destination
  (``os.replace`` is atomic on POSIX within one file system): a reader sees the old file or the
  new one, never half of either;
- a symlink: resolved, and its target written as above (the link stays a link);
- a device, FIFO or other non-regular file: written through (opened for writing, never created,
  replaced or removed), as a shell's ``>`` would: ``--json /dev/stdout`` prints, ``/dev/null``
  discards, and the node survives;
- a directory: refused (IsADirectoryError).

:func:`output_file_problem` and :func:`output_dir_problem` say, in one line, why a path cannot
be written, so that a command can refuse it before doing any work (moe_repro/cli/errors.py).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes, make_parents: bool = True) -> Path:
    """Write ``data`` to ``path`` by the rules above; the path written (a symlink's target).
    ``make_parents``: create missing directories (the store and the site build their own
    folders; a path the user typed is checked first and never has its directories created)."""
    path = Path(path)
    target, mode = _resolve(path)
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    if mode is not None and not stat.S_ISREG(mode):
        _write_through(target, data)
        return target
    if make_parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    # a short temporary name: a destination name near the 255-byte limit must still work
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; results and sites are for sharing
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target


def atomic_create_bytes(directory: str | os.PathLike, names, data: bytes) -> Path:
    """Write ``data`` as a new file in ``directory`` under the first of ``names`` that no file
    has, atomically and exclusively: the whole file appears at once (written to a temporary
    name, then hard-linked, which fails rather than replace an existing name), so writers at
    the same moment never overwrite each other."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        for name in names:
            path = directory / name
            try:
                os.link(tmp, path)
            except FileExistsError:
                continue
            except OSError as e:
                if e.errno not in _NO_HARD_LINKS:
                    raise
                # a file system without hard links: an exclusive create still never overwrites
                # (a reader may see the file while it is written, for this once)
                try:
                    _create_exclusive(path, data)
                except FileExistsError:
                    continue
            return path
        raise FileExistsError(errno.EEXIST, "every candidate name is taken", str(directory))
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS}


def _create_exclusive(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                 0o666)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(path)  # no half-written result is left behind
        raise
    finally:
        os.close(fd)


def atomic_create_json(directory: str | os.PathLike, names, obj: Any) -> Path:
    return atomic_create_bytes(directory, names, _json_bytes(obj))


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=False, default=_jsonable) + "\n").encode("utf-8")


def _resolve(path: Path) -> tuple[Path, int | None]:
    """The file a write to ``path`` lands in (a symlink's target) and its mode (None: absent)."""
    target = Path(os.path.realpath(path)) if os.path.islink(path) else path
    try:
        return target, os.stat(target).st_mode
    except FileNotFoundError:
        return target, None


def _write_through(target: Path, data: bytes) -> None:
    # no O_CREAT: if the node vanished since it was looked at, nothing is created in its place;
    # no O_TRUNC: it means nothing for a device or FIFO
    fd = os.open(target, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str, make_parents: bool = True) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), make_parents)


def atomic_write_json(path: str | os.PathLike, obj: Any, make_parents: bool = True) -> Path:
    return atomic_write_bytes(path, _json_bytes(obj), make_parents)


def _jsonable(obj: Any) -> Any:
    # numpy / torch scalars and paths reach the store from suites; store them as plain values.
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def output_file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be written as an output file, in a few words; None if it can.
    Checked by really creating (and removing) a file where the write would: permission bits
    say nothing for root, read-only mounts or /proc."""
    path = Path(path)
    if str(path) == "" or path.name in ("", ".", ".."):
        return "not a file name"
    try:
        target, mode = _resolve(path)
    except OSError as e:  # a symlink loop, a component that is a file, a name too long
        if e.errno == errno.ENAMETOOLONG:
            return f"file name longer than {_name_max(path.parent)} bytes"
        return e.strerror or str(e)
    if mode is not None and stat.S_ISDIR(mode):
        return "is a directory"
    if mode is not None and not stat.S_ISREG(mode):
        # written through; opening a FIFO here would wait for its reader, so ask the kernel
        return None if os.access(target, os.W_OK) else "not writable"
    parent = target.parent
    if not parent.is_dir():
        return f"directory {str(parent)!r} does not exist (it is not created)"
    name_max = _name_max(parent)
    if len(os.fsencode(target.name)) > name_max:
        return f"file name longer than {name_max} bytes"
    return _probe(parent)


def output_dir_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be used as an output directory; None if it can. A missing directory
    is created by the writer, so its nearest existing ancestor must be a writable directory."""
    path = Path(path)
    if str(path) == "":
        return "not a directory name"
    try:
        if path.exists() and not path.is_dir():
            return "exists and is not a directory"
    except OSError as e:
        return e.strerror or str(e)
    existing = path
    while not existing.exists():
        if len(os.fsencode(existing.name)) > _name_max(existing.parent if existing.parent.exists() else Path(".")):
            return "a directory name is too long"
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        return f"{str(existing)!r} is not a directory"
    return _probe(existing)


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _probe(directory: Path) -> str | None:
    try:
        fd, probe = tempfile.mkstemp(prefix=".tmp-", suffix=".probe", dir=directory)
    except OSError as e:
        return f"cannot create a file in {str(directory)!r}: {e.strerror or e}"
    os.close(fd)
    os.unlink(probe)
    return None


_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def inside(directory: Path, name: str) -> Path:
    """``directory / name``, refused unless it is a plain file name that stays in ``directory``
    (no '/', no '..', no symlink leading out) and is a regular file or nothing yet: what a page
    is called must never decide where it is written."""
    if not _FILE_NAME.match(name) or ".." in name:
        raise ValueError(f"refusing to write {name!r}: not a plain file name")
    path = Path(directory) / name
    root = os.path.realpath(directory)
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        raise ValueError(f"refusing to write {path}: it leads outside {directory}")
    try:  # a FIFO or device planted in a folder the writer owns would be written through (or block)
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError(f"refusing to write {path}: it exists and is not a regular file")
    except FileNotFoundError:
        pass
    return path
