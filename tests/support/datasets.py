"""Datasets for tests, made as a prepare makes them: a byte-level BPE tokenizer trained here on
stdlib source, token shards (store.data.shards.write_shard) and dataset.json, written last
(store.data.datasets.write_dataset)."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from trainctl.store.data import tokenizer as store_tokenizer
from trainctl.store.data.datasets import (
    TOKENIZER_FILE,
    Dataset,
    Split,
    TokenizerRef,
    byte_level,
    token_dtype,
    write_dataset,
)
from trainctl.store.data.shards import stdlib_source_files, write_shard

EOT = "<|endoftext|>"


def stdlib_texts(max_bytes: int = 400_000) -> list[str]:
    """Python standard library source files as documents, up to `max_bytes` in all."""
    texts, total = [], 0
    for path in stdlib_source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text.encode())
        if total >= max_bytes:
            break
    return texts


def stdlib_files(max_bytes: int) -> list[Path]:
    """Standard library source files, in order, up to about `max_bytes`."""
    files, total = [], 0
    for path in stdlib_source_files():
        files.append(path)
        total += path.stat().st_size
        if total >= max_bytes:
            break
    return files


def train_stdlib_tokenizer(out: Path, vocab: int = 1024, max_bytes: int = 1_500_000) -> Path:
    """The store's own trainer (what `trainctl data tokenizer train` runs) on stdlib source."""
    return store_tokenizer.train_tokenizer(stdlib_files(max_bytes), out, vocab)


def stdlib_documents(max_bytes: int = 400_000) -> list[str]:
    """The same source cut into many documents: its top-level blocks (two blank lines apart)."""
    return [block for text in stdlib_texts(max_bytes) for block in text.split("\n\n\n") if block]


def train_tokenizer(out: Path, texts: Sequence[str], vocab_size: int = 512) -> Path:
    """A byte-level BPE with an end-of-text token (id 0), saved as `out`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out))
    return out


def _split(folder: Path, name: str, docs: list[list[int]], texts: list[str], dtype: str) -> Split:
    tokens = np.array([t for doc in docs for t in doc], dtype=np.int64)
    shard = f"{name}_000000.bin"
    write_shard(folder / shard, tokens, dtype=dtype)
    return Split([shard], len(tokens), len(docs), sum(len(t.encode()) for t in texts))


def write_bpe_dataset(
    folder: Path,
    tokenizer_file: Path,
    texts: Sequence[str],
    *,
    val_docs: int = 1,
    vocab_size: int | None = None,
) -> Dataset:
    """Encode `texts` (the last `val_docs` held out), each document followed by end-of-text."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_file, folder / TOKENIZER_FILE)
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    eot_id = tokenizer.token_to_id(EOT)
    vocab = vocab_size or tokenizer.get_vocab_size()
    docs = [[*e.ids, eot_id] for e in tokenizer.encode_batch(list(texts))]
    cut = len(docs) - val_docs
    splits = {
        "train": _split(folder, "train", docs[:cut], list(texts[:cut]), token_dtype(vocab)),
        "val": _split(folder, "val", docs[cut:], list(texts[cut:]), token_dtype(vocab)),
    }
    sha256 = hashlib.sha256((folder / TOKENIZER_FILE).read_bytes()).hexdigest()
    dataset = Dataset(
        folder, TokenizerRef("bpe", sha256, eot_id), vocab, token_dtype(vocab), splits
    )
    write_dataset(dataset)
    return dataset


def write_byte_dataset(folder: Path, texts: Sequence[str], *, val_docs: int = 1) -> Dataset:
    """The same texts as byte-level tokens (a token is a byte)."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = [list(t.encode()) for t in texts]
    cut = len(docs) - val_docs
    splits = {
        "train": _split(folder, "train", docs[:cut], list(texts[:cut]), "uint16"),
        "val": _split(folder, "val", docs[cut:], list(texts[cut:]), "uint16"),
    }
    dataset = byte_level(folder, splits)
    write_dataset(dataset)
    return dataset
