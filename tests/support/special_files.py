"""What others can plant in a shared folder, made for real: FIFOs, sockets, hardlinks and link
loops; and a way to call what might block on one without hanging the test run."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
# A FIFO opened for reading waits for a writer for ever: a call still blocked after this long
# has blocked, whatever the machine's load (a non-blocking call returns in milliseconds).
BLOCKED_AFTER_SECONDS = 60.0


def plant(path: Path, kind: str, target: Path | None = None) -> None:
    """Replace whatever is at `path` by a `kind`: "fifo", "socket", or "hardlink" to `target`
    (a file elsewhere), or "symlink" to `target`."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        bind_socket(path)
    elif kind == "hardlink":
        assert target is not None
        os.link(target, path)
    elif kind == "symlink":
        assert target is not None
        os.symlink(target, path)
    else:
        raise ValueError(kind)


def bind_socket(path: Path) -> None:
    """A socket file at `path`, whatever the length of its folder's name: an AF_UNIX address
    holds at most 108 bytes, which a pytest temp folder under an xdist worker outgrows. The
    socket is bound through the folder's descriptor (`/proc/self/fd/N/name`), which is short.
    The file stays after the socket is closed."""
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(f"/proc/self/fd/{folder}/{path.name}")
    finally:
        os.close(folder)


def self_loops(folder: Path, *names: str) -> None:
    """Links to the folder they are in (`a -> .`): a walk that follows links never ends."""
    for name in names:
        os.symlink(".", folder / name)


def without_blocking(call: Callable[[], T], what: str) -> T:
    """What `call()` returns (or raises), called in a thread; a test failure, not a hang,
    when it is still blocked after BLOCKED_AFTER_SECONDS (the thread is left behind)."""
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the test below
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name=f"blocking? {what}", daemon=True)
    thread.start()
    thread.join(BLOCKED_AFTER_SECONDS)
    assert outcome, f"{what} blocked (still waiting after {BLOCKED_AFTER_SECONDS:.0f} s)"
    ok, value = outcome[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]
