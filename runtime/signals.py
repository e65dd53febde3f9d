"""Signals at any moment of a run.

- SIGTERM and SIGHUP (a scheduler ending the job, a closed terminal) end a command the way
  Ctrl-C does: :class:`Interrupted` is raised in the main thread, commands keep the results that
  finished (stored with ``interrupted: true``), and the process exits with 128 + the signal.
- No Python handler ever runs in a child forked to start a rank: a ``preexec_fn`` runs Python
  code between fork and exec, and a signal that lands there would run the parent's handler in
  the child (the parent never sees it: issue 33 saw SIGTERM lost while ranks were spawning).
  So the parent blocks these signals around each fork (:func:`deferred`); the child restores the
  default dispositions and only then unblocks (:func:`in_child_after_fork`); a signal sent to
  the parent meanwhile stays pending and is delivered to it once the fork returns.
- Cleanup that must not be cut short (killing rank groups, removing a work directory, storing
  finished records) runs under :func:`deferred` too.
"""

from __future__ import annotations

import contextlib
import signal
import threading

ENDING = (signal.SIGTERM, signal.SIGHUP)  # raise Interrupted
HANDLED = (signal.SIGINT, *ENDING)  # every signal a Python handler of ours (or Python's) catches


class Interrupted(SystemExit):
    """SIGTERM or SIGHUP, raised in the main thread. Uncaught, the process exits 128 + signal
    (no traceback: it is a SystemExit); commands catch it beside KeyboardInterrupt."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return name_of(self.signum)


def name_of(signum: int) -> str:
    """SIGTERM for 15."""
    return signal.Signals(signum).name


_RECEIVED: list[int] = []  # the ending signals this process has received, in order


def received() -> int | None:
    """The first ending signal (SIGINT, SIGTERM, SIGHUP) received since :func:`install`, or
    None. A library that catches every exception can turn the KeyboardInterrupt or Interrupted
    raised in it into its own error (pydantic wraps it in a SchemaError while it builds a
    model); the CLI asks here so that the run still ends as interrupted, 128 + signal."""
    return _RECEIVED[0] if _RECEIVED else None


def _raise_interrupted(signum, frame):
    _RECEIVED.append(signum)
    raise Interrupted(signum)


def _raise_keyboard_interrupt(signum, frame):
    _RECEIVED.append(signum)
    signal.default_int_handler(signum, frame)


def install() -> dict:
    """Make SIGTERM and SIGHUP raise :class:`Interrupted` and SIGINT KeyboardInterrupt, each
    noting the signal for :func:`received`; returns the previous handlers (for
    :func:`restore`). Only the main thread may set handlers; elsewhere nothing changes. A signal
    the process was told to ignore (nohup) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    if signal.getsignal(signal.SIGTERM) is not _raise_interrupted:
        _RECEIVED.clear()  # the outermost install (a nested one, e.g. run_ranks's, keeps them)
    previous = {}
    for sig in ENDING:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, _raise_interrupted)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    return previous


def restore(previous: dict) -> None:
    for sig, old in previous.items():
        signal.signal(sig, old)


@contextlib.contextmanager
def deferred():
    """SIGINT, SIGTERM and SIGHUP wait while the block runs; one that arrives meanwhile reaches
    its handler (which raises) when the block ends.

    Two mechanisms, because a signal sent to the process goes to any thread that does not block
    it: this thread blocks them (so a child forked here starts with them blocked and runs no
    handler: :func:`in_child_after_fork`), and in the main thread the Python handlers are
    swapped for one that only notes the signal (another thread, such as a result reader, may be
    the one the kernel picks); on leaving, the handlers come back, this thread's blocked signals
    are delivered to them, and the noted ones are raised again."""
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    noted: list[int] = []
    swapped = {}
    if threading.current_thread() is threading.main_thread():
        for sig in HANDLED:
            if callable(signal.getsignal(sig)):
                swapped[sig] = signal.signal(sig, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        for sig, handler in swapped.items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        for sig in dict.fromkeys(noted):
            signal.raise_signal(sig)


def in_child_after_fork(before_unblocking=None) -> None:
    """In a child between fork and exec, forked under :func:`deferred`: default dispositions
    for the signals Python would handle, ``before_unblocking()`` (e.g. the parent-death
    signal), then unblock them (exec keeps the mask)."""
    for sig in HANDLED:
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (ValueError, OSError):
            pass
    if before_unblocking is not None:
        before_unblocking()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
