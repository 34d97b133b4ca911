"""Where a run's inner loops stop: one check, `maybe_stop`, that every loop of every kind calls
per unit of its work (a batch scored, a token generated, a step timed, a tensor exported), so
that a cancel, a drain or a lost lease stops any kind within one such unit
(docs/design/runs.md, "Runs", "Cancel").

`execute` (worker/kinds/registry.py) runs each executor inside `stoppable(ctx.should_stop)`,
whatever its kind, a plug-in's included, and turns the `RunStopped` that `maybe_stop` raises
into the stopped outcome (cancelled, requeued or abandoned). The loops themselves take no run
context: the scorer, validation, generation and the export are the same functions the tests
and the CLI call, where nothing is stoppable and `maybe_stop` does nothing. The check lives in
a context variable, so only the thread that executes the run sees it (not the reporter or a
save's thread), and a rank of a multi-process run, which must stop only where the other ranks
agree, never raises it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from trainctl.worker.exceptions import RunStopped

_SHOULD_STOP: ContextVar[Callable[[], bool] | None] = ContextVar(
    "trainctl_should_stop", default=None
)


@contextmanager
def stoppable(should_stop: Callable[[], bool]) -> Iterator[None]:
    """Within it, `maybe_stop` raises `RunStopped` once `should_stop()` is true."""
    token = _SHOULD_STOP.set(should_stop)
    try:
        yield
    finally:
        _SHOULD_STOP.reset(token)


def maybe_stop() -> None:
    """Raise `RunStopped` if the run this thread executes has been asked to stop; cheap (the
    run's cancel flag is refreshed by its reporter thread), so call it per unit of work."""
    should_stop = _SHOULD_STOP.get()
    if should_stop is not None and should_stop():
        raise RunStopped("the run was asked to stop")
