"""The one writer of every output path.

What a path names decides how it is written:

- a regular file, or a path that does not exist yet: atomically. A temporary file is written in
  the destination directory, flushed and fsynced, then renamed over the destination
  (``os.replace`` is atomic on POSIX within one file system): a reader sees the old file or the
  new one, never half of either;
- a symlink: resolved, and its target written as above (the link stays a link);
- a device, FIFO or other non-regular file: written through (opened for writing, never created,
  replaced or removed), as a shell's ``>`` would: ``/dev/null`` discards, and the node survives.
  A FIFO is opened without blocking: with no reader the writer waits at most
  READER_WAIT_S for one, and a reader that takes nothing for STALL_S ends the write, each with
  an error that says so, never a silent hang;
- an open descriptor (``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``): the stream the shell
  opened, written through and appended to, even where it is a regular file (``> out.txt``);
- a socket or a directory: refused.

:func:`output_file_problem` and :func:`output_dir_problem` say, in one line, why a path cannot
be written, so that a command can refuse it before doing any work (moe_repro/cli/errors.py):
a trailing '/', a symlink to nothing or a symlink loop where a directory is wanted, a socket, a
FIFO that no process reads. A FIFO whose reader is there is held open from that check to the
write, so that the reader waits for the data instead of seeing the check's close as the end.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes, make_parents: bool = True) -> Path:
    """Write ``data`` to ``path`` by the rules above; the path written (a symlink's target).
    ``make_parents``: create missing directories (the store and the site build their own
    folders; a path the user typed is checked first and never has its directories created)."""
    path = Path(path)
    target, mode, through = _resolve(path)
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    if mode is not None and stat.S_ISSOCK(mode):
        raise OSError(errno.ENXIO, "is a socket, not a file", str(path))
    if through:
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
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
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


def _resolve(path: Path) -> tuple[Path, int | None, bool]:
    """The file a write to ``path`` lands in, its mode (None: absent), and whether it is written
    through (a node, or an open descriptor) rather than replaced. A symlink to a regular file or
    to nothing is resolved, so that its target is replaced or created and the link stays; a
    link to a node or a descriptor is opened as given (the target of /dev/stdout is
    /proc/self/fd/1, and what that names is no file name: a pipe is "pipe:[N]")."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if (
        mode is not None
        and not stat.S_ISDIR(mode)
        and (not stat.S_ISREG(mode) or _names_a_descriptor(path))
    ):
        return path, mode, True
    if os.path.islink(path):
        return Path(os.path.realpath(path)), mode, False
    return path, mode, False


# a process's open descriptor, as /proc shows it: what /dev/stdout and /dev/fd/N lead to
_DESCRIPTOR = re.compile(r"^/proc/(self|thread-self|[0-9]+)(/task/[0-9]+)?/fd/[0-9]+$")


def _names_a_descriptor(path: Path) -> bool:
    """``path`` is, or links to, an open descriptor (/dev/stdout, /dev/fd/1, /proc/self/fd/1)."""
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on links followed
        head, tail = os.path.split(current)
        current = os.path.join(os.path.realpath(head), tail)
        if _DESCRIPTOR.match(current):
            return True
        if not os.path.islink(current):
            return False
        current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
    return False


# How long a write waits for a FIFO's reader to open it, and for a reader to take more data.
READER_WAIT_S = 30.0
STALL_S = 300.0

# FIFOs opened by output_file_problem while their reader was there, by (device, inode): the
# write uses that descriptor (closing it would have told the reader the data had ended)
_held: dict[tuple[int, int], int] = {}


def _hold(fd: int) -> None:
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    if key in _held:
        os.close(fd)
    else:
        _held[key] = fd


def _take_held(target: Path) -> int | None:
    try:
        st = os.stat(target)
    except OSError:
        return None
    return _held.pop((st.st_dev, st.st_ino), None)


_THROUGH_FLAGS = os.O_WRONLY | os.O_NONBLOCK | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)


def _open_through(target: Path, wait_s: float, clock, sleep) -> int:
    # no O_CREAT: if the node vanished since it was looked at, nothing is created in its place;
    # no O_TRUNC: it means nothing for a device or FIFO, and a regular file behind a descriptor
    # already holds what the command printed; O_NONBLOCK: a FIFO with no reader fails (ENXIO)
    # instead of waiting forever
    deadline = clock() + wait_s
    while True:
        try:
            return os.open(target, _THROUGH_FLAGS)
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
            if clock() >= deadline:
                raise OSError(
                    errno.ENXIO,
                    f"no process reads it (waited {wait_s:g} s for a reader)",
                    str(target),
                ) from None
        sleep(0.05)


def _write_through(
    target: Path,
    data: bytes,
    wait_s: float | None = None,
    stall_s: float | None = None,
    clock=time.monotonic,
    sleep=time.sleep,
) -> None:
    """Write ``data`` into a node or descriptor, never blocking for good: no reader within
    ``wait_s``, or a reader that takes nothing for ``stall_s``, raises an error saying so."""
    wait_s = READER_WAIT_S if wait_s is None else wait_s
    stall_s = STALL_S if stall_s is None else stall_s
    fd = _take_held(target)
    if fd is None:
        fd = _open_through(target, wait_s, clock, sleep)
    for stream in (sys.stdout, sys.stderr):  # what the command printed comes first
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    try:
        view = memoryview(data)
        deadline = clock() + stall_s
        while view:
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                remaining = deadline - clock()
                if remaining <= 0:
                    raise TimeoutError(
                        errno.ETIMEDOUT, f"its reader took nothing for {stall_s:g} s", str(target)
                    ) from None
                select.select([], [fd], [], min(remaining, 1.0))
                continue
            view = view[written:]
            deadline = clock() + stall_s
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
    say nothing for root, read-only mounts or /proc. A FIFO is opened without blocking: no
    reader is a problem; a reader that is there is held until the write (see above)."""
    raw = os.fspath(path)
    if isinstance(raw, bytes):
        raw = os.fsdecode(raw)
    if raw.endswith(("/", os.sep)) and raw.strip("/" + os.sep):  # Path() drops a trailing '/'
        return "ends in '/', which names a directory, not a file"
    path = Path(path)
    if raw == "" or path.name in ("", ".", ".."):
        return "not a file name"
    try:
        target, mode, through = _resolve(path)
    except OSError as e:  # a symlink loop, a component that is a file, a name too long
        if e.errno == errno.ENAMETOOLONG:
            return f"file name longer than {_name_max(path.parent)} bytes"
        return e.strerror or str(e)
    if mode is not None and stat.S_ISDIR(mode):
        return "is a directory"
    if mode is not None and stat.S_ISSOCK(mode):
        return "is a socket, not a file"
    if mode is not None and stat.S_ISFIFO(mode):
        try:
            _hold(os.open(target, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)))
        except OSError as e:
            if e.errno == errno.ENXIO:
                return "a FIFO that no process reads (start its reader first)"
            return e.strerror or str(e)
        return None
    if through:
        return None if os.access(target, os.W_OK) else "not writable"
    parent = target.parent
    if not parent.is_dir():
        return f"directory {str(parent)!r} does not exist (it is not created)"
    name_max = _name_max(parent)
    if len(os.fsencode(target.name)) > name_max:
        return f"file name longer than {name_max} bytes"
    return _probe(parent)


def directory_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` can neither be a directory nor be made one, from what exists: an empty
    name, a file, a symlink to nothing (making the directory would fail on the link), a
    symlink loop, a component that is a file. None if it is a directory or can be created.
    Nothing is created or opened: readers of the results store ask this too."""
    return _nearest_directory(path)[1]


def _nearest_directory(path: str | os.PathLike) -> tuple[Path | None, str | None]:
    """``path`` or its nearest existing ancestor, which must be a directory; or why not."""
    raw = os.fspath(path)
    if raw in ("", b""):
        return None, "not a directory name (empty)"
    current = Path(raw)
    while True:
        try:
            mode = os.stat(current).st_mode
        except OSError as e:
            if e.errno == errno.ELOOP:
                return None, f"{str(current)!r}: a symbolic link loop"
            if e.errno == errno.ENAMETOOLONG:
                return None, "a directory name is too long"
            if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                return None, e.strerror or str(e)
            if os.path.islink(current):
                return None, (
                    f"{str(current)!r} is a symbolic link to {os.readlink(current)!r}, "
                    f"which does not exist"
                )
            if current.parent == current:
                return None, "no part of it exists"
            current = current.parent
            continue
        if not stat.S_ISDIR(mode):
            if current == Path(raw):
                return None, "exists and is not a directory"
            return None, f"{str(current)!r} is not a directory"
        return current, None


def output_dir_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be used as an output directory; None if it can. A missing directory
    is created by the writer, so its nearest existing ancestor must be a writable directory."""
    existing, problem = _nearest_directory(path)
    if problem or existing is None:
        return problem or "no part of it exists"
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
