"""Log formats every trainctl process writes: JSON lines for log collectors, readable lines
for a person.

When stderr is a terminal, a person is reading: `12:00:01 INFO trainctl.http GET /runs 200`.
Otherwise (a container, systemd, a worker's log file), every record is one JSON object that
log pipelines parse without regexes. Records carry the ids that apply (the request's in the
service, the run's in the service and the workers), so one grep follows a request or a run
across the API and the worker that ran it. Here, torch-free and FastAPI-free, because both
the service and the workers use it.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

# color_message: uvicorn's ANSI-coloured copy of the message, noise in a JSON line.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "color_message"}


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
        ids = [(k, getattr(record, k, None)) for k in ("run_id", "request_id")]
        record.context = "".join(f" [{k}={v}]" for k, v in ids if v is not None)
        return super().format(record)


def configure_logging(
    stream: TextIO | None = None,
    level: int = logging.INFO,
    filters: Iterable[logging.Filter] = (),
) -> logging.Handler:
    """Route every logger through one handler on `stream` (stderr), after `filters`."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    for f in filters:
        handler.addFilter(f)
    handler.setFormatter(HumanFormatter() if stream.isatty() else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    return handler
