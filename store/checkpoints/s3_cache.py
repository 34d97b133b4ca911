"""The local cache of an S3 storage's files (docs/design/checkpoints.md, "Object storage"):
downloads kept by generation, checked against the manifest, the least recently used evicted.

A generation's files never change, so a cached file is never stale. Only a download that
matches what its manifest lists (size and sha256) is kept; one that does not is served once,
so that the store's own checks report the damage as on any storage, and dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from trainctl.store.files import descriptor_path

DOWNLOAD_PREFIX = ".download-"
PLACE_FOLDER = re.compile(r"[0-9a-f]{16}")


def place_folder(place: str) -> str:
    """The cache dir's folder for one place (server, bucket and prefix of a storage)."""
    return hashlib.sha256(place.encode()).hexdigest()[:16]


class CachedReader(io.BufferedReader):
    """A downloaded file, open from the cache. An eviction meanwhile removes the name, never
    the bytes this reader reads: `local_path` is its descriptor's entry under /proc (as a
    POSIX reader's), so a library that maps the file by path maps these bytes even then."""

    def __init__(self, path: Path, *, unlink: bool = False) -> None:
        super().__init__(io.FileIO(path, "rb"))
        self.size = os.fstat(self.fileno()).st_size
        self.local_path: str | None = descriptor_path(self.fileno())
        if unlink:  # a download that failed its manifest: served once, never cached
            path.unlink()
            self.local_path = None


class DownloadCache:
    """Files under `root`, a folder of the cache dir `shared` named by `place_folder`; at
    most `max_bytes` in all of that cache dir's such folders (the one just downloaded stays):
    the stores of one bucket, and the workers of a node, share one budget."""

    def __init__(self, shared: Path, place: str, max_bytes: int) -> None:
        self.shared, self.max_bytes = shared, max_bytes
        self.root = shared / place_folder(place)

    def path(self, *parts: str) -> Path:
        """The cached file of `parts`, each one plain name (the caller checked what came
        from the bucket; this is the last line: no part climbs out of `root`)."""
        if any(not p or "/" in p or "\0" in p or p in (".", "..") for p in parts):
            raise FileNotFoundError(f"{parts!r} names no file of the cache")
        return self.root.joinpath(*parts)

    def open(self, path: Path) -> CachedReader | None:
        """The cached file at `path`, marked as just used; None when it is not there."""
        try:
            reader = CachedReader(path)
        except FileNotFoundError:
            return None
        with contextlib.suppress(FileNotFoundError):  # evicted since: the reader has it
            os.utime(path)
        return reader

    def fill(
        self,
        path: Path,
        download: Callable[[BinaryIO], None],
        expected: tuple[int, str] | None,
    ) -> CachedReader:
        """Download into `path` with `download(file)`; keep it when it is (size, sha256)
        `expected`, else serve it once."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=DOWNLOAD_PREFIX)
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as out:
                download(out)
            got = hash_file(tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if got != expected:
            return CachedReader(tmp, unlink=True)
        os.replace(tmp, path)
        self.evict(keep=path)
        return CachedReader(path)

    def folders(self) -> list[Path]:
        """This cache dir's folders of places, ours among them; nothing else that lives in
        the folder an operator named is ever counted or evicted."""
        with contextlib.suppress(FileNotFoundError):
            return [p for p in self.shared.iterdir() if PLACE_FOLDER.fullmatch(p.name)]
        return []

    def evict(self, keep: Path) -> None:
        """The least recently used files out until the cache dir fits `max_bytes`."""
        files = []
        for path in (p for folder in self.folders() for p in folder.rglob("*")):
            with contextlib.suppress(FileNotFoundError):  # another thread evicted it
                if path.is_file() and not path.name.startswith(DOWNLOAD_PREFIX):
                    stat = path.stat()
                    files.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            if path != keep:
                path.unlink(missing_ok=True)
                total -= size


def listed(manifest: bytes, name: str) -> tuple[int, str] | None:
    """(size, sha256) that the manifest lists for `name`; None when it cannot say."""
    try:
        files = json.loads(manifest.decode("utf-8"))["files"]
        entry = next(f for f in files if f["name"] == name)
        return int(entry["size"]), str(entry["sha256"])
    except (ValueError, KeyError, TypeError, StopIteration, RecursionError, AttributeError):
        return None


def hash_file(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()
