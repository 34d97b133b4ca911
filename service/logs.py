"""The service's logging: the shared formats (store/logs.py) with request ids.

Every record carries the id of the request it happened in (set by the request middleware),
and each exception's traceback is written once.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import TextIO

from trainctl.store import logs as shared

REQUEST_ID: ContextVar[str | None] = ContextVar("trainctl_request_id", default=None)
# Marks an exception whose traceback is written. Starlette re-raises an error after its 500
# handler logged it (with the request id), so that servers can log it; uvicorn would write
# the same traceback again, without the id.
_LOGGED = "_trainctl_traceback_logged"


class ContextFilter(logging.Filter):
    """Stamps each record with the current request's id (set by the request middleware), and
    drops a record whose exception's traceback was written already: each traceback once."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            if getattr(exc, _LOGGED, False):
                return False
            setattr(exc, _LOGGED, True)
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        return True


def configure_logging(stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Route every logger (ours, uvicorn's) through one handler on `stream` (stderr)."""
    shared.configure_logging(stream, level, filters=[ContextFilter()])
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
