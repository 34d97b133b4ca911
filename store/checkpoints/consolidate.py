"""One model.safetensors from a sharded checkpoint, stitched without torch and streamed
(docs/design/checkpoints.md, "Sharded checkpoints").

A sharded checkpoint (layout "dcp") holds each rank's tensors in its own safetensors file,
`rank-<r>.safetensors`, whose header's `__metadata__` says, for every tensor, which global
tensor it is a chunk of (`fqn`), where the chunk starts in it (`offsets`) and the global
`shape`. FSDP2 shards a tensor along its first dimension, so the chunks of one tensor are
row ranges, and the whole tensor's bytes are the chunks' bytes in row order: the model file
is its header followed by byte ranges of the shard files, computed up front (so its size is
known before the first byte, for a Content-Length) and read 1 MiB at a time. Nothing here
holds a tensor in memory, and nothing needs torch: the service serves it as it is.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from trainctl.store.checkpoints.manifests import DCP_LAYOUT, MANIFEST_FILE, verify_manifest
from trainctl.store.checkpoints.storage import Files, Reader
from trainctl.store.exceptions import CheckpointCorrupt

SHARD_FILE = "rank-{rank}.safetensors"
"""A rank's tensor chunks: the model's and the optimizer state's."""
SHARD_BYTES_FILE = "rank-{rank}.bytes"
"""A rank's non-tensor state (optimizer hyper-parameters), as torch.distributed.checkpoint
serialises it."""
DCP_METADATA_FILE = "dcp.metadata"
"""torch.distributed.checkpoint's plan of the whole checkpoint (which chunk is where)."""
CHUNKS_KEY = "trainctl.chunks"
"""The `__metadata__` key of a shard file: {key: {fqn, offsets, shape}} per tensor."""
MODEL_PREFIX = "model."
"""The model's tensors' names in a sharded checkpoint: `model.<state dict name>`."""

_SHARD_RE = re.compile(r"rank-(\d+)\.safetensors")
_CHUNK = 1 << 20
# A header of ours lists a few entries per tensor; a larger one is not ours.
_MAX_HEADER = 64 << 20
_ITEM_SIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


@dataclass(frozen=True)
class Piece:
    """A byte range of a shard file: one chunk of a tensor."""

    name: str
    start: int
    length: int


@dataclass(frozen=True)
class ConsolidatedModel:
    """The model file of a sharded checkpoint: its header, then pieces of the shard files."""

    files: Files
    header: bytes
    pieces: list[Piece]
    etag: str
    """Names the content: the sha256s of the shard files it is made of, hashed together."""

    @property
    def size(self) -> int:
        return len(self.header) + sum(p.length for p in self.pieces)

    def chunks(self) -> Iterator[bytes]:
        """The file's bytes, 1 MiB at a time; a shard that is shorter than its header
        promised fails the stream (the response has started: a truncated download, never a
        wrong one)."""
        yield self.header
        with ExitStack() as stack:
            open_files: dict[str, Reader] = {}
            for piece in self.pieces:
                f = open_files.get(piece.name)
                if f is None:
                    f = open_files[piece.name] = stack.enter_context(self.files.open(piece.name))
                f.seek(piece.start)
                remaining = piece.length
                while remaining:
                    data = f.read(min(_CHUNK, remaining))
                    if not data:
                        raise CheckpointCorrupt(f"{self.files.describe(piece.name)} shrank")
                    remaining -= len(data)
                    yield data


def shard_names(names: list[str]) -> list[str]:
    """The shard files among a manifest's names, by rank."""
    ranked = [(int(m.group(1)), n) for n in names if (m := _SHARD_RE.fullmatch(n))]
    return [n for _, n in sorted(ranked)]


def read_header(files: Files, name: str) -> tuple[dict[str, Any], int]:
    """A safetensors file's header and where its data starts."""
    where = files.describe(name)
    with files.open(name) as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CheckpointCorrupt(f"{where}: too short for a safetensors file")
        (length,) = struct.unpack("<Q", raw)
        if length > min(_MAX_HEADER, f.size - 8):
            raise CheckpointCorrupt(f"{where}: a header of {length:,} bytes is not ours")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise CheckpointCorrupt(f"{where}: unreadable safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointCorrupt(f"{where}: the safetensors header is not an object")
    return header, 8 + length


def consolidate(files: Files) -> ConsolidatedModel:
    """The one model file of the sharded checkpoint `files` (checked shallowly against its
    manifest: what is listed is there, with its size)."""
    manifest = verify_manifest(files, deep=False)
    if manifest.get("layout") != DCP_LAYOUT:
        raise CheckpointCorrupt(f"{files.describe(MANIFEST_FILE)}: not a sharded checkpoint")
    entries = {e["name"]: e for e in manifest["files"]}
    tensors: dict[str, dict[str, Any]] = {}
    for name in shard_names(list(entries)):
        _collect(files, name, tensors)
    if not tensors:
        raise CheckpointCorrupt(f"{files.describe()}: its shards hold no model weights")
    # Wider elements first, then by name: the order `worker.checkpoints.safetensors_stream` writes.
    order = sorted(tensors, key=lambda n: (-_ITEM_SIZE[tensors[n]["dtype"]], n))
    header_doc: dict[str, Any] = {}
    pieces: list[Piece] = []
    offset = 0
    for fqn in order:
        t = tensors[fqn]
        size = _tensor_pieces(files, fqn, t, pieces)
        header_doc[fqn] = {
            "dtype": t["dtype"],
            "shape": t["shape"],
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header_doc, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    etag = _etag([entries[n]["sha256"] for n in shard_names(list(entries))])
    return ConsolidatedModel(files, struct.pack("<Q", len(raw)) + raw, pieces, etag)


def _collect(files: Files, name: str, tensors: dict[str, dict[str, Any]]) -> None:
    """Add the model chunks of one shard file to `tensors` (by model name)."""
    where = files.describe(name)
    header, data_start = read_header(files, name)
    try:
        chunks = json.loads(header.get("__metadata__", {}).get(CHUNKS_KEY, "{}"))
    except (AttributeError, ValueError) as exc:
        raise CheckpointCorrupt(f"{where}: unreadable {CHUNKS_KEY} ({exc})") from None
    for key, chunk in chunks.items():
        fqn = chunk.get("fqn") if isinstance(chunk, dict) else None
        entry = header.get(key)
        if not isinstance(fqn, str) or not fqn.startswith(MODEL_PREFIX) or entry is None:
            continue  # the optimizer's state, or a chunk the header does not hold
        begin, end = entry["data_offsets"]
        t = tensors.setdefault(
            fqn.removeprefix(MODEL_PREFIX),
            {"dtype": entry["dtype"], "shape": chunk["shape"], "chunks": []},
        )
        if t["dtype"] != entry["dtype"] or t["shape"] != chunk["shape"]:
            raise CheckpointCorrupt(f"{where}: chunks of {fqn!r} disagree on dtype or shape")
        t["chunks"].append(
            (list(chunk["offsets"]), list(entry["shape"]), name, data_start + begin, end - begin)
        )


def _tensor_pieces(files: Files, fqn: str, t: dict[str, Any], pieces: list[Piece]) -> int:
    """Append the pieces of one whole tensor, in row order; return its size in bytes.
    Only row ranges stitch by bytes: a chunk split along another dimension is refused."""
    shape = t["shape"]
    row = _ITEM_SIZE[t["dtype"]]
    for dim in shape[1:]:
        row *= dim
    expected = 0
    for offsets, chunk_shape, name, start, length in sorted(t["chunks"]):
        if any(offsets[1:]) or chunk_shape[1:] != shape[1:]:
            raise CheckpointCorrupt(
                f"{files.describe(name)}: {fqn!r} is split along a dimension other than the "
                "first, which cannot be stitched byte by byte"
            )
        if shape and offsets[0] != expected:
            raise CheckpointCorrupt(f"{files.describe()}: rows of {fqn!r} missing or repeated")
        if length:
            pieces.append(Piece(name, start, length))
        expected += chunk_shape[0] if shape else 1
    total = row * (shape[0] if shape else 1)
    if (shape and expected != shape[0]) or sum(c[4] for c in t["chunks"]) != total:
        raise CheckpointCorrupt(f"{files.describe()}: the chunks of {fqn!r} do not make it whole")
    return total


def _etag(hashes: list[str]) -> str:
    return hashlib.sha256("".join(hashes).encode()).hexdigest()
