"""The files of one checkpoint folder: the manifest, the metadata, hashing, fsync, and reads
that never follow a link (docs/architecture.md, "Checkpoint store").

Every read of a file in a checkpoint folder goes through `open_file`: the folder and its
parent (the experiment) are opened without following symlinks, and the file relative to the
folder's descriptor, also without following one. A link planted in a shared checkpoint
filesystem (``manifest.json -> /etc/passwd``, a weights file pointing elsewhere, a tag or
experiment folder that is a link) is then "missing", never read. JSON files are read with a
size limit, and a document nested too deep is "corrupt": one bad folder makes that checkpoint
invisible, never a listing fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from trainctl.store.exceptions import CheckpointCorrupt, InvalidName
from trainctl.store.names import is_valid_name

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
METADATA_FILE = "metadata.json"
MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
# trainctl writes a few KB of each (metadata: config, schedule, RNG state); anything near
# this is not ours, and reading it whole on every listing would cost the service memory.
MAX_JSON_BYTES = 4 << 20

_CHUNK = 1 << 20
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def is_plain_file_name(name: object) -> bool:
    """True for a name that can be listed in a manifest: one path component, not hidden."""
    return name != MANIFEST_FILE and is_valid_name(name)


# --- reading without following links --------------------------------------------------------


def _open_folder(folder: Path) -> int:
    """A descriptor of `folder`, opened so that neither it nor its parent is a symlink (the
    store root above them may be one: that is the administrator's choice, not a user's)."""
    folder = folder.absolute()
    above = os.open(folder.parent.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        parent = os.open(folder.parent.name, _NOFOLLOW_DIR, dir_fd=above)
    finally:
        os.close(above)
    try:
        return os.open(folder.name, _NOFOLLOW_DIR, dir_fd=parent)
    finally:
        os.close(parent)


def open_fd(folder: Path, name: str) -> int:
    """A read descriptor of the regular file `name` directly in `folder`, following no link.

    Raises FileNotFoundError for anything else there (a link, a folder, a device) or a
    folder reached through a link, so callers treat it as a missing file.
    """
    try:
        folder_fd = _open_folder(folder)
    except OSError as exc:  # ELOOP/ENOTDIR: a link where a folder should be
        raise FileNotFoundError(f"{folder}: not a folder of the store ({exc.strerror})") from None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise FileNotFoundError(f"{folder / name}: not a regular file ({exc.strerror})") from None
    finally:
        os.close(folder_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(f"{folder / name}: not a regular file")
    return fd


@contextmanager
def open_file(folder: Path, name: str) -> Iterator[IO[bytes]]:
    """`open_fd` as a binary file object, closed on exit."""
    with os.fdopen(open_fd(folder, name), "rb") as f:
        yield f


def file_size(folder: Path, name: str) -> int:
    """The size of the regular file `name` in `folder`; FileNotFoundError as `open_fd`."""
    fd = open_fd(folder, name)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def sha256_of(folder: Path, name: str) -> str:
    """Hex sha256 of a file of a checkpoint folder, in 1 MiB chunks, following no link."""
    with open_file(folder, name) as f:
        return _sha256(f)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file the caller wrote itself (staging); see `sha256_of` for reads."""
    with open(path, "rb") as f:
        return _sha256(f)


def _sha256(f: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def read_json(folder: Path, name: str) -> Any:
    """A JSON file of a checkpoint folder, bounded in size and depth; else CheckpointCorrupt."""
    path = folder / name
    try:
        with open_file(folder, name) as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{path}: file is missing") from None
    except OSError as exc:
        raise CheckpointCorrupt(f"{path}: cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_JSON_BYTES:
        raise CheckpointCorrupt(f"{path}: larger than {MAX_JSON_BYTES:,} bytes; not ours")
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise CheckpointCorrupt(f"{path}: nested too deep to be ours") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointCorrupt(f"{path}: cannot be read as JSON ({exc})") from None


def read_metadata(folder: Path) -> dict[str, Any]:
    """A checkpoint's metadata.json: the one reader (listing, resolving plans, loading)."""
    meta = read_json(folder, METADATA_FILE)
    if not isinstance(meta, dict):
        raise CheckpointCorrupt(f"{folder / METADATA_FILE}: not a JSON object")
    return meta


# --- writing --------------------------------------------------------------------------------


def fsync_file(path: Path) -> None:
    """Flush a file's data to disk (a rename is only durable if the data under it is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries to disk, making renames and new files in it durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON so that readers see either the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_manifest(
    folder: Path, names: list[str], hashes: dict[str, str] | None = None
) -> dict[str, Any]:
    """Fsync and describe each named file, then write ``manifest.json`` last, atomically.

    `hashes` lets a writer that already hashed a file while writing it skip a second read.
    Every file is fsynced here, so the caller need not: once the manifest exists, the bytes
    it describes are on disk.
    """
    hashes = hashes or {}
    files = []
    for name in names:
        if not is_plain_file_name(name):
            raise InvalidName(f"cannot list {name!r} in a manifest: not a plain file name")
        path = folder / name
        fsync_file(path)
        sha = hashes.get(name) or sha256_file(path)
        files.append({"name": name, "size": path.stat().st_size, "sha256": sha})
    manifest = {"version": MANIFEST_VERSION, "files": files}
    _write_json_atomic(folder / MANIFEST_FILE, manifest)
    return manifest


# --- checking -------------------------------------------------------------------------------


def _check_manifest_shape(path: Path, manifest: Any) -> dict[str, Any]:
    """Refuse manifests we did not write: an entry like ``../x`` must never be served."""
    if not isinstance(manifest, dict) or manifest.get("version") != MANIFEST_VERSION:
        raise CheckpointCorrupt(f"{path}: not a version {MANIFEST_VERSION} manifest")
    files = manifest.get("files")
    if not isinstance(files, list):
        raise CheckpointCorrupt(f"{path}: 'files' is not a list")
    seen: set[str] = set()
    for entry in files:
        ok = (
            isinstance(entry, dict)
            and is_plain_file_name(entry.get("name"))
            and type(entry.get("size")) is int
            and entry["size"] >= 0
            and isinstance(entry.get("sha256"), str)
            and _SHA256_RE.fullmatch(entry["sha256"]) is not None
        )
        if not ok or entry["name"] in seen:
            raise CheckpointCorrupt(f"{path}: bad or duplicate file entry {entry!r}")
        seen.add(entry["name"])
    return manifest


def verify_manifest(folder: Path, *, deep: bool = True) -> dict[str, Any]:
    """Check a checkpoint folder against its manifest; return the manifest.

    Shallow (`deep=False`) checks presence and sizes: cheap enough for every listing, and it
    catches a truncated or half-copied file. Deep also re-hashes, which catches bit rot. A
    listed file that is a link, or a folder reached through one, counts as missing.
    """
    manifest = _check_manifest_shape(folder / MANIFEST_FILE, read_json(folder, MANIFEST_FILE))
    for entry in manifest["files"]:
        file = folder / entry["name"]
        # A vanished file is "missing", not an OSError: the folder may be renamed away by a
        # concurrent delete or retention at any moment between two calls.
        try:
            size = file_size(folder, entry["name"])
            if size != entry["size"]:
                raise CheckpointCorrupt(
                    f"{file}: size {size} bytes, manifest says {entry['size']} (truncated?)"
                )
            if deep and sha256_of(folder, entry["name"]) != entry["sha256"]:
                raise CheckpointCorrupt(f"{file}: sha256 does not match the manifest")
        except FileNotFoundError:
            raise CheckpointCorrupt(f"{file}: listed in the manifest but missing") from None
    return manifest
