"""Ctrl-C in the CLI's long commands, handled by a SIGINT handler instead of KeyboardInterrupt.

A KeyboardInterrupt is raised wherever the main thread happens to be. Inside Rich's live
displays it can land between a lock's acquire and the `try` that releases it; the display's
exit then waits forever for its refresh thread, which waits for that lock: a command that
ignores Ctrl-C. So a command with a live display says what Ctrl-C does instead, one of:

- `exit_on_interrupt`: nothing needs cleaning up (a watched run is the service's; a download
  keeps the files it finished and its `.part` files, which the same command resumes); write the
  error line and exit 130 at once.
- `stop_on_interrupt`: the work has something to undo (a prepare removes what it wrote); ask it
  to stop through the `should_stop` it polls, and let it unwind.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from trainctl.service.cli.errors import EXIT_INTERRUPTED

_SHOW_CURSOR = "\x1b[?25h"  # Rich hides the cursor while a display is live


@contextmanager
def exit_on_interrupt(message: str) -> Iterator[None]:
    """Ctrl-C writes `error: <message>` and exits 130 at once."""

    def stop(signum: int, frame: FrameType | None) -> None:
        _write(f"error: {message}\n")
        os._exit(EXIT_INTERRUPTED)

    with _handling_sigint(stop):
        yield


@contextmanager
def stop_on_interrupt(what: str) -> Iterator[Callable[[], bool]]:
    """Yields `should_stop`, true once Ctrl-C was pressed; the first press says that `what`
    is stopping, later ones are ignored so that its cleaning up is not cut short."""
    pressed: list[bool] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        if not pressed:
            _write(f"stopping {what} (Ctrl-C); removing what it wrote\n")
        pressed.append(True)

    with _handling_sigint(stop):
        yield lambda: bool(pressed)


@contextmanager
def _handling_sigint(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # a command run off the main thread (a test's runner) gets no signals to handle
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _write(line: str) -> None:
    os.write(sys.stderr.fileno(), ((_SHOW_CURSOR if sys.stderr.isatty() else "") + line).encode())
