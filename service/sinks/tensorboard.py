"""The tensorboard sink: a train run's metrics and samples as TensorBoard event files
(docs/design/sinks.md, "Metrics sinks", "TensorBoard").

Each run gets a folder, `<root>/<experiment>/<run id>/`, where root is the plan's
`tensorboard_dir` or the data dir's tensorboard/; point `tensorboard --logdir` at the root
and the runs appear by experiment. The files are written with `tensorboard.compat.proto` and
`RecordWriter` into a plain file, without TensorFlow or torch: this runs in the API process.
No link is followed on the way to the file (`store.files`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
from tensorboard.compat.proto.types_pb2 import DT_STRING
from tensorboard.summary.writer.record_writer import RecordWriter

from trainctl.service.sinks.base import SinkRefused, SinkUnavailable, sample_tag, scalars
from trainctl.store.db.records import Event, Run
from trainctl.store.files import create_file_at, make_folder_at, open_folder

FILE_VERSION = "brain.Event:2"
"""The first record of every event file: the format version TensorBoard expects."""
_TEXT = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text")
)


@dataclass
class _EventFile:
    file: IO[bytes]
    records: RecordWriter


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, default_root: Path, allowed_roots: Sequence[Path]) -> None:
        """`default_root`: where runs without a `tensorboard_dir` go; a plan's folder must still
        lie inside `allowed_roots` (the data roots) when the file is opened."""
        self.default_root = default_root
        self.allowed_roots = [Path(os.path.realpath(r)) for r in allowed_roots]
        self._files: dict[str, _EventFile] = {}

    def folder(self, run: Run) -> Path:
        root = run.spec.get("tensorboard_dir") or self.default_root
        return Path(root) / run.experiment / run.id

    def write(self, run: Run, events: Sequence[Event], memo: dict[str, Any]) -> None:
        records = [record for event in events for record in _records(run, event)]
        if not records:
            return
        try:
            out = self._open(run)
            for record in records:
                out.records.write(record)
            out.file.flush()
            # On disk before the cursor moves past these events: a crash then cannot lose them.
            os.fsync(out.file.fileno())
        except OSError as exc:
            # A half-written record would hide the rest of the file: start a new one next time.
            self._close(run.id)
            raise SinkUnavailable(f"cannot write {self.folder(run)}: {exc}") from exc

    def finish(self, run: Run, memo: dict[str, Any]) -> None:
        self._close(run.id)

    def close(self) -> None:
        for run_id in list(self._files):
            self._close(run_id)

    def _open(self, run: Run) -> _EventFile:
        if run.id in self._files:
            return self._files[run.id]
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{uuid.uuid4().hex[:8]}"
        )
        folder = self._run_folder(run)
        try:
            fd = create_file_at(folder, name)
        finally:
            os.close(folder)
        file = os.fdopen(fd, "wb")  # kept open across batches
        out = _EventFile(file, RecordWriter(file))
        header = event_pb2.Event(wall_time=time.time(), file_version=FILE_VERSION)
        out.records.write(header.SerializeToString())
        self._files[run.id] = out
        return out

    def _run_folder(self, run: Run) -> int:
        """A descriptor of `<root>/<experiment>/<run id>`, made as needed, reached through no
        link; SinkRefused when the way holds one (or leaves the data roots)."""
        root = run.spec.get("tensorboard_dir")
        real = Path(os.path.realpath(root or self.default_root))
        if root is not None and not any(real.is_relative_to(r) for r in self.allowed_roots):
            raise SinkRefused(
                f"tensorboard_dir {root} is no longer inside the data roots (TRAINCTL_DATA_ROOTS)"
            )
        real.mkdir(parents=True, exist_ok=True)
        fd = -1
        try:
            fd = open_folder(real)  # its real path: a link swapped in since is refused
            for name in (run.experiment, run.id):
                inner = make_folder_at(fd, name)
                os.close(fd)
                fd = inner
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise SinkRefused(
                f"cannot write {self.folder(run)}: a link or a file stands on the way "
                "(the tensorboard sink writes only into real folders)"
            ) from None
        return fd

    def _close(self, run_id: str) -> None:
        out = self._files.pop(run_id, None)
        if out is not None:
            # A file that failed to write may fail to close too; the next open starts another.
            with contextlib.suppress(OSError):
                out.file.close()


def _records(run: Run, event: Event) -> list[bytes]:
    """The event's records: a scalar summary per metric, a text summary per sample."""
    wall_time = event.created_at.timestamp()
    data = event.data
    if event.type == "metrics":
        values = [
            summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in scalars(data)
        ]
    elif event.type == "sample" and isinstance(data.get("step"), int) and "prompt" in data:
        text = f"{data['prompt']}{data.get('completion') or ''}"
        values = [
            summary_pb2.Summary.Value(
                tag=sample_tag(run, data["prompt"]), metadata=_TEXT, tensor=_string(text)
            )
        ]
    else:
        return []
    if not values:
        return []
    summary = summary_pb2.Summary(value=values)
    record = event_pb2.Event(wall_time=wall_time, step=data["step"], summary=summary)
    return [record.SerializeToString()]


def _string(text: str) -> tensor_pb2.TensorProto:
    """A scalar string tensor, what TensorBoard's text plugin reads."""
    return tensor_pb2.TensorProto(
        dtype=DT_STRING,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(),
        string_val=[text.encode()],
    )
