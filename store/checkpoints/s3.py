"""A storage in an S3-compatible bucket (docs/design/checkpoints.md, "Checkpoint store", "Object
storage"): the third implementation of the seam, for nodes that share no disk.

An object store has no rename, so the commit protocol is kept with the manifest as the
commit marker. Keys under ``<prefix>/<experiment>/``:

```
.experiment                    written at the first stage: the experiment exists
<tag>/manifest.json            the commit marker: a line naming the generation of the
                               files it lists and the commit time, then the store's
                               manifest; written last, one PUT, so it is atomic
<tag>/.<generation>/<name>     the files of one save, never overwritten
```

A commit is read from the objects and their keys alone: user metadata (x-amz-meta-*) is not
kept alike by S3-compatible stores (rclone keeps it in memory only), so the generation is in
the marker's body, not its metadata; a marker of the first layout (the manifest alone, the
generation in its metadata) is still read. What the bucket says is checked as a request is:
a generation that is not one of ours makes its entry incomplete, never a local path.

A stage uploads its files under a new generation (multipart and in parallel for large ones),
then PUTs the manifest, which swaps the tag to that generation at once, then removes the
generation the manifest named before. Listings see only tags whose manifest exists; a delete
removes the manifest first, so a half-deleted entry is never listed. A generation that no
manifest names is what a killed save left: the next commit in the experiment sweeps those
older than `stale_after` (a save of another process may still be uploading a younger one),
and `cleanup` sweeps them with unfinished multipart uploads (this process's at once).

Reading downloads a file into a local cache (`cache_dir`, `s3_cache.DownloadCache`), keyed
by generation, checked against the manifest, the least recently used evicted past
`max_cache_bytes` in all the cache dir's stores together (TRAINCTL_CACHE_BYTES).

The guard is a lease per experiment in the run database (`store.db.guards`), taken under a
lock of this process; a storage opened without the database (a tool, a test) has the lock
alone, and docs/design/checkpoints.md, "Object storage", "The guard", says what that leaves
unsafe across processes.

Credentials come from the AWS environment or profile (boto3's chain), the server from
`AWS_ENDPOINT_URL`; errors name the bucket and what to check, never a credential.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from trainctl.store.checkpoints.manifests import MANIFEST_FILE
from trainctl.store.checkpoints.s3_cache import CachedReader, DownloadCache, listed
from trainctl.store.checkpoints.s3_upload import S3Stage
from trainctl.store.checkpoints.storage import Complete
from trainctl.store.exceptions import StorageUnavailable
from trainctl.store.layout import CACHE_BYTES
from trainctl.store.names import validate_name

if TYPE_CHECKING:
    from trainctl.store.db.guards import GuardLeases

logger = logging.getLogger(__name__)

SCHEME = "s3://"
EXPERIMENT_MARKER = ".experiment"
GENERATION_META = "trainctl-generation"
COMMITTED_META = "trainctl-committed-at"
"""The first layout's user metadata of a manifest, still read (`_stamp`), no longer written."""
COMMIT_LINE = b"trainctl-commit 1 "
"""How a commit marker starts: then the generation, the commit time, a newline, and the
store's manifest (`_commit_body`)."""
GENERATION = re.compile(r"[0-9a-f]{32}")
"""A generation, as a stage names one (uuid4().hex): the only form read back from a bucket."""
NO_SAVE = (
    "its manifest names no save of ours (no generation, or one that is no 32 hex digits: "
    "planted, or of the first layout on a server that lost its metadata)"
)
PART_BYTES = 8 * 1024 * 1024
"""Multipart part size: S3's floor is 5 MiB, and 8 MiB is what the AWS CLI uses."""
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
"""A manifest object larger than this is not ours (the store reads 4 MiB of it at most)."""
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_EXISTS = {"412", "PreconditionFailed"}
_NO_UPLOAD = {"NoSuchUpload"}
"""rclone answers ListMultipartUploads so when none is in progress (AWS: an empty list)."""
_REFUSED = {
    "403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled",
    "InvalidToken", "ExpiredToken", "AccountProblem",
}  # fmt: skip


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` → (bucket, prefix without slashes at either end)."""
    if not url.startswith(SCHEME) or not url[len(SCHEME) :].split("/", 1)[0]:
        raise ValueError(f"storage URL {url!r}: expected s3://bucket or s3://bucket/prefix")
    bucket, _, prefix = url[len(SCHEME) :].partition("/")
    return bucket, prefix.strip("/")


@dataclass(frozen=True)
class Timeouts:
    """How long one request to the bucket may take: `connect` and `read` seconds (a read:
    any wait for the next bytes of an answer), `attempts` tries in all. A frozen or
    unreachable server is then a StorageUnavailable after at most about
    attempts x (connect + read) seconds, never a wait as long as the outage."""

    connect: float
    read: float
    attempts: int


SERVICE_TIMEOUTS = Timeouts(connect=2.0, read=4.0, attempts=2)
"""The service's: a request waits for the bucket a few seconds at most, then answers 503
naming it; its calls are small (listings, manifests) or streamed."""
WORKER_TIMEOUTS = Timeouts(connect=5.0, read=30.0, attempts=5)
"""A worker's and a tool's: a save's parts and the completion of a large multipart upload
may take the server longer to answer, and a retry costs no user a wait."""


def build_client(timeouts: Timeouts = WORKER_TIMEOUTS) -> Any:
    """A boto3 S3 client from the standard AWS chain (environment, profile, instance role)
    and `AWS_ENDPOINT_URL`, every request bounded by `timeouts`. Imported here: only a node
    with an S3 storage needs boto3."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=timeouts.connect,
        read_timeout=timeouts.read,
        retries={"total_max_attempts": timeouts.attempts, "mode": "standard"},
        max_pool_connections=32,
        # presigned URLs (`url`) in SigV4 as every request is: botocore presigns S3 in the
        # deprecated SigV2 otherwise, which AWS's newer regions refuse
        signature_version="s3v4",
        # the checksums boto3 1.36 sends by default are not every S3-compatible server's
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client("s3", config=config)


class ManifestReader(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.size = len(data)
        self.local_path: str | None = None


@dataclass
class _Committed:
    """A tag's manifest as read: its bytes, generation and commit time."""

    data: bytes
    generation: str
    committed_at: float


class S3Storage:
    """Entries in a bucket under `prefix`; files read through a cache in `cache_dir`."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        *,
        cache_dir: Path,
        client: Any = None,
        clock: Callable[[], float] = time.time,
        stale_after: float = 3600.0,
        max_cache_bytes: int = CACHE_BYTES,
        part_bytes: int = PART_BYTES,
        max_concurrency: int = 8,
        leases: GuardLeases | None = None,
    ) -> None:
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.client = client if client is not None else build_client()
        self.clock = clock
        self.stale_after = stale_after
        self.part_bytes, self.max_concurrency = part_bytes, max_concurrency
        place = f"{self.client.meta.endpoint_url}|{bucket}|{self.prefix}"
        self.cache = DownloadCache(Path(cache_dir), place, max_cache_bytes)
        self.pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="trainctl-s3")
        self._lock = threading.RLock()  # this process's commits and deletes, and `reading`
        self._guards: dict[str, threading.RLock] = {}
        self._held: dict[str, tuple[int, Callable[[], None] | None]] = {}  # guard depth, release
        self.leases = leases
        self._live: set[tuple[str, str]] = set()  # (experiment, generation) being staged here
        self._pins = threading.local()

    # --- keys, words and errors ---

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def file_key(self, stage: S3Stage, name: str) -> str:
        return self.key(stage.experiment, stage.tag, "." + stage.generation, name)

    def describe(
        self, experiment: str | None = None, tag: str | None = None, name: str | None = None
    ) -> str:
        parts = []
        for part in (experiment, tag, name):
            if part is None:
                break
            parts.append(part)
        return f"{SCHEME}{self.bucket}/{self.key(*parts)}".rstrip("/")

    def call(self, method: str, key: str, **kwargs: Any) -> Any:
        """One S3 request: a missing key is FileNotFoundError; a refusal or an unreachable
        server is StorageUnavailable naming the bucket (the server's text is left out: it
        is the credentials' business, and no message of ours carries them)."""
        from botocore.exceptions import BotoCoreError, ClientError

        where = f"{SCHEME}{self.bucket}/{key}"
        try:
            return getattr(self.client, method)(**kwargs)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", "?"))
            if code in _NOT_FOUND:
                raise FileNotFoundError(f"{where}: no such object") from None
            if code in _NO_UPLOAD:
                raise FileNotFoundError(f"{where}: no such multipart upload") from None
            if code in _EXISTS:  # only a conditional write is refused so (`commit`)
                raise FileExistsError(f"{where}: written by another process first") from None
            if code == "NoSuchBucket":
                raise StorageUnavailable(
                    f"bucket {self.bucket!r} does not exist at {self.client.meta.endpoint_url}"
                    " (AWS_ENDPOINT_URL); create it or fix TRAINCTL_STORAGE_URL"
                ) from None
            if code in _REFUSED:
                raise StorageUnavailable(
                    f"bucket {self.bucket!r} refused {method} of {where} ({code}): check the "
                    "AWS credentials (AWS_ACCESS_KEY_ID and its secret, or AWS_PROFILE) and "
                    "what they may do in that bucket"
                ) from None
            raise StorageUnavailable(f"bucket {self.bucket!r}: {method} of {where} failed "
                                     f"({code})") from None  # fmt: skip
        except BotoCoreError as exc:  # no credentials, no endpoint: the message names no secret
            raise StorageUnavailable(
                f"bucket {self.bucket!r} cannot be reached for {where}: {type(exc).__name__} "
                "(check AWS_ENDPOINT_URL and the AWS credentials)"
            ) from None

    def _keys(self, prefix: str) -> Iterator[dict[str, Any]]:
        """Every object under `prefix` (a folder-like prefix ending in '/')."""
        token: str | None = None
        while True:
            more = {"ContinuationToken": token} if token else {}
            page = self.call("list_objects_v2", prefix, Bucket=self.bucket, Prefix=prefix, **more)
            yield from page.get("Contents", [])
            token = page.get("NextContinuationToken")
            if not token:
                return

    def _delete_keys(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # DeleteObjects takes 1,000 at most
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            self.call(
                "delete_objects", batch[0]["Key"], Bucket=self.bucket,
                Delete={"Objects": batch, "Quiet": True},
            )  # fmt: skip

    # --- reading ---

    def experiments(self) -> list[str]:
        names: set[str] = set()
        token: str | None = None
        top = self.key() + "/" if self.prefix else ""
        while True:
            more = {"ContinuationToken": token} if token else {}
            page = self.call(
                "list_objects_v2", top, Bucket=self.bucket, Prefix=top, Delimiter="/", **more
            )
            for common in page.get("CommonPrefixes", []):
                names.add(common["Prefix"][len(top) :].rstrip("/"))
            token = page.get("NextContinuationToken")
            if not token:
                break
        return sorted(n for n in names if _is_name("experiment", n))

    def tags(self, experiment: str) -> list[str]:
        validate_name("experiment", experiment)
        top = self.key(experiment) + "/"
        found = set()
        for obj in self._keys(top):
            parts = obj["Key"][len(top) :].split("/")
            if len(parts) == 2 and parts[1] == MANIFEST_FILE and _is_name("tag", parts[0]):
                found.add(parts[0])
        return sorted(found)

    def exists(self, experiment: str, tag: str | None = None) -> bool:
        validate_name("experiment", experiment)
        if tag is not None:
            return self._head(experiment, validate_name("tag", tag)) is not None
        top = self.key(experiment) + "/"
        page = self.call("list_objects_v2", top, Bucket=self.bucket, Prefix=top, MaxKeys=1)
        return bool(page.get("Contents"))

    def _head(self, experiment: str, tag: str) -> tuple[str, float] | None:
        """The generation and commit time of a committed tag; None when it is not. (Read
        from the marker's body: its metadata may be gone, `_stamp`.)"""
        try:
            committed = self._read_marker(experiment, tag)
        except FileNotFoundError:
            return None
        return committed.generation, committed.committed_at

    def _manifest(self, experiment: str, tag: str) -> _Committed:
        pins: dict[tuple[str, str], _Committed] | None = getattr(self._pins, "held", None)
        if pins is not None and (experiment, tag) in pins:
            return pins[(experiment, tag)]
        committed = self._read_marker(experiment, tag)
        if pins is not None:
            pins[(experiment, tag)] = committed
        return committed

    def _read_marker(self, experiment: str, tag: str) -> _Committed:
        key = self.key(experiment, tag, MANIFEST_FILE)
        got = self.call("get_object", key, Bucket=self.bucket, Key=key)
        with contextlib.closing(got["Body"]) as body:
            data = body.read(MAX_MANIFEST_BYTES + len(COMMIT_LINE) + 128)
        return _stamp(got, data)

    def open(self, experiment: str, tag: str, name: str) -> CachedReader | ManifestReader:
        validate_name("experiment", experiment)
        validate_name("tag", tag)
        validate_name("file", name)
        committed = self._manifest(experiment, tag)
        if name == MANIFEST_FILE:
            return ManifestReader(committed.data)
        if not committed.generation:
            raise FileNotFoundError(f"{self.describe(experiment, tag)}: {NO_SAVE}")
        cached = self.cache.path(experiment, tag, committed.generation, name)
        reader = self.cache.open(cached)
        if reader is not None:
            return reader
        key = self.key(experiment, tag, "." + committed.generation, name)
        return self.cache.fill(
            cached, lambda out: self._download(key, out), listed(committed.data, name)
        )

    def adopt(self, experiment: str, tag: str, folder: Path) -> bool:
        return False  # no folder becomes an object: its files are uploaded through `stage`

    def url(self, experiment: str, tag: str, name: str, expires: int) -> str | None:
        """A presigned GET of the file in the generation the tag's manifest names (pinned
        under `reading`, as `open`'s): a replace meanwhile removes that generation, so the
        URL then answers 404, never another save's bytes. The manifest itself is served by
        the caller (its key is overwritten by every replace). Signing is local: no request."""
        validate_name("experiment", experiment)
        validate_name("tag", tag)
        validate_name("file", name)
        if name == MANIFEST_FILE:
            return None
        committed = self._manifest(experiment, tag)
        if not committed.generation:
            raise FileNotFoundError(f"{self.describe(experiment, tag)}: {NO_SAVE}")
        key = self.key(experiment, tag, "." + committed.generation, name)
        params = {"Bucket": self.bucket, "Key": key}
        url: str = self.call(
            "generate_presigned_url", key, ClientMethod="get_object", Params=params,
            ExpiresIn=expires,
        )  # fmt: skip
        return url

    def _download(self, key: str, out: BinaryIO) -> None:
        """Object `key` into `out`, in parallel ranges when it is large."""
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=self.part_bytes, multipart_chunksize=self.part_bytes,
            max_concurrency=self.max_concurrency,
        )  # fmt: skip
        self.call("download_fileobj", key, Bucket=self.bucket, Key=key, Fileobj=out, Config=config)

    @contextmanager
    def reading(self, experiment: str) -> Iterator[None]:
        """Hold still what this process commits and deletes, and read each tag's files from
        the generation its manifest named at the first read (another process's replace may
        still remove that generation: its files then read as missing, never as mixed)."""
        with self._lock:
            outer = getattr(self._pins, "held", None)
            if outer is None:
                self._pins.held = {}
            try:
                yield
            finally:
                if outer is None:
                    self._pins.held = None

    def committed_at(self, experiment: str, tag: str) -> float | None:
        head = self._head(validate_name("experiment", experiment), validate_name("tag", tag))
        return head[1] if head is not None else None

    # --- writing ---

    def stage(self, experiment: str, tag: str) -> S3Stage:
        stage = S3Stage(self, validate_name("experiment", experiment), validate_name("tag", tag))
        marker = self.key(experiment, EXPERIMENT_MARKER)
        self.call("put_object", marker, Bucket=self.bucket, Key=marker, Body=b"")
        with self._lock:
            self._live.add((experiment, stage.generation))
        return stage

    def join(self, experiment: str, tag: str, key: str) -> S3Stage:
        """Objects under the generation `key`; nothing in the bucket says a stage is in
        progress, so a wrong key is found at the commit: files no manifest names."""
        if GENERATION.fullmatch(key) is None:
            raise FileNotFoundError(f"{self.describe(experiment, tag)}: no stage {key!r}")
        stage = S3Stage(
            self, validate_name("experiment", experiment), validate_name("tag", tag),
            generation=key, owner=False,
        )  # fmt: skip
        with self._lock:
            self._live.add((experiment, key))  # this process's sweep spares it too
        return stage

    def commit(self, stage: S3Stage, manifest: bytes | None, replace: bool) -> None:
        """PUT the manifest (the commit), then remove the generation it replaced. A stage
        without a manifest can be no complete entry: its commit only removes the tag, as a
        save that crashed before its manifest leaves nothing listed."""
        experiment, tag = stage.experiment, stage.tag
        key = self.key(experiment, tag, MANIFEST_FILE)
        with self._lock:
            old = self._head(experiment, tag)
            if old is not None and not replace:
                raise FileExistsError(f"{self.describe(experiment, tag)}: the entry exists")
            if manifest is None:
                self.call("delete_object", key, Bucket=self.bucket, Key=key)
                stage.abort()
            else:
                body = _commit_body(stage.generation, self.clock(), manifest)
                # The head above is no lock across nodes: without `replace`, S3's conditional
                # write (If-None-Match: *) lets only the first of two PUTs of the manifest
                # succeed, and the other is FileExistsError (SeaweedFS honours it, as AWS
                # has since 2024; a server that ignores it leaves the last PUT the winner).
                only_new = {} if replace else {"IfNoneMatch": "*"}
                self.call(
                    "put_object", key, Bucket=self.bucket, Key=key, Body=body,
                    ContentType="text/plain", **only_new,
                )  # fmt: skip
                self.forget(stage)
            if old is not None and old[0] and old[0] != stage.generation:
                self.remove_generation(experiment, tag, old[0])
        self.sweep(experiment)

    def forget(self, stage: S3Stage) -> None:
        with self._lock:
            self._live.discard((stage.experiment, stage.generation))

    def remove_generation(self, experiment: str, tag: str, generation: str) -> None:
        top = self.key(experiment, tag, "." + generation) + "/"
        self._delete_keys([obj["Key"] for obj in self._keys(top)])

    def delete(self, experiment: str, tag: str) -> bool:
        validate_name("experiment", experiment)
        validate_name("tag", tag)
        key = self.key(experiment, tag, MANIFEST_FILE)
        with self._lock:
            old = self._head(experiment, tag)
            if old is None:
                return False
            self.call("delete_object", key, Bucket=self.bucket, Key=key)  # the marker first
            if old[0]:
                self.remove_generation(experiment, tag, old[0])
        return True

    # --- what interrupted writers left ---

    def sweep(self, experiment: str, *, mine: bool = False) -> list[tuple[str, str]]:
        """Remove the generations of `experiment` that no manifest names and that are
        another process's, last written more than `stale_after` ago (it may still be
        uploading a younger one), or, with `mine`, this process's stages too."""
        top = self.key(experiment) + "/"
        generations: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for obj in self._keys(top):
            parts = obj["Key"][len(top) :].split("/")
            if len(parts) == 3 and parts[1].startswith("."):
                generations.setdefault((parts[0], parts[1][1:]), []).append(obj)
        now, swept = time.time(), []
        for (tag, generation), objects in sorted(generations.items()):
            newest = max(o["LastModified"].timestamp() for o in objects)
            with self._lock:
                if (experiment, generation) in self._live:
                    if not mine:
                        continue
                elif now - newest < self.stale_after:
                    continue
                head = self._head(experiment, tag)
                if head is not None and head[0] in (generation, ""):
                    continue  # named, or maybe named by a marker we cannot read: kept
                self._delete_keys([o["Key"] for o in objects])
            swept.append((experiment, f"{tag}/.{generation}"))
        return swept

    def cleanup(self, experiment: str | None, complete: Complete) -> list[tuple[str, str]]:
        """The generations no manifest names and the unfinished multipart uploads: this
        process's, and other processes' older than `stale_after` (on a bucket that nodes
        share, "before writers run" holds for this process only). Nothing is ever put back
        here: a commit is one PUT, so no entry is left aside for `complete`."""
        names = [experiment] if experiment is not None else self.experiments()
        done = [swept for name in names for swept in self.sweep(name, mine=True)]
        now = time.time()
        for name in names:
            top = self.key(name) + "/"
            for upload in self._uploads(top):
                parts = upload["Key"][len(top) :].split("/")
                generation = parts[1][1:] if len(parts) == 3 else ""
                young = now - upload["Initiated"].timestamp() < self.stale_after
                if young and (name, generation) not in self._live:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    self.call(
                        "abort_multipart_upload", upload["Key"], Bucket=self.bucket,
                        Key=upload["Key"], UploadId=upload["UploadId"],
                    )  # fmt: skip
        with self._lock:
            self._live -= {live for live in self._live if live[0] in names}
        return done

    def _uploads(self, prefix: str) -> list[dict[str, Any]]:
        """The multipart uploads in progress under `prefix`; none where the server answers
        NoSuchUpload to the listing (rclone), as AWS's empty list."""
        try:
            page = self.call("list_multipart_uploads", prefix, Bucket=self.bucket, Prefix=prefix)
        except FileNotFoundError:
            return []
        uploads: list[dict[str, Any]] = page.get("Uploads", [])
        return uploads

    @contextmanager
    def guard(self, experiment: str) -> Iterator[None]:
        """A lock of this process, then (the outermost take of it) the experiment's lease in
        the run database, renewed while held; without `leases`, the lock alone (see the
        module docstring for what that leaves unsafe across processes)."""
        validate_name("experiment", experiment)
        with self._lock:
            lock = self._guards.setdefault(experiment, threading.RLock())
        with lock:  # only this thread touches the experiment's entry of `_held` now
            depth, release = self._held.get(experiment, (0, None))
            if depth == 0 and self.leases is not None:
                key = self.describe(experiment)  # the checkpoints' and exports' differ
                self.leases.take(key)
                release = self.leases.keep(key)
            self._held[experiment] = (depth + 1, release)
            try:
                yield
            finally:
                depth, release = self._held.pop(experiment)
                if depth > 1:
                    self._held[experiment] = (depth - 1, release)
                elif release is not None:
                    release()


def _is_name(kind: str, name: str) -> bool:
    try:
        validate_name(kind, name)
    except ValueError:
        return False
    return True


def _commit_body(generation: str, committed_at: float, manifest: bytes) -> bytes:
    """A commit marker: the line `_stamp` reads, then the manifest's bytes as they are."""
    return COMMIT_LINE + f"{generation} {committed_at!r}\n".encode() + manifest


def _stamp(got: dict[str, Any], data: bytes) -> _Committed:
    """A commit marker as read: the manifest, and the generation and commit time from the
    marker's first line, or (a marker of the first layout, the manifest alone) from its user
    metadata, which a server may have lost (then the entry reads as a manifest of no save).

    Everything here comes from the bucket: a generation that is not of the form a stage
    makes (`GENERATION`: never a path, never `..`) or a time that is no finite number makes
    the entry incomplete, logged, never a local path or a key of ours."""
    generation, stamp = "", ""
    if data.startswith(COMMIT_LINE):
        line, _, data = data[len(COMMIT_LINE) :].partition(b"\n")
        generation, _, stamp = line.decode("ascii", "replace").partition(" ")
    else:
        meta = {str(k).lower(): str(v) for k, v in got.get("Metadata", {}).items()}
        generation, stamp = meta.get(GENERATION_META, ""), meta.get(COMMITTED_META, "")
    try:
        committed_at = float(stamp)
    except ValueError:
        committed_at = math.nan
    if not math.isfinite(committed_at):
        committed_at = got["LastModified"].timestamp()
    if GENERATION.fullmatch(generation) is None:
        generation = ""  # `open` says so, and the store logs it once ("not listing ...")
    return _Committed(data[: MAX_MANIFEST_BYTES + 1], generation, committed_at)
