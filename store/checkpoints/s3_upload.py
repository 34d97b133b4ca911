"""Writing to an S3 storage (docs/design/checkpoints.md, "Object storage"): a stage's files go up
as they are written, under the stage's own generation; the manifest is held back, since its
upload is the commit (`S3Storage.commit`).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainctl.store.checkpoints.manifests import MANIFEST_FILE
from trainctl.store.exceptions import StorageUnavailable
from trainctl.store.names import validate_name

if TYPE_CHECKING:
    from trainctl.store.checkpoints.s3 import S3Storage


class S3Sink:
    """A file uploaded as it is written: one PUT when it stays under a part, else a multipart
    upload whose parts go up in parallel on the storage's pool, a few in memory at most."""

    def __init__(self, storage: S3Storage, key: str) -> None:
        self.storage, self.key = storage, key
        self.buffer = bytearray()
        self.closed = False
        self.upload_id: str | None = None
        self.parts: list[Future[str]] = []
        self.in_flight = threading.BoundedSemaphore(2 * storage.max_concurrency)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self.closed:
            raise ValueError("write to a closed file")
        view = memoryview(data).cast("B")
        self.buffer += view  # a copy: the caller may reuse its buffer
        while len(self.buffer) >= self.storage.part_bytes:
            self._send(bytes(self.buffer[: self.storage.part_bytes]))
            del self.buffer[: self.storage.part_bytes]
        return view.nbytes

    def _send(self, chunk: bytes) -> None:
        s = self.storage
        if self.upload_id is None:
            made = s.call("create_multipart_upload", self.key, Bucket=s.bucket, Key=self.key)
            self.upload_id = made["UploadId"]
        failed = next((f for f in self.parts if f.done() and f.exception()), None)
        if failed is not None:
            failed.result()  # a part that failed fails the write, not only the close
        self.in_flight.acquire()
        self.parts.append(s.pool.submit(self._upload_part, len(self.parts) + 1, chunk))

    def _upload_part(self, number: int, chunk: bytes) -> str:
        try:
            done = self.storage.call(
                "upload_part", self.key, Bucket=self.storage.bucket, Key=self.key,
                PartNumber=number, UploadId=self.upload_id, Body=chunk,
            )  # fmt: skip
            return str(done["ETag"])
        finally:
            self.in_flight.release()

    def close(self) -> None:
        if self.closed:
            return
        s = self.storage
        if self.upload_id is None:
            s.call("put_object", self.key, Bucket=s.bucket, Key=self.key, Body=bytes(self.buffer))
        else:
            if self.buffer:
                self._send(bytes(self.buffer))
            parts = [{"ETag": f.result(), "PartNumber": n} for n, f in enumerate(self.parts, 1)]
            s.call(
                "complete_multipart_upload", self.key, Bucket=s.bucket, Key=self.key,
                UploadId=self.upload_id, MultipartUpload={"Parts": parts},
            )  # fmt: skip
        self.buffer = bytearray()
        self.closed = True

    def abort(self) -> None:
        """Give up an unfinished multipart upload (its parts would be billed, unseen)."""
        for part in self.parts:
            part.exception()  # wait: a part still going up would outlive the abort
        if self.upload_id is not None and not self.closed:
            with contextlib.suppress(StorageUnavailable, FileNotFoundError):
                self.storage.call(
                    "abort_multipart_upload", self.key, Bucket=self.storage.bucket,
                    Key=self.key, UploadId=self.upload_id,
                )  # fmt: skip
        self.closed = True


class ManifestSink:
    """The manifest is held back: its upload is the commit."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        self.data += view
        return view.nbytes

    def close(self) -> None:
        self.closed = True


@dataclass
class S3Stage:
    storage: S3Storage
    experiment: str
    tag: str
    generation: str = field(default_factory=lambda: uuid.uuid4().hex)
    sinks: dict[str, S3Sink | ManifestSink] = field(default_factory=dict)
    owner: bool = True
    """False for a stage another process made (`S3Storage.join`): it only adds files."""

    @property
    def key(self) -> str:
        return self.generation

    def create(self, name: str) -> S3Sink | ManifestSink:
        validate_name("file", name)
        if name in self.sinks:
            raise FileExistsError(self.storage.describe(self.experiment, self.tag, name))
        if name == MANIFEST_FILE:
            sink: S3Sink | ManifestSink = ManifestSink()
        else:
            sink = S3Sink(self.storage, self.storage.file_key(self, name))
        self.sinks[name] = sink
        return sink

    def commit(self, *, replace: bool = True) -> None:
        if not self.owner:
            raise RuntimeError(
                f"{self.storage.describe(self.experiment, self.tag)}: only the process that "
                "made a stage commits it"
            )
        assert all(s.closed for s in self.sinks.values()), "commit before every file was closed"
        manifest = self.sinks.get(MANIFEST_FILE)
        assert manifest is None or isinstance(manifest, ManifestSink)
        try:
            self.storage.commit(self, None if manifest is None else bytes(manifest.data), replace)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        for sink in self.sinks.values():
            if isinstance(sink, S3Sink):
                sink.abort()
        if not self.owner:  # the generation is its owner's to remove
            self.storage.forget(self)
            return
        self.storage.remove_generation(self.experiment, self.tag, self.generation)
        self.storage.forget(self)
