"""The worker's logging: the shared formats (store/logs.py), every record stamped with the
id of the run being executed, so a worker's log file (JSON when it is not a terminal) joins
the service's log on `run_id`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from trainctl.store import logs as shared


class RunIdFilter(logging.Filter):
    """Stamps records with the current run's id. A plain attribute, not a context variable:
    the run's heartbeat and checkpoint threads log for the same run."""

    def __init__(self) -> None:
        super().__init__()
        self.run_id: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "run_id", None) is None:
            record.run_id = self.run_id
        return True


RUN_ID = RunIdFilter()


@contextmanager
def running(run_id: str) -> Iterator[None]:
    """Stamp what is logged meanwhile with `run_id`."""
    RUN_ID.run_id = run_id
    try:
        yield
    finally:
        RUN_ID.run_id = None


def configure_logging(stream: TextIO | None = None, level: int = logging.INFO) -> None:
    shared.configure_logging(stream, level, filters=[RUN_ID])
