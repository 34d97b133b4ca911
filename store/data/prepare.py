"""Corpus files → a dataset folder (`trainctl data prepare`, and a prepare run on a worker;
docs/design/data.md, "Datasets").

```
read (this process)  ──batches of raw records──▶  parse + tokenize (`workers` processes)
      ──results, in the order sent──▶  split, write shards (this process)  ──▶  dataset.json
```

- **Documents** come from `store.data.corpus` (text files, JSONL, Parquet). With a tokenizer each
  document is followed by its end-of-text token; byte-level documents run together.
- **Validation split.** Documents are numbered in reading order (0, 1, ...; skipped ones are
  not numbered). Document i is held out when ⌊(i+1)·f⌋ > ⌊i·f⌋, f being `val_fraction` as an
  exact fraction: ⌊n·f⌋ of n documents, spread evenly (every 20th at 0.05). A document goes
  whole to one split, so train and val share none.
- **Determinism.** One process reads, in a fixed order (inputs as given, folders by name).
  Tokenizing processes get whole records and their results are taken in the order the batches
  were sent; a document's tokens depend on its text alone. The shards, tokenizer.json and
  dataset.json (but its `created_at`) are therefore the same bytes whatever `workers` is.
- **Memory** is bounded by batches: at most 2 × workers of about `BATCH_BYTES` of text in
  flight, and shards are streamed to disk (`store.data.shards.ShardWriter`), so the peak does
  not grow with the corpus or with `shard_tokens` ("Datasets", "Memory of a prepare").
- **Failure.** The out folder must be new or empty. Anything that stops a prepare (bad input
  with `strict`, `should_stop`, an error, Ctrl-C) removes what it wrote; dataset.json is
  written last, so a folder without it is never a dataset.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass
from fractions import Fraction
from importlib.metadata import PackageNotFoundError, version
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from trainctl.store.data.corpus import (
    MAX_DOCUMENT_BYTES,
    Limits,
    PrepareStopped,
    Problem,
    Record,
    Skipped,
    Source,
    find_sources,
    parse_batch,
    read_batches,
)
from trainctl.store.data.datasets import (
    DATASET_FILE,
    SPLITS,
    TOKENIZER_FILE,
    Dataset,
    Split,
    TokenDtype,
    TokenizerRef,
    read_tokenizer_file,
    token_dtype,
    write_dataset,
)
from trainctl.store.data.shards import BYTE_VOCAB, DataError, ShardWriter
from trainctl.store.data.tokenizer import end_of_text_id, load_tokenizer, vocab_size
from trainctl.store.data.walk import Bounds

PROGRESS_SECONDS = 0.5
IN_FLIGHT_PER_WORKER = 2


__all__ = ["PrepareProgress", "PrepareStopped", "prepare_dataset"]


@dataclass(frozen=True)
class PrepareProgress:
    documents: int
    tokens: int
    bytes: int
    """UTF-8 bytes of the documents' text."""
    seconds: float
    skipped: int = 0


def prepare_dataset(
    inputs: Sequence[Path],
    out: Path,
    tokenizer: Path | None,
    *,
    text_field: str = "text",
    text_column: str = "text",
    val_fraction: float = 0.05,
    shard_tokens: int = 100_000_000,
    workers: int | None = None,
    strict: bool = False,
    max_document_bytes: int = MAX_DOCUMENT_BYTES,
    on_progress: Callable[[PrepareProgress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Dataset:
    """Tokenize the documents of `inputs` (with `tokenizer`, a tokenizer.json or a folder
    holding one; None: bytes) into a dataset folder `out`."""
    if max_document_bytes < 1:
        raise DataError(f"max_document_bytes {max_document_bytes} is not positive")
    if not 0 <= val_fraction < 1:
        raise DataError(f"val_fraction {val_fraction} is not in [0, 1)")
    if shard_tokens < 1:
        raise DataError(f"shard_tokens {shard_tokens} is not positive")
    workers = len(os.sched_getaffinity(0)) if workers is None else workers
    if workers < 1:
        raise DataError(f"workers {workers} is not positive")
    limits = Limits(max_document_bytes=max_document_bytes, should_stop=should_stop)
    sources = find_sources(inputs, Bounds(check=limits.check))
    folder = _OutFolder.claim(Path(out))
    try:
        tokens = _install_tokenizer(tokenizer, folder)
        job = _Job(sources, folder, tokens, text_field, text_column, val_fraction, strict)
        dataset = job.run(shard_tokens, workers, limits, on_progress)
        folder.file(DATASET_FILE)
        write_dataset(dataset)
    except BaseException:
        folder.remove()
        raise
    return dataset


@dataclass(frozen=True)
class _Tokens:
    """What tokenizing needs and dataset.json records of it."""

    path: Path | None
    """The dataset's own copy of tokenizer.json; None: bytes."""
    ref: TokenizerRef
    vocab_size: int

    @property
    def dtype(self) -> TokenDtype:
        return token_dtype(self.vocab_size)


def _install_tokenizer(tokenizer: Path | None, folder: _OutFolder) -> _Tokens:
    """Copy the tokenizer into the dataset, and read it from there: what tokenizes is what
    the dataset records."""
    if tokenizer is None:
        return _Tokens(None, TokenizerRef("bytes"), BYTE_VOCAB)
    given = Path(tokenizer)
    if given.is_dir():
        given = given / TOKENIZER_FILE
    if not os.path.lexists(given):
        raise DataError(f"{given}: no such tokenizer file")
    data = read_tokenizer_file(given)
    path = folder.file(TOKENIZER_FILE)
    with open(path, "xb") as f:  # "x": never through a link planted in the new folder
        f.write(data)
    loaded = load_tokenizer(path)
    ref = TokenizerRef("bpe", hashlib.sha256(data).hexdigest(), end_of_text_id(loaded, given))
    return _Tokens(path, ref, vocab_size(loaded))


class _OutFolder:
    """The dataset folder: new or empty when claimed; remembers what a prepare writes there,
    to remove it if the prepare does not finish."""

    def __init__(self, path: Path, created: bool) -> None:
        self.path, self.created = path, created
        self.names: list[str] = []

    @classmethod
    def claim(cls, path: Path) -> _OutFolder:
        if path.is_dir():
            if any(path.iterdir()):
                raise DataError(f"{path} is not empty; prepare into a new or empty folder")
            return cls(path, created=False)
        if path.exists():
            raise DataError(f"{path} is a file; prepare into a new or empty folder")
        path.mkdir(parents=True)
        return cls(path, created=True)

    def file(self, name: str) -> Path:
        self.names.append(name)
        return self.path / name

    def remove(self) -> None:
        for name in self.names:
            (self.path / name).unlink(missing_ok=True)
            (self.path / f"{name}.tmp").unlink(missing_ok=True)
        for tmp in self.path.glob(f".{DATASET_FILE}.*.tmp"):  # write_dataset's, if it failed
            tmp.unlink(missing_ok=True)
        if self.created:
            with suppress(OSError):  # someone else put something there: theirs to keep
                self.path.rmdir()


class _SplitWriter:
    """One split's shards, `<split>_NNNNNN.bin` of `shard_tokens` each (the last fewer)."""

    def __init__(self, folder: _OutFolder, split: str, dtype: str, shard_tokens: int) -> None:
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, dtype, shard_tokens
        self.shards: list[str] = []
        self.current: ShardWriter | None = None
        self.tokens = self.documents = self.bytes = 0

    def add(self, tokens: np.ndarray) -> None:
        while tokens.size:
            if self.current is None:
                name = f"{self.split}_{len(self.shards):06d}.bin"
                self.current = ShardWriter(self.folder.file(name), self.dtype)
                self.shards.append(name)
            take = tokens[: self.shard_tokens - self.current.count]
            self.current.append(take)
            self.tokens += take.size
            tokens = tokens[take.size :]
            if self.current.count == self.shard_tokens:
                self.close()

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None

    def abort(self) -> None:
        if self.current is not None:
            self.current.abort()
            self.current = None

    def result(self) -> Split:
        return Split(list(self.shards), self.tokens, self.documents, self.bytes)


class _ValRule:
    """Document i is held out when ⌊(i+1)·f⌋ > ⌊i·f⌋ (exact: f is a Fraction)."""

    def __init__(self, val_fraction: float) -> None:
        f = Fraction(val_fraction).limit_denominator(1_000_000)
        self.p, self.q = f.numerator, f.denominator
        self.index = 0
        self.held_out = False
        self.starting = True

    @property
    def first_held_out(self) -> int:
        """The index of the first document held out: the least i with (i+1)·p ≥ q."""
        return -(-self.q // self.p) - 1 if self.p else -1

    def assign(self, last: np.ndarray) -> np.ndarray:
        """Per text (a document, or a piece of one): whether it goes to val."""
        out = np.empty(len(last), dtype=bool)
        for k, ends in enumerate(last.tolist()):
            if self.starting:
                i = self.index
                self.held_out = (i + 1) * self.p // self.q > i * self.p // self.q
            out[k] = self.held_out
            self.starting = ends
            self.index += ends
        return out


class _Job:
    def __init__(
        self,
        sources: list[Source],
        folder: _OutFolder,
        tokens: _Tokens,
        text_field: str,
        text_column: str,
        val_fraction: float,
        strict: bool,
    ) -> None:
        self.sources, self.folder, self.tokens = sources, folder, tokens
        self.text_field, self.text_column = text_field, text_column
        self.val_fraction, self.strict = val_fraction, strict
        self.rule = _ValRule(val_fraction)
        self.skipped = Skipped()

    def run(
        self,
        shard_tokens: int,
        workers: int,
        limits: Limits,
        on_progress: Callable[[PrepareProgress], None] | None,
    ) -> Dataset:
        writers = {s: _SplitWriter(self.folder, s, self.tokens.dtype, shard_tokens) for s in SPLITS}
        rule = self.rule
        self.skipped = Skipped(max_document_bytes=limits.max_document_bytes)
        progress = _Progress(on_progress, writers, self.skipped)
        batches = read_batches(self.sources, text_column=self.text_column, limits=limits)
        encoder = _Encoder(self.tokens.path, self.tokens.ref.eot_id, self.text_field)
        try:
            with closing(_encoded(batches, encoder, workers)) as results:
                for encoded in results:
                    self._take(encoded, rule, writers)
                    progress.report()
                    limits.check()
            for w in writers.values():
                w.close()
        except BaseException:
            for w in writers.values():
                w.abort()
            raise
        progress.report(force=True)
        return self._dataset({s: w.result() for s, w in writers.items()})

    def _take(self, encoded: Encoded, rule: _ValRule, writers: dict[str, _SplitWriter]) -> None:
        if encoded.problems and self.strict:
            raise DataError(f"{encoded.problems[0]} (strict: a bad document stops the prepare)")
        self.skipped.add(encoded.problems, encoded.skipped, encoded.oversized)
        val = rule.assign(encoded.last)
        for split, mask in (("train", ~val), ("val", val)):
            writer = writers[split]
            writer.add(encoded.tokens[np.repeat(mask, encoded.counts)])
            writer.documents += int(np.count_nonzero(encoded.last & mask))
            writer.bytes += int(encoded.nbytes[mask].sum())

    def _dataset(self, splits: dict[str, Split]) -> Dataset:
        documents = sum(s.documents for s in splits.values())
        if documents == 0:
            first = f"; the first: {self.skipped.examples[0]}" if self.skipped.examples else ""
            raise DataError(f"no documents to prepare ({self.skipped.documents} skipped{first})")
        if self.val_fraction > 0 and splits["val"].documents == 0:
            raise DataError(
                f"too few documents ({documents}) to hold out {self.val_fraction:g} of them for "
                f"validation: that takes {self.rule.first_held_out + 1}; give more documents, "
                "or a val fraction of 0"
            )
        return Dataset(
            folder=self.folder.path,
            tokenizer=self.tokens.ref,
            vocab_size=self.tokens.vocab_size,
            token_dtype=self.tokens.dtype,
            splits=splits,
            sources=[{"path": str(s.path), "size": s.size} for s in self.sources],
            skipped=self.skipped.to_json(),
            trainctl_version=_trainctl_version(),
        )


class _Progress:
    def __init__(
        self,
        on_progress: Callable[[PrepareProgress], None] | None,
        writers: dict[str, _SplitWriter],
        skipped: Skipped,
    ) -> None:
        self.on_progress, self.writers, self.skipped = on_progress, writers, skipped
        self.started = self.last = time.monotonic()

    def report(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.on_progress is None or not (force or now - self.last >= PROGRESS_SECONDS):
            return
        self.last = now
        w = self.writers.values()
        self.on_progress(
            PrepareProgress(
                documents=sum(s.documents for s in w),
                tokens=sum(s.tokens for s in w),
                bytes=sum(s.bytes for s in w),
                seconds=now - self.started,
                skipped=self.skipped.documents,
            )
        )


def _trainctl_version() -> str:
    try:
        return version("trainctl")
    except PackageNotFoundError:
        return "unknown"


# --- tokenizing, in worker processes -------------------------------------------------------


@dataclass
class Encoded:
    """A batch's tokens: each text's, one after another, a document's last followed by its
    end-of-text; per text its token count, text bytes and whether it ends its document."""

    tokens: np.ndarray
    counts: np.ndarray
    nbytes: np.ndarray
    last: np.ndarray
    problems: list[Problem]
    skipped: int
    oversized: int


class _Encoder:
    def __init__(self, tokenizer: Path | None, eot_id: int | None, text_field: str) -> None:
        self.tokenizer_path, self.eot_id, self.text_field = tokenizer, eot_id, text_field
        self.tokenizer: Any = None  # loaded where it tokenizes

    def __call__(self, records: list[Record]) -> Encoded:
        parsed = parse_batch(records, self.text_field)
        last = np.array(parsed.last, dtype=bool)
        if self.tokenizer_path is None:
            data = "".join(parsed.texts).encode("utf-8")
            tokens = np.frombuffer(data, dtype=np.uint8)
            counts = np.array(parsed.nbytes, dtype=np.int64)
        else:
            tokens, counts = self._bpe(parsed.texts, parsed.last)
        nbytes = np.array(parsed.nbytes, dtype=np.int64)
        return Encoded(
            tokens, counts, nbytes, last, parsed.problems, parsed.skipped, parsed.oversized
        )

    def _bpe(self, texts: list[str], last: list[bool]) -> tuple[np.ndarray, np.ndarray]:
        # Special tokens of a post-processor (a BOS, a CLS) are left out: documents are
        # separated by end-of-text only, the same for every tokenizer.
        if self.tokenizer is None:
            assert self.tokenizer_path is not None, "bytes need no tokenizer"
            self.tokenizer = load_tokenizer(self.tokenizer_path)
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        ids = [e.ids for e in encode(texts, add_special_tokens=False)]
        for doc, ends in zip(ids, last, strict=True):
            if ends:
                doc.append(self.eot_id)
        counts = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        tokens = np.fromiter(chain.from_iterable(ids), dtype=np.uint32, count=int(counts.sum()))
        return tokens, counts


def _encoded(
    batches: Iterator[list[Record]], encoder: _Encoder, workers: int
) -> Generator[Encoded, None, None]:
    """Each batch's Encoded, in order: here, or in `workers` processes."""
    if workers == 1:
        with _one_thread():
            for records in batches:
                yield encoder(records)
        return
    pool = ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),  # no fork of a threaded process
        initializer=_start_worker,
        initargs=(encoder.tokenizer_path, encoder.eot_id, encoder.text_field),
    )
    pending: deque[Future[Encoded]] = deque()
    try:
        for records in batches:
            pending.append(pool.submit(_encode_in_worker, records))
            if len(pending) >= IN_FLIGHT_PER_WORKER * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def _one_thread() -> Iterator[None]:
    """tokenizers' batch calls use every core unless told otherwise, and it reads the
    setting at each call: one process tokenizes on one core."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


_WORKER: _Encoder | None = None


def _start_worker(tokenizer: Path | None, eot_id: int | None, text_field: str) -> None:
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the reading process's to handle
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = _Encoder(tokenizer, eot_id, text_field)


def _encode_in_worker(records: list[Record]) -> Encoded:
    assert _WORKER is not None, "a tokenizing process runs _start_worker first"
    return _WORKER(records)
