"""A prepared dataset: token shards, the tokenizer that made them, and `dataset.json`, written
last as the commit marker (docs/design/data.md, "Datasets").

```
<dataset>/
  tokenizer.json        the Hugging Face `tokenizers` file (none for byte-level data)
  train_000000.bin ...  token shards (store.data.shards): uint16 while the vocabulary fits, else uint32
  val_000000.bin ...
  dataset.json          what is below; a folder without it is an unfinished prepare
```

`dataset.json` records the tokenizer (kind, sha256, end-of-text id), the vocabulary size and
token dtype, per split the shards and their token, document and byte counts, the sources,
bytes per token (for bits per byte), what was skipped and why, and the trainctl version.
The API reads it to refuse, at submit, a dataset that does not fit the model; the worker to
read the shards; a checkpoint records its identity (`identity`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from trainctl.store.data.shards import BYTE_VOCAB, DataError, open_data

DATASET_FILE = "dataset.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT_VERSION = 1
MAX_DATASET_JSON_BYTES = 16 << 20
MAX_TOKENIZER_BYTES = 256 << 20
"""Llama 3's tokenizer.json is 9 MB; a file past this is not one, and is not read whole."""
TokenizerKind = Literal["bytes", "bpe"]
TokenDtype = Literal["uint16", "uint32"]
SPLITS = ("train", "val")


def token_dtype(vocab_size: int) -> TokenDtype:
    """uint16 while every id fits (llm.c's format), uint32 above."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def bits_per_byte(loss_nats: float, bytes_per_token: float) -> float:
    """Cross-entropy per token (nats) as bits per byte of text: comparable across tokenizers."""
    return loss_nats / math.log(2) / bytes_per_token


@dataclass(frozen=True)
class TokenizerRef:
    kind: TokenizerKind
    """bytes: token = byte value; bpe: the folder's tokenizer.json."""
    sha256: str | None = None
    """Of tokenizer.json; None for bytes."""
    eot_id: int | None = None
    """The end-of-text token between documents; None for bytes (documents run together)."""


@dataclass(frozen=True)
class Split:
    shards: list[str]
    tokens: int
    documents: int
    bytes: int
    """UTF-8 bytes of the text these tokens encode (separators excluded)."""


@dataclass(frozen=True)
class Dataset:
    folder: Path
    tokenizer: TokenizerRef
    vocab_size: int
    token_dtype: TokenDtype
    splits: dict[str, Split]
    sources: list[dict[str, Any]] = field(default_factory=list)
    """[{path, size}] of every input read."""
    skipped: dict[str, Any] = field(default_factory=dict)
    """{documents: N, examples: [{file, line, reason}, ...]} of inputs left out."""
    trainctl_version: str = "unknown"
    created_at: str = ""
    format_version: int = FORMAT_VERSION
    location: str | None = None
    """Its name in pins and checkpoints where that is not `folder`: a dataset of the dataset
    store (`store.data.bucket`), named as the store describes it (a bucket's URL, a data
    dir's folder), whose files are read through the store."""
    paths: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Where its files are read when not at `folder / name`: a file the store opened and
    holds open (a bucket's download, which an eviction from the cache cannot take away):
    `store.data.bucket.DatasetStore.fetch`."""
    held: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    """The open readers behind `paths`: they keep those paths valid until `close`."""

    def close(self) -> None:
        """Let go of the readers behind `paths` (a shard mapped meanwhile stays mapped)."""
        for reader in self.held:
            reader.close()

    @property
    def where(self) -> str:
        """The dataset in words, as pins and checkpoints name it: its folder or its URL."""
        return self.location or str(self.folder)

    def path(self, name: str) -> Path:
        return Path(self.paths[name]) if name in self.paths else self.folder / name

    @property
    def bytes_per_token(self) -> float:
        tokens = sum(s.tokens for s in self.splits.values())
        text = sum(s.bytes for s in self.splits.values())
        return text / tokens if tokens else 1.0

    def shard_paths(self, split: str) -> list[Path]:
        return [self.path(name) for name in self.splits[split].shards]

    @property
    def tokenizer_path(self) -> Path | None:
        return self.path(TOKENIZER_FILE) if self.tokenizer.kind == "bpe" else None

    def identity(self) -> dict[str, Any]:
        """What a checkpoint records of the data it was trained on."""
        return {
            "folder": self.where,
            "tokenizer": asdict(self.tokenizer),
            "vocab_size": self.vocab_size,
            "bytes_per_token": self.bytes_per_token,
        }

    def to_json(self) -> dict[str, Any]:
        data = asdict(replace(self, paths={}, held=()))  # asdict would copy open readers
        for key in _NOT_IN_JSON:
            data.pop(key)
        data["bytes_per_token"] = self.bytes_per_token
        return data


_NOT_IN_JSON = ("folder", "location", "paths", "held")
"""Where a dataset is read from, not what it is: never written into its dataset.json."""


def byte_level(folder: Path, splits: dict[str, Split], **rest: Any) -> Dataset:
    return Dataset(folder, TokenizerRef("bytes"), BYTE_VOCAB, "uint16", splits, **rest)


def write_dataset(dataset: Dataset) -> Path:
    """Write dataset.json atomically, last: from then on the folder is a dataset."""
    data = dataset.to_json() | {"created_at": dataset.created_at or datetime.now(UTC).isoformat()}
    path = dataset.folder / DATASET_FILE
    tmp = path.with_name(f".{DATASET_FILE}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "x", encoding="utf-8") as f:  # "x": never through a planted link
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(dataset.folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def is_dataset(folder: Path) -> bool:
    return (folder / DATASET_FILE).is_file()


def read_tokenizer_file(path: Path) -> bytes:
    """The bytes of a tokenizer.json, read as every data file is (a regular file, never
    blocking) and bounded in size; DataError naming it otherwise."""
    with open_data(path) as f:
        data = f.read(MAX_TOKENIZER_BYTES + 1)
    if len(data) > MAX_TOKENIZER_BYTES:
        raise DataError(f"{path}: larger than {MAX_TOKENIZER_BYTES:,} bytes; not a tokenizer.json")
    return data


def read_tokenizer(dataset: Dataset) -> bytes | None:
    """The dataset's tokenizer.json, checked against the sha256 its dataset.json records;
    None for byte-level data."""
    path = dataset.tokenizer_path
    if path is None:
        return None
    data = read_tokenizer_file(path)
    if hashlib.sha256(data).hexdigest() != dataset.tokenizer.sha256:
        raise DataError(
            f"{path}: not the tokenizer its dataset.json records (sha256 differs); "
            "prepare the dataset again"
        )
    return data


def read_dataset(folder: Path) -> Dataset:
    """The dataset in `folder`; DataError naming what is wrong (no dataset.json: unfinished)."""
    path = Path(folder) / DATASET_FILE
    if not os.path.lexists(path):
        raise DataError(
            f"{folder} has no {DATASET_FILE}: not a prepared dataset, or its prepare did not "
            "finish (prepare it again)"
        )
    with open_data(path) as f:  # a FIFO there fails, never blocks
        raw = f.read(MAX_DATASET_JSON_BYTES + 1)
    return parse_dataset(raw, Path(folder), str(path))


def parse_dataset(raw: bytes, folder: Path, where: str, **rest: Any) -> Dataset:
    """The dataset whose dataset.json (at `where`, for messages) holds `raw`; DataError when
    it is not one. `rest`: where it is read from (`Dataset.location`, `paths`, `held`)."""
    if len(raw) > MAX_DATASET_JSON_BYTES:
        raise DataError(f"{where}: larger than {MAX_DATASET_JSON_BYTES:,} bytes; not ours")
    try:
        data = json.loads(raw)
        return _dataset(folder, data, **rest)
    except (RecursionError, ValueError, TypeError, KeyError) as exc:
        raise DataError(f"{where}: not a trainctl dataset manifest ({exc!r})") from None


def _dataset(folder: Path, data: dict[str, Any], **rest: Any) -> Dataset:
    if data.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"format_version {data.get('format_version')!r}, not {FORMAT_VERSION}")
    tokenizer = TokenizerRef(**data["tokenizer"])
    if tokenizer.kind not in ("bytes", "bpe"):
        raise ValueError(f"tokenizer kind {tokenizer.kind!r}")
    splits = {name: Split(**s) for name, s in data["splits"].items()}
    if set(splits) != set(SPLITS):
        raise ValueError(f"splits {sorted(splits)}, not {list(SPLITS)}")
    for split in splits.values():
        for shard in split.shards:
            if not isinstance(shard, str) or "/" in shard or shard.startswith("."):
                raise ValueError(f"shard name {shard!r}")
    vocab_size = int(data["vocab_size"])
    if data["token_dtype"] != token_dtype(vocab_size):
        raise ValueError(f"token dtype {data['token_dtype']!r} for a vocabulary of {vocab_size}")
    return Dataset(
        folder=folder,
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        token_dtype=data["token_dtype"],
        splits=splits,
        sources=list(data.get("sources", [])),
        skipped=dict(data.get("skipped", {})),
        trainctl_version=str(data.get("trainctl_version", "unknown")),
        created_at=str(data.get("created_at", "")),
        **rest,
    )
