"""Text in and out of a model: a checkpoint's or a dataset's tokenizer as encode and decode
(docs/design/data.md, "Datasets").

A byte-level model's tokens are the UTF-8 bytes of its text; a bpe one's come from the
tokenizer.json its dataset was prepared with, which its checkpoints carry. No torch here: the
API encodes prompts with it at submit (to refuse one that does not fit the model's context),
and the worker decodes completions with it (`worker.models.generation`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from trainctl.store.checkpoints.info import TokenizerId
from trainctl.store.data.datasets import TOKENIZER_FILE
from trainctl.store.data.tokenizer import EOT_NAMES, vocab_size
from trainctl.store.data.shards import BYTE_VOCAB, DataError

# Tokens of the prompt an incremental decoder keeps as context (see IncrementalDecoder).
DECODE_CONTEXT_TOKENS = 4


class TextCodec:
    """A checkpoint's text and token ids: bytes (a token is a byte, ids 0..255) or the
    `tokenizers.Tokenizer` of its tokenizer.json. Sample runs and training samples share it."""

    def __init__(self, tokenizer: Any | None = None) -> None:
        self.tokenizer = tokenizer
        # Ids below this decode to text; generation samples among them only.
        self.vocab_size = BYTE_VOCAB if tokenizer is None else vocab_size(tokenizer)
        # The end-of-text token ends a completion. Bytes have none: byte-level data runs its
        # documents together, so nothing marks an end.
        self.eot_id = None if tokenizer is None else _eot_id(tokenizer)

    @classmethod
    def from_tokenizer_json(cls, data: bytes, source: str) -> TextCodec:
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_str(data.decode("utf-8")))
        except Exception as exc:  # tokenizers raises plain Exception for what it cannot parse
            raise DataError(
                f"{source}: not a tokenizer.json that tokenizers loads ({exc})"
            ) from None

    @property
    def kind(self) -> str:
        return "bytes" if self.tokenizer is None else "bpe"

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return list(text.encode("utf-8"))
        # As prepare encodes documents: no post-processor's BOS or CLS (store.data.prepare).
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`; bytes that are no complete UTF-8 character become U+FFFD."""
        if self.tokenizer is None:
            return bytes(i for i in ids if i < BYTE_VOCAB).decode("utf-8", errors="replace")
        return str(self.tokenizer.decode(list(ids)))

    def decoder(self, context: Sequence[int] = ()) -> IncrementalDecoder:
        """An incremental decoder of the tokens that follow `context` (a prompt's ids)."""
        return IncrementalDecoder(self.decode, context)


def _eot_id(tokenizer: Any) -> int | None:
    for name in EOT_NAMES:
        if (token_id := tokenizer.token_to_id(name)) is not None:
            return int(token_id)
    return None


class IncrementalDecoder:
    """Text of tokens as they come, emitting only text that decodes cleanly.

    A character may be split across tokens (a byte is a token, or a BPE token ends inside a
    UTF-8 sequence): until its last token arrives the text ends in U+FFFD, and is held back.
    Each push decodes only the tokens since the last emitted text, behind the tokens of that
    text as context: a decoder that treats a sequence's start specially (SentencePiece drops
    a leading space) sees the same start in both decodes, and their difference is the new
    text.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], context: Sequence[int]) -> None:
        self._decode = decode
        self._ids = list(context[-DECODE_CONTEXT_TOKENS:]) if context else []
        self._start = 0  # first context token of the next decode
        self._read = len(self._ids)  # tokens before this index are emitted

    def push(self, token: int) -> str:
        """Add a token; return the text that is now complete ("" while a character is split)."""
        self._ids.append(token)
        return self._emit(final=False)

    def flush(self) -> str:
        """The text still held back, unfinished characters as U+FFFD: at the end."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        before = self._decode(self._ids[self._start : self._read])
        text = self._decode(self._ids[self._start :])
        if not final and (len(text) <= len(before) or text.endswith("\ufffd")):
            return ""
        self._start, self._read = self._read, len(self._ids)
        return text[len(before) :]


def build_codec(tokenizer: TokenizerId | None, tokenizer_json: bytes | None) -> TextCodec | None:
    """The codec of a run's or a checkpoint's tokenizer; None where it is unknown (synthetic
    tokens, bare shards): such a model continues token ids, not text.

    `tokenizer_json` is a bpe tokenizer's file (what a checkpoint saves, what a train run read
    from its dataset); it must be the one `tokenizer` names.
    """
    if tokenizer is None:
        return None
    if tokenizer.kind == "bytes":
        return TextCodec()
    if tokenizer_json is None:
        raise DataError(f"{tokenizer.describe()}: its {TOKENIZER_FILE} is missing")
    if tokenizer.sha256 is not None and hashlib.sha256(tokenizer_json).hexdigest() != (
        tokenizer.sha256
    ):
        raise DataError(f"{TOKENIZER_FILE} is not the tokenizer recorded ({tokenizer.describe()})")
    return TextCodec.from_tokenizer_json(tokenizer_json, TOKENIZER_FILE)
