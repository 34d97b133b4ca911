"""What a run's data files hold, checked at submit (docs/design/kinds.md, "Requests and plans").

`store.data.paths` finds the files a run will read; here each is read as far as it takes to
know it is what its data source says, so that a wrong file is a 422 now rather than a run
that fails at the worker: a shard's 1 KiB header (magic, version, and a size that matches
its token count: `shard_header`, the worker's own check), a text file's first 8,000 bytes
(text has no NUL byte there: git's and grep's test for a binary file), a compressed or
Parquet input's magic number, a tokenizer.json's parse. From the headers and sizes come the
tokens each array will hold, and a run whose data cannot fill one sequence of `seq_len + 1`
tokens, for training and for validation (after the held-out tail is split off, as
`worker.data.loader.split_holdout` does), is refused too. That token ids fit the model's vocabulary
is checked by the worker: knowing it means reading every token.

Files are opened non-blocking and checked with fstat before a byte is read: only a regular
file is read, so a FIFO or a device planted under the roots never stalls submit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainctl.store.data.codec import TextCodec
from trainctl.store.data.datasets import DATASET_FILE, Dataset
from trainctl.store.data.shards import SHARD_HEADER_BYTES, DataError, shard_header
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.files import NotRegularFile, open_regular_fd

TEXT_SNIFF_BYTES = 8000
"""What git and grep read to call a file binary (a NUL byte in it)."""
MAX_TOKENIZER_BYTES = 64 << 20
"""Larger than any tokenizer.json there is (GPT-4o's 200k vocabulary is about 15 MB)."""
# The first bytes of each compressed or columnar input kind (store.data.corpus.kind_of).
INPUT_MAGIC = {
    ".jsonl.gz": ("gzip", b"\x1f\x8b"),
    ".jsonl.zst": ("zstd", b"\x28\xb5\x2f\xfd"),
    ".parquet": ("Parquet", b"PAR1"),
}


@dataclass(frozen=True)
class TokenArrays:
    """How many tokens each array of a run's data holds: what `worker.training.loop.build_token_arrays`
    will build, counted from headers and sizes. `val` empty: the tail of each training array
    is held out."""

    train: list[int]
    val: list[int]


def _head(path: Path, count: int, field: str) -> tuple[bytes, int]:
    """The first `count` bytes of a regular file and its size; a refusal for anything else."""
    try:
        fd = open_regular_fd(path)  # a real path already (store.data.paths): no link
        try:
            return os.read(fd, count), os.fstat(fd).st_size
        finally:
            os.close(fd)
    except NotRegularFile:
        raise InvalidRequest(f"{field}: {str(path)!r} is not a regular file") from None
    except OSError as exc:
        raise InvalidRequest(f"{field}: {str(path)!r} cannot be read ({exc.strerror})") from None


def shard_lengths(paths: Sequence[Path], field: str, dtype: str | None = None) -> list[int]:
    """The tokens of each shard, read from its header; a refusal naming the first file that is
    not a shard (or, with `dtype`, not a shard of that token dtype)."""
    lengths = []
    for path in paths:
        header, size = _head(path, SHARD_HEADER_BYTES, field)
        try:
            found, count = shard_header(header, size, repr(str(path)))
        except DataError as exc:
            raise InvalidRequest(f"{field}: {exc}{_advice(path)}") from None
        if dtype is not None and found != dtype:
            raise InvalidRequest(
                f"{field}: {str(path)!r} holds {found} tokens, but its {DATASET_FILE} says "
                f"{dtype}; prepare the dataset again"
            )
        lengths.append(count)
    return lengths


def _advice(path: Path) -> str:
    if path.name == DATASET_FILE or (path.parent / DATASET_FILE).is_file():
        return (
            f"; it is part of a prepared dataset (a folder with a {DATASET_FILE}), which a run "
            "reads with data.source 'dataset' and data.dataset naming the folder"
        )
    return "; source 'shards' reads .bin token shards (trainctl data prepare writes them)"


def text_length(paths: Sequence[Path], max_bytes: int, field: str) -> int:
    """The bytes the worker reads from these files (in order, at most `max_bytes` in all),
    each of the files it reaches checked to be text."""
    total = 0
    for path in paths:
        if total >= max_bytes:
            break
        head, size = _head(path, TEXT_SNIFF_BYTES, field)
        if b"\x00" in head:
            raise InvalidRequest(
                f"{field}: {str(path)!r} is not text (a NUL byte in its first "
                f"{TEXT_SNIFF_BYTES:,} bytes, as git and grep tell a binary file); source 'text' "
                "reads text files as bytes, 'shards' reads .bin token shards"
                + (_advice(path) if path.suffix == ".bin" or path.name == DATASET_FILE else "")
            )
        total += min(size, max_bytes - total)
    return total


def dataset_arrays(dataset: Dataset, field: str) -> TokenArrays:
    """The tokens of each non-empty shard of a dataset's splits, each header checked against
    the dtype its dataset.json names (as `worker.data.datasets.dataset_arrays` reads them)."""
    splits = [
        shard_lengths(dataset.shard_paths(split), field, dataset.token_dtype)
        for split in ("train", "val")
    ]
    return TokenArrays([n for n in splits[0] if n], [n for n in splits[1] if n])


def check_enough_tokens(
    arrays: TokenArrays,
    val_fraction: float,
    seq_len: int,
    field: str,
    *,
    validation_only: bool = False,
) -> None:
    """Refuse data that cannot fill one window of `seq_len + 1` tokens for training (unless
    `validation_only`) and for validation: the worker's `TokenSampler` needs an array longer
    than that, and takes the held-out tail from each training array when no val data is
    given (`split_holdout`)."""
    train, val = arrays.train, arrays.val
    if not val:
        cut = [int(n * (1.0 - val_fraction)) for n in train]
        train, val = cut, [n - c for n, c in zip(train, cut, strict=True)]
    need = seq_len + 1
    splits = ([] if validation_only else [("training", train)]) + [("validation", val)]
    for split, lengths in splits:
        if not any(n > need for n in lengths):
            longest = max(lengths, default=0)
            raise InvalidRequest(
                f"{field}: the {split} data holds no array longer than seq_len + 1 = {need} "
                f"tokens (the longest has {longest:,}); add data, lower seq_len"
                + ("" if arrays.val else ", or raise val_fraction")
            )


def check_inputs(paths: Sequence[Path], field: str) -> None:
    """A prepare run's compressed and Parquet inputs begin as their kind does (a `.jsonl.gz`
    with gzip's magic number, and so on): a renamed or truncated file is refused now. (An
    empty `.jsonl.gz` or `.jsonl.zst` holds no documents, and is read as such.)"""
    for path in paths:
        name = path.name.lower()
        kind = next((k for k in INPUT_MAGIC if name.endswith(k)), None)
        if kind is None:
            continue
        what, magic = INPUT_MAGIC[kind]
        head, size = _head(path, 4, field)
        if (
            head.startswith(magic)
            or _zstd_skippable(kind, head)
            or (size == 0 and what != "Parquet")
        ):
            continue
        raise InvalidRequest(
            f"{field}: {str(path)!r} is not {what} data, as its name says ({size:,} bytes, "
            f"beginning {head.hex() or 'with nothing'}); rename or replace it"
        )


def _zstd_skippable(kind: str, head: bytes) -> bool:
    """A zstd stream may begin with a skippable frame: magic 0x184D2A50 to 0x184D2A5F."""
    return (
        kind == ".jsonl.zst"
        and len(head) == 4
        and head[1:] == b"\x2a\x4d\x18"
        and head[0] >> 4 == 5
    )


def check_tokenizer(path: Path, field: str) -> None:
    """A tokenizer.json that `tokenizers` loads, as the prepare's worker will load it."""
    data, size = _head(path, MAX_TOKENIZER_BYTES + 1, field)
    if size > MAX_TOKENIZER_BYTES:
        raise InvalidRequest(
            f"{field}: {str(path)!r} has {size:,} bytes, more than any tokenizer.json "
            f"({MAX_TOKENIZER_BYTES:,})"
        )
    try:
        TextCodec.from_tokenizer_json(data, repr(str(path)))
    except DataError as exc:
        raise InvalidRequest(f"{field}: {exc}") from None
