"""The ``repro`` console script: signal handlers first, then the command line.

Importing the CLI (click, the results schema, every subcommand module) takes a noticeable
moment after the process starts. A signal in that moment must end it as one during a command
does: one line on stderr and exit 128 + signal (130 for Ctrl-C), never a traceback or a death
by the signal. So this module imports only runtime/signals.py (the standard library alone) and
installs its handlers before it imports anything else.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from moe_repro.runtime import signals

    signals.install()  # the CLI's own install nests inside these handlers
    try:
        from moe_repro.cli import main as cli_main

        cli_main(argv)
    except signals.Interrupted as e:  # the CLI ends its own interruptions with a plain SystemExit
        _leave(f"repro: interrupted by {e.signal_name} during start-up", e.code)
    except KeyboardInterrupt:
        _leave("repro: interrupted during start-up", 130)


def _leave(line: str, code: int) -> None:
    import signal

    from moe_repro.runtime.signals import HANDLED

    for sig in HANDLED:  # a second signal must not cut the one line short
        signal.signal(sig, signal.SIG_IGN)
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    sys.exit(code)
