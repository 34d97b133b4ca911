"""Generation: continue prompts with a model, token by token through a KV cache, and stream the
text as it is produced (sample runs, and samples during training).

A prompt is read in one forward pass (the prefill), then each step feeds one token and reads
the keys and values of the past from `worker.models.gpt.KVCache`, as the training forward would
have computed them. Prompts of a batch may differ in length: every row starts at position 0
(as in training) and the batch is prefilled up to its shortest prompt; a longer prompt's
remaining tokens are then fed one per step in place of a sample, as Llama's reference
decoder does. Decoding runs in eval mode under `torch.inference_mode`, with the training
rules for autocast (bf16 on CUDA, none on CPU), and samples with a `torch.Generator` on the
model's device seeded from the settings: the same seed, prompts and hardware give the same
text.

Text goes in and out through a `TextCodec`: a byte-level checkpoint's tokens are bytes, a bpe
one's come from the tokenizer.json saved with it (docs/design/data.md, "Datasets").
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from trainctl.store.checkpoints.info import CheckpointInfo
from trainctl.store.checkpoints.manifests import verify_manifest
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.codec import IncrementalDecoder, TextCodec, build_codec
from trainctl.store.data.datasets import TOKENIZER_FILE
from trainctl.store.exceptions import CheckpointCorrupt, CheckpointNotFound
from trainctl.store.models.generation import (
    GREEDY_BELOW_TEMPERATURE,
    GenerationSettings,
    check_context,
)
from trainctl.worker.checkpoints.state import load_checkpoint
from trainctl.worker.models import LanguageModel, build_model
from trainctl.worker.stops import maybe_stop

FinishReason = Literal["eot", "stop", "length"]
# --- sampling ------------------------------------------------------------------------------


def sample_next(
    logits: torch.Tensor, settings: GenerationSettings, generator: torch.Generator | None
) -> torch.Tensor:
    """Each row's next token from its logits: (B, vocab) -> (B,).

    Temperature 0 (or one below `GREEDY_BELOW_TEMPERATURE`) takes the most likely token;
    otherwise the logits are divided by the temperature, cut to the top k and to the nucleus
    of mass top_p, and sampled from.
    """
    if settings.temperature < GREEDY_BELOW_TEMPERATURE:
        return logits.argmax(dim=-1)
    # Each row's largest logit is shifted to 0 first, so that dividing cannot overflow: the
    # quotients are <= 0, the largest exactly 0, and a far smaller one becomes -inf, which
    # softmax reads as probability 0. Unshifted, z / T is inf for any |z| > 3.4e38 * T: with
    # the default softcap of 15, every temperature below 4.4e-38, and with no softcap no
    # bound at all; softmax of inf is NaN. (Softmax shifts by the max itself: the
    # probabilities are the same.)
    logits = logits.float()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / settings.temperature  # (B, vocab)
    if settings.top_k is not None and settings.top_k < logits.shape[-1]:
        kth = torch.topk(logits, settings.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -torch.inf)
    if settings.top_p < 1:
        logits = nucleus(logits, settings.top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits with every token outside the nucleus at -inf: the most likely tokens whose
    probabilities reach `top_p` together. The most likely token always stays."""
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = torch.softmax(ordered, dim=-1)
    # A token goes when the tokens more likely than it already hold top_p. The most likely
    # one stays whatever top_p is: compared in float32, a top_p below 1.4e-45 is 0, and
    # 0 >= 0 would drop every token (softmax over nothing is NaN).
    outside = probs.cumsum(dim=-1) - probs >= top_p
    outside[..., 0] = False
    return logits.scatter(-1, order, ordered.masked_fill(outside, -torch.inf))


# --- decoding ------------------------------------------------------------------------------


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """Training's rule (worker.training.loop.build_training): bf16 autocast on CUDA, none on CPU."""
    return torch.bfloat16 if device.type == "cuda" else None


def cache_dtype(model: LanguageModel, device: torch.device) -> torch.dtype:
    """What a KV cache keeps keys and values in: the dtype attention computes in, bf16 under
    autocast, the weights' otherwise."""
    return autocast_dtype(device) or next(model.parameters()).dtype


@contextmanager
def step_mode(device: torch.device) -> Iterator[None]:
    """No autograd, and training's autocast (generation's steps, the eval scorer's forwards).
    Entered per step, not around the whole decode: a generator suspended between steps must
    not leave its caller in inference mode."""
    dtype = autocast_dtype(device)
    with (
        torch.inference_mode(),
        torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None),
    ):
        yield


def _next_logits(model: LanguageModel, tokens: torch.Tensor, pos: int, cache: Any) -> torch.Tensor:
    """Logits of the token at `pos` given tokens[:, :pos]: (B, vocab). With a cache, only
    the positions it lacks are fed; without, the whole prefix is recomputed."""
    if cache is None:
        return model.next_logits(tokens[:, :pos])
    return model.forward_cached(tokens[:, cache.pos : pos], cache, last_only=True)[:, -1]


def _check_prompts(
    model: LanguageModel, prompts: Sequence[Sequence[int]], max_new_tokens: int
) -> None:
    if not prompts:
        raise ValueError("no prompts to continue")
    vocab = model.config.vocab_size
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {i} is empty: there is nothing to continue")
        if not all(0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt {i} holds a token id outside the model's vocab_size {vocab}")
    check_context(max(map(len, prompts)), max_new_tokens, model.config.max_seq_len)


class _Batch:
    """One batch's decoding state: the tokens so far (every prompt from position 0, padded
    on the right), the KV cache, and the sampler's generator."""

    def __init__(
        self,
        model: LanguageModel,
        prompts: Sequence[Sequence[int]],
        settings: GenerationSettings,
        vocab_size: int | None,
        use_cache: bool,
    ) -> None:
        device = next(model.parameters()).device
        self.model, self.settings, self.vocab_size, self.device = (
            model,
            settings,
            vocab_size,
            device,
        )
        self.lengths = [len(p) for p in prompts]
        self.total = max(self.lengths) + settings.max_new_tokens
        self.tokens = torch.zeros((len(prompts), self.total), dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            self.tokens[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        self.cache = self._build_cache() if use_cache else None
        self.generator = torch.Generator(device=device).manual_seed(settings.seed)

    def _build_cache(self) -> Any:
        dtype = cache_dtype(self.model, self.device)
        return self.model.new_cache(len(self.lengths), self.total, self.device, dtype)

    def step(self, pos: int) -> list[int | None]:
        """Choose the token at `pos`; None for the rows that still read their prompt there."""
        logits = _next_logits(self.model, self.tokens, pos, self.cache)[:, : self.vocab_size]
        chosen = sample_next(logits, self.settings, self.generator)
        reading = [pos < n for n in self.lengths]
        if any(reading):  # a longer prompt's own token, not the sample
            keep = torch.tensor(reading, device=self.device)
            chosen = torch.where(keep, self.tokens[:, pos], chosen)
        self.tokens[:, pos] = chosen
        return [None if r else t for r, t in zip(reading, chosen.tolist(), strict=True)]


def decode_steps(
    model: LanguageModel,
    prompts: Sequence[Sequence[int]],
    settings: GenerationSettings,
    *,
    vocab_size: int | None = None,
    use_cache: bool = True,
) -> Generator[list[int | None], None, None]:
    """Each step's token for every row: the sampled one, or None where the row is still
    reading its prompt. Runs until every row has had `max_new_tokens`; stop iterating (and
    close the iterator) as soon as the rows are done.

    `vocab_size`: sample only among ids below it (those a codec decodes). `use_cache=False`
    recomputes the whole prefix every step: what the cache saves (tests and bench).
    """
    _check_prompts(model, prompts, settings.max_new_tokens)
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        with step_mode(device):
            batch = _Batch(model, prompts, settings, vocab_size, use_cache)
        for pos in range(min(batch.lengths), batch.total):
            maybe_stop()  # per token: a sample run stops at a cancel (worker.stops)
            with step_mode(device):
                step = batch.step(pos)
            yield step
    finally:
        model.train(was_training)


def generate_tokens(
    model: LanguageModel,
    prompts: Sequence[Sequence[int]],
    settings: GenerationSettings,
    *,
    eot_id: int | None = None,
    vocab_size: int | None = None,
    use_cache: bool = True,
) -> list[list[int]]:
    """Token ids continuing each prompt of ids, up to `eot_id` (left out) or max_new_tokens.

    For a model whose tokenizer is unknown; stop strings need text, so they are refused.
    """
    if settings.stop:
        raise ValueError("stop strings need a tokenizer to decode text; this continues token ids")
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    steps = decode_steps(model, prompts, settings, vocab_size=vocab_size, use_cache=use_cache)
    with closing(steps):
        for step in steps:
            for row, token in enumerate(step):
                if token is None or done[row]:
                    continue
                if token == eot_id:
                    done[row] = True
                    continue
                out[row].append(token)
                done[row] = len(out[row]) >= settings.max_new_tokens
            if all(done):
                break
    return out


# --- text ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextPiece:
    """New text of one completion, as it is produced."""

    index: int
    """The prompt it continues (its position in the batch)."""
    text: str
    """Possibly empty: a completion's last piece may only say that it ended."""
    finish_reason: FinishReason | None = None
    """Set on a completion's last piece: eot (end-of-text token), stop (a stop string) or
    length (max_new_tokens)."""


@dataclass(frozen=True)
class Completion:
    prompt: str
    text: str
    """Everything generated before the end-of-text token or the stop string."""
    token_ids: list[int]
    """Every token generated, the one that completed a stop string included, end-of-text
    excluded."""
    finish_reason: FinishReason


@dataclass
class _Row:
    """One completion as it is decoded: its text so far, and how much of it is streamed.

    Text that could be the start of a stop string is held back until it is clear that it
    is not (a streamed piece cannot be taken back): with stop "\\n\\n", a lone "\\n" waits.
    """

    prompt: str
    prompt_ids: list[int]
    decoder: IncrementalDecoder
    settings: GenerationSettings
    eot_id: int | None
    text: str = ""
    sent: int = 0
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    def take(self, token: int) -> str:
        """Add a generated token; return the text that may be streamed now."""
        if token == self.eot_id:
            return self._finish("eot")
        self.token_ids.append(token)
        self.text += self.decoder.push(token)
        if self._cut_at_stop():
            return self._finish("stop")
        if len(self.token_ids) >= self.settings.max_new_tokens:
            return self._finish("length")
        return self._send(len(self.text) - self._maybe_stop_length())

    def _finish(self, reason: FinishReason) -> str:
        if reason != "stop":
            self.text += self.decoder.flush()
            if self._cut_at_stop():
                reason = "stop"
        self.finish_reason = reason
        return self._send(len(self.text))

    def _cut_at_stop(self) -> bool:
        """Cut the text at the first stop string in it. Text already streamed holds none:
        a stop string's start is held back until it is clear (`_maybe_stop_length`)."""
        found = [i for s in self.settings.stop if (i := self.text.find(s, self.sent)) >= 0]
        if found:
            self.text = self.text[: min(found)]
        return bool(found)

    def _maybe_stop_length(self) -> int:
        """Length of the longest unsent end of the text that begins a stop string."""
        tail = self.text[self.sent :]
        for n in range(min(len(tail), max(map(len, self.settings.stop), default=1) - 1), 0, -1):
            if any(s.startswith(tail[-n:]) for s in self.settings.stop):
                return n
        return 0

    def _send(self, end: int) -> str:
        piece, self.sent = self.text[self.sent : end], end
        return piece

    def completion(self) -> Completion:
        assert self.finish_reason is not None, "the completion is still being decoded"
        return Completion(self.prompt, self.text, self.token_ids, self.finish_reason)


def _rows(codec: TextCodec, prompts: Sequence[str], settings: GenerationSettings) -> list[_Row]:
    if not prompts:
        raise ValueError("no prompts to continue")
    rows = []
    for prompt in prompts:
        # An empty prompt starts a document, where the tokenizer has a mark for that.
        ids = codec.encode(prompt) or ([codec.eot_id] if codec.eot_id is not None else [])
        rows.append(_Row(prompt, ids, codec.decoder(ids), settings, codec.eot_id))
    return rows


def _stream_rows(
    model: LanguageModel, codec: TextCodec, rows: list[_Row]
) -> Generator[TextPiece, None, None]:
    prompts, settings = [row.prompt_ids for row in rows], rows[0].settings
    steps = decode_steps(model, prompts, settings, vocab_size=codec.vocab_size)
    with closing(steps):
        for step in steps:
            for index, (row, token) in enumerate(zip(rows, step, strict=True)):
                if token is None or row.finish_reason is not None:
                    continue
                piece = row.take(token)
                if piece or row.finish_reason is not None:
                    yield TextPiece(index, piece, row.finish_reason)
            if all(row.finish_reason is not None for row in rows):
                return


def stream_text(
    model: LanguageModel, codec: TextCodec, prompts: Sequence[str], settings: GenerationSettings
) -> Generator[TextPiece, None, None]:
    """Continue each prompt, yielding new text as it decodes cleanly; each completion's last
    piece carries its finish reason. Joined per index, the pieces are the completions.
    Close it to stop early (decoding stops and the model is left as it was found)."""
    yield from _stream_rows(model, codec, _rows(codec, prompts, settings))


def generate_text(
    model: LanguageModel,
    codec: TextCodec,
    prompts: Sequence[str],
    settings: GenerationSettings,
    *,
    on_piece: Callable[[TextPiece], None] | None = None,
) -> list[Completion]:
    """Continue each prompt; `on_piece` sees the text as it is produced (`stream_text`)."""
    rows = _rows(codec, prompts, settings)
    for piece in _stream_rows(model, codec, rows):
        if on_piece is not None:
            on_piece(piece)
    return [row.completion() for row in rows]


# --- checkpoints ---------------------------------------------------------------------------


def load_for_generation(
    store: CheckpointStore,
    checkpoint: CheckpointInfo | tuple[str, str],
    *,
    device: torch.device | str = "cpu",
) -> tuple[LanguageModel, TextCodec | None]:
    """A checkpoint's model, in eval mode, and its text codec (None where the tokenizer of
    its tokens is unknown: it continues token ids only).

    The model is built from the checkpoint's model_config and loaded by `load_checkpoint`,
    which checks every file against the manifest first: a damaged checkpoint raises
    CheckpointCorrupt. `checkpoint` is what `store` resolved, or an (experiment, tag).
    """
    info = checkpoint if isinstance(checkpoint, CheckpointInfo) else _info_of(store, *checkpoint)
    files = store.entry(info.experiment, info.tag)
    if info.model_config is None:
        verify_manifest(files, deep=True)  # a damaged metadata.json says so first
    # Compiling is for training's many steps of one shape; a decode changes shape each step.
    config = info.require_model_config().replace(use_compile=False)
    model = build_model(config, device=device)
    load_checkpoint(model, None, None, files, device=device)
    return model.eval(), _checkpoint_codec(store, info)


def _info_of(store: CheckpointStore, experiment: str, tag: str) -> CheckpointInfo:
    """The store's reading of a checkpoint."""
    try:
        return store.get(experiment, tag)
    except CheckpointNotFound:
        # The store hides an incomplete checkpoint; asked for this one, say what is wrong
        # with it, as load_checkpoint would.
        verify_manifest(store.entry(experiment, tag), deep=True)
        raise


def _checkpoint_codec(store: CheckpointStore, info: CheckpointInfo) -> TextCodec | None:
    if info.tokenizer is None or info.tokenizer.kind == "bytes":
        return build_codec(info.tokenizer, None)
    where = f"checkpoint {info.experiment}/{info.tag}"
    listed = {f["name"]: f["sha256"] for f in info.files}
    if TOKENIZER_FILE not in listed:
        raise CheckpointCorrupt(f"{where} records a bpe tokenizer but holds no {TOKENIZER_FILE}")
    with store.entry(info.experiment, info.tag).open(TOKENIZER_FILE) as f:
        data = f.read()
    # Read after load_checkpoint hashed it: what is used must be what was checked.
    if hashlib.sha256(data).hexdigest() != listed[TOKENIZER_FILE]:
        raise CheckpointCorrupt(f"{where}: {TOKENIZER_FILE} does not match its manifest")
    return build_codec(info.tokenizer, data)
