"""The service's logging: JSON lines for log collectors, readable lines for a person.

When stderr is a terminal, a person is reading: `12:00:01 INFO trainctl.http GET /runs 200`.
Otherwise (a container, systemd, a file), every record is one JSON object that log pipelines
parse without regexes. Either way a record carries the request id of the request it happened
in, and the run id where one applies, so one grep follows a request or a run.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

REQUEST_ID: ContextVar[str | None] = ContextVar("trainctl_request_id", default=None)
# Fields that a record may carry through `extra=`, copied into the JSON object when present.
CONTEXT_FIELDS = ("request_id", "run_id", "method", "path", "status", "duration_ms", "client")
# color_message: uvicorn's ANSI-coloured copy of the message, noise in a JSON line.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "color_message"}
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


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and value is not None and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class HumanFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s%(context)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        ids = [f"{k}={getattr(record, k)}" for k in ("run_id", "request_id")]
        record.context = "".join(f" [{i}]" for i in ids if not i.endswith("=None"))
        return super().format(record)


def configure_logging(stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Route every logger (ours, uvicorn's) through one handler on `stream` (stderr)."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(HumanFormatter() if stream.isatty() else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
