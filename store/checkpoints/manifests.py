"""The files of one checkpoint: the manifest, the metadata, hashing, bounded reads
(docs/design/checkpoints.md, "Checkpoint store").

Every read goes through a `storage.Files` (an entry of the store's storage), which opens a
file without following links: a planted link is a missing file. JSON files are read with a
size limit, and a document nested too deep is "corrupt": one bad folder makes that checkpoint
invisible, never a listing fail. Nothing here knows where the bytes live.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import IO, Any

from trainctl.store.checkpoints.storage import Files, Reader
from trainctl.store.exceptions import CheckpointCorrupt, InvalidName
from trainctl.store.names import is_valid_name

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
METADATA_FILE = "metadata.json"
MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
# How a checkpoint's files hold its weights: the manifest's `layout` (absent: "full").
FULL_LAYOUT = "full"
"""One model.safetensors with every weight whole, optimizer.pt by optimizer name."""
DCP_LAYOUT = "dcp"
"""Sharded (docs/design/checkpoints.md, "Sharded checkpoints"): each rank's shards of the model
and the optimizer state in its own files (`rank-<r>.safetensors`), torch.distributed.checkpoint's
metadata beside them; `store.checkpoints.consolidate` stitches the one model file."""
LAYOUTS = (FULL_LAYOUT, DCP_LAYOUT)
# trainctl writes a few KB of each (metadata: config, schedule, RNG state); anything near
# this is not ours, and reading it whole on every listing would cost the service memory.
MAX_JSON_BYTES = 4 << 20

_CHUNK = 1 << 20
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def is_plain_file_name(name: object) -> bool:
    """True for a name that can be listed in a manifest: one path component, not hidden."""
    return name != MANIFEST_FILE and is_valid_name(name)


# --- reading --------------------------------------------------------------------------------


def file_size(files: Files, name: str) -> int:
    """The size of the regular file `name`; FileNotFoundError for anything else."""
    with files.open(name) as f:
        return f.size


def sha256_of(files: Files, name: str) -> str:
    """Hex sha256 of a file of a checkpoint, in 1 MiB chunks, following no link."""
    with files.open(name) as f:
        return sha256_stream(f)


def sha256_stream(f: Reader | IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def read_json(files: Files, name: str) -> Any:
    """A JSON file of a checkpoint, bounded in size and depth; else CheckpointCorrupt."""
    where = files.describe(name)
    try:
        with files.open(name) as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{where}: file is missing") from None
    except OSError as exc:
        raise CheckpointCorrupt(f"{where}: cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_JSON_BYTES:
        raise CheckpointCorrupt(f"{where}: larger than {MAX_JSON_BYTES:,} bytes; not ours")
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise CheckpointCorrupt(f"{where}: nested too deep to be ours") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointCorrupt(f"{where}: cannot be read as JSON ({exc})") from None


def read_metadata(files: Files) -> dict[str, Any]:
    """A checkpoint's metadata.json: the one reader (listing, resolving plans, loading)."""
    meta = read_json(files, METADATA_FILE)
    if not isinstance(meta, dict):
        raise CheckpointCorrupt(f"{files.describe(METADATA_FILE)}: not a JSON object")
    return meta


# --- writing --------------------------------------------------------------------------------


def build_manifest(entries: list[dict[str, Any]], layout: str = FULL_LAYOUT) -> dict[str, Any]:
    """The manifest of files described as ``{name, size, sha256}``, in the order given."""
    for entry in entries:
        if not is_plain_file_name(entry["name"]):
            raise InvalidName(f"cannot list {entry['name']!r} in a manifest: not a plain file name")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown checkpoint layout {layout!r}; known: {', '.join(LAYOUTS)}")
    manifest: dict[str, Any] = {"version": MANIFEST_VERSION, "files": entries}
    if layout != FULL_LAYOUT:  # the manifests of before layouts stay byte for byte the same
        manifest["layout"] = layout
    return manifest


def manifest_layout(manifest: dict[str, Any]) -> str:
    """A checked manifest's layout (`verify_manifest`'s)."""
    return str(manifest.get("layout", FULL_LAYOUT))


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, indent=2).encode()


# --- checking -------------------------------------------------------------------------------


def _check_manifest_shape(where: str, manifest: Any) -> dict[str, Any]:
    """Refuse manifests we did not write: an entry like ``../x`` must never be served."""
    if not isinstance(manifest, dict) or manifest.get("version") != MANIFEST_VERSION:
        raise CheckpointCorrupt(f"{where}: not a version {MANIFEST_VERSION} manifest")
    files = manifest.get("files")
    if not isinstance(files, list):
        raise CheckpointCorrupt(f"{where}: 'files' is not a list")
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
            raise CheckpointCorrupt(f"{where}: bad or duplicate file entry {entry!r}")
        seen.add(entry["name"])
    if manifest.get("layout", FULL_LAYOUT) not in LAYOUTS:
        raise CheckpointCorrupt(f"{where}: unknown layout {manifest['layout']!r}")
    return manifest


def read_manifest(files: Files) -> dict[str, Any]:
    """An entry's manifest, its shape checked, without opening the files it lists (where a
    file is a download, the reader checks it as it fetches it: `s3_cache`)."""
    return _check_manifest_shape(files.describe(MANIFEST_FILE), read_json(files, MANIFEST_FILE))


def verify_manifest(files: Files, *, deep: bool = True) -> dict[str, Any]:
    """Check a checkpoint's files against its manifest; return the manifest.

    Shallow (`deep=False`) checks presence and sizes: cheap enough for every listing, and it
    catches a truncated or half-copied file. Deep also re-hashes, which catches bit rot. A
    listed file that is a link, or a folder reached through one, counts as missing.
    """
    manifest = read_manifest(files)
    for entry in manifest["files"]:
        where = files.describe(entry["name"])
        # A vanished file is "missing", not an OSError: the entry may be deleted by a
        # concurrent delete or retention at any moment between two calls.
        try:
            size = file_size(files, entry["name"])
            if size != entry["size"]:
                raise CheckpointCorrupt(
                    f"{where}: size {size} bytes, manifest says {entry['size']} (truncated?)"
                )
            if deep and sha256_of(files, entry["name"]) != entry["sha256"]:
                raise CheckpointCorrupt(f"{where}: sha256 does not match the manifest")
        except FileNotFoundError:
            raise CheckpointCorrupt(f"{where}: listed in the manifest but missing") from None
    return manifest


def is_complete(files: Files) -> bool:
    """Whether an entry's files make a complete one (`storage.Complete`): what a cleanup asks
    before it puts back an entry an interrupted commit left aside."""
    try:
        verify_manifest(files, deep=False)
    except CheckpointCorrupt:
        return False
    return True
