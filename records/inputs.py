"""Reading a file a user named: one function, bounded in size, never blocking.

Every input file a command reads (a result file or a store's runs for the gate, a platform
profile for ``repro plan --platform`` or ``--param calibration=FILE``) is read by
:func:`read_input`. It refuses, without reading anything, what is not a regular file (a FIFO, a
device such as /dev/zero, a socket, a directory where a file is expected) and a file larger than
its cap; the one pipe read is standard input, where a command offers ``-`` for it. A FIFO is
opened with O_NONBLOCK, so opening one that has no writer returns at once, and ``fstat`` on the
open descriptor decides (no window between a check and the open).
"""

from __future__ import annotations

import errno
import os
import stat
import sys

MIB = 1024 * 1024
# Caps, generous against what the harness writes: a result file of the largest suite grid is a
# few MiB; a platform profile a few KiB.
RESULT_LIMIT = 256 * MIB
PLATFORM_LIMIT = 1 * MIB
STDIN = "-"

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class InputError(ValueError):
    """An input file that cannot be read as one (missing, not regular, too large); names it."""

    def __init__(self, path, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{self.path}: {reason}")


def _kind(mode: int) -> str:
    return next((word for test, word in _KINDS if test(mode)), "not a regular file")


def _size(limit: int) -> str:
    return f"{limit // MIB} MiB" if limit % MIB == 0 else f"{limit} bytes"


def read_input(path: str | os.PathLike, limit: int, stdin_ok: bool = False) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; InputError otherwise.
    ``stdin_ok``: ``-`` reads standard input (to its end, within the same limit)."""
    if stdin_ok and str(path) == STDIN:
        if sys.stdin is None:  # started with standard input closed
            raise InputError("<stdin>", "standard input is closed")
        try:
            data = sys.stdin.buffer.read(limit + 1)
        except (OSError, ValueError) as e:  # closed underneath us (EBADF, a closed file)
            raise InputError(
                "<stdin>", f"cannot read ({getattr(e, 'strerror', None) or e})"
            ) from None
        if len(data) > limit:
            raise InputError("<stdin>", f"more than {_size(limit)}: refused")
        return data
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except OSError as e:
        if e.errno == errno.ENXIO:  # a socket (or a device with nothing behind it)
            try:
                what = _kind(os.stat(path).st_mode)
            except OSError:
                what = "not a regular file"
            raise InputError(path, f"{what}, not a regular file: refused unread") from None
        raise InputError(path, f"cannot read ({e.strerror or e})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(path, f"{_kind(info.st_mode)}, not a regular file: refused unread")
        if info.st_size > limit:
            raise InputError(
                path,
                f"{info.st_size} bytes, larger than the {_size(limit)} "
                "an input may be: refused unread",
            )
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while total <= limit:  # a file that grows while read is still cut at the cap
            chunk = os.read(fd, min(limit + 1 - total, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise InputError(path, f"larger than the {_size(limit)} an input may be: refused")
        return b"".join(chunks)
    except OSError as e:
        raise InputError(path, f"cannot read ({e.strerror or e})") from None
    finally:
        os.close(fd)
