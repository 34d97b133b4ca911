"""Tokenizers: training a byte-level BPE, and loading any `tokenizer.json` that Hugging Face
`tokenizers` loads (`trainctl data tokenizer train`, `data prepare --tokenizer`;
docs/design/data.md, "Datasets").

The trained tokenizer is GPT-2's kind: the ByteLevel pre-tokenizer (its regex, no prefix
space) and decoder, so any text round-trips, and `<|endoftext|>` as id 0. Training reads the
same documents as a prepare (`store.data.corpus`) and is deterministic: the same inputs and
settings give the same file, byte for byte (the BPE trainer breaks ties between equally
frequent pairs by the pair itself, and word counts do not depend on reading order).

Nothing is downloaded: a tokenizer is a file the user trained or brought.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainctl.store.data.corpus import (
    MAX_DOCUMENT_BYTES,
    Parsed,
    Skipped,
    find_sources,
    iter_texts,
)
from trainctl.store.data.datasets import TOKENIZER_FILE, read_tokenizer_file
from trainctl.store.data.shards import BYTE_VOCAB, DataError

EOT = "<|endoftext|>"
# What other tokenizers call the token between documents: GPT-2 and ours, Llama 3,
# Llama 2 / Mistral / T5, Gemma.
EOT_NAMES = (EOT, "<|end_of_text|>", "</s>", "<eos>")
MIN_VOCAB = BYTE_VOCAB + 1
MAX_VOCAB = 1 << 24
PROGRESS_SECONDS = 0.5


@dataclass(frozen=True)
class TrainProgress:
    phase: str
    """reading (documents are counted as they go in), merging, or done."""
    documents: int
    bytes: int
    """UTF-8 bytes of the documents read."""
    seconds: float
    skipped: Skipped = field(default_factory=Skipped)


def train_tokenizer(
    inputs: Sequence[Path],
    out_dir: Path,
    vocab_size: int,
    *,
    text_field: str = "text",
    text_column: str = "text",
    max_document_bytes: int = MAX_DOCUMENT_BYTES,
    on_progress: Callable[[TrainProgress], None] | None = None,
) -> Path:
    """Train a byte-level BPE of at most `vocab_size` tokens (fewer when the text has fewer
    pairs to merge) on the documents of `inputs`; write `out_dir/tokenizer.json`. Documents
    longer than `max_document_bytes` are skipped, as a prepare skips them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise DataError(f"vocab size {vocab_size} is not in {MIN_VOCAB}..{MAX_VOCAB}")
    out = Path(out_dir) / TOKENIZER_FILE
    if out.exists():
        raise DataError(f"{out} exists; choose another folder or remove it")
    sources = find_sources(inputs)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    progress = _Progress(on_progress, max_document_bytes)
    texts = _counted(iter_texts(sources, progress.skipped, text_field=text_field,
                                text_column=text_column), progress)  # fmt: skip
    tokenizer.train_from_iterator(texts, trainer)
    if progress.documents == 0:
        raise DataError(f"no documents to train on ({_skipped_line(progress.skipped)})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{TOKENIZER_FILE}.{os.getpid()}.tmp")
    try:
        tokenizer.save(str(tmp))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    progress.report("done", force=True)
    return out


class _Progress:
    def __init__(
        self, on_progress: Callable[[TrainProgress], None] | None, max_document_bytes: int
    ) -> None:
        self.on_progress = on_progress
        self.started = self.last = time.monotonic()
        self.documents = self.bytes = 0
        self.skipped = Skipped(max_document_bytes=max_document_bytes)

    def report(self, phase: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.on_progress is None or not (force or now - self.last >= PROGRESS_SECONDS):
            return
        self.last = now
        self.on_progress(
            TrainProgress(phase, self.documents, self.bytes, now - self.started, self.skipped)
        )


def _counted(batches: Iterator[Parsed], progress: _Progress) -> Iterator[str]:
    for parsed in batches:
        progress.documents += sum(parsed.last)
        progress.bytes += sum(parsed.nbytes)
        progress.report("reading")
        yield from parsed.texts
    progress.report("merging", force=True)  # all read: the trainer merges now


def _skipped_line(skipped: Skipped) -> str:
    first = f"; the first: {skipped.examples[0]}" if skipped.examples else ""
    return f"{skipped.documents} skipped{first}"


# --- any tokenizer.json -------------------------------------------------------------------


def load_tokenizer(path: Path) -> Any:
    """A `tokenizers.Tokenizer` from a file, read as every data file is (a regular file,
    never blocking, bounded); DataError if `tokenizers` cannot load it."""
    from tokenizers import Tokenizer

    if not os.path.lexists(path):
        raise DataError(f"{path}: no such tokenizer file")
    data = read_tokenizer_file(Path(path))
    try:
        return Tokenizer.from_buffer(data)
    except Exception as exc:  # tokenizers raises plain Exception for a file it cannot parse
        raise DataError(f"{path}: not a tokenizer.json that tokenizers loads ({exc})") from None


def end_of_text_id(tokenizer: Any, path: Path) -> int:
    for name in EOT_NAMES:
        if (token_id := tokenizer.token_to_id(name)) is not None:
            return int(token_id)
    raise DataError(
        f"{path} has no end-of-text token to put between documents (one of {', '.join(EOT_NAMES)})"
    )


def vocab_size(tokenizer: Any) -> int:
    """Every id it can produce fits below this: its size with added tokens, or one above its
    largest id if its ids have gaps."""
    largest = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    return max(int(tokenizer.get_vocab_size(with_added_tokens=True)), int(largest) + 1)
