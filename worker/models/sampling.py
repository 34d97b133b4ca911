"""Sample runs, and the samples a train run writes every `sample_every` steps (issue 15).

Both continue prompts with `worker.models.generation` and report the text as `sample` events
(docs/design/models.md, "Model output: samples, sample runs, exports"). A sample run streams
its completions: the pieces of text are gathered and written as one event per completion
every `STREAM_INTERVAL` seconds, so a client sees the text as it comes without an event per
token. A train run's samples are
written whole, one event per prompt, with the step they were taken at.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from trainctl.store.checkpoints.info import check_fits
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.codec import TextCodec, build_codec
from trainctl.store.kinds.sample import SamplePlan
from trainctl.store.kinds.train import TrainPlan
from trainctl.store.models.generation import GenerationSettings
from trainctl.store.plans import data_tokenizer
from trainctl.worker.context import RunContext
from trainctl.worker.models import LanguageModel
from trainctl.worker.models.generation import (
    Completion,
    TextPiece,
    generate_text,
    generate_tokens,
    load_for_generation,
)

STREAM_INTERVAL = 0.25  # seconds between a completion's streamed events


class PieceStream:
    """Gathers a sample run's text pieces and writes them as `sample` events, at most one per
    completion every STREAM_INTERVAL seconds, and always its last (with its finish reason)."""

    def __init__(self, write: Callable[[dict[str, Any]], None]) -> None:
        self.write = write
        self.pending: dict[int, str] = {}
        self.last_write = time.monotonic()

    def __call__(self, piece: TextPiece) -> None:
        self.pending[piece.index] = self.pending.get(piece.index, "") + piece.text
        if piece.finish_reason is not None:
            self._send(piece.index, piece.finish_reason)
        elif time.monotonic() - self.last_write >= STREAM_INTERVAL:
            for index in list(self.pending):
                self._send(index, None)
            self.last_write = time.monotonic()

    def _send(self, index: int, finish_reason: str | None) -> None:
        text = self.pending.pop(index, "")
        if text or finish_reason is not None:
            self.write({"index": index, "delta": text, "finish_reason": finish_reason})


def run_sample(
    plan: SamplePlan, ctx: RunContext, store: CheckpointStore, device: torch.device
) -> Any:
    """Continue the plan's prompts with its checkpoint in `store`; the run's result."""
    ref = plan.checkpoint
    info = store.get(ref.experiment, ref.tag)
    # 'best' and 'latest' are pinned to a tag, which a later save may replace: the model
    # must still be the one the prompts were checked against at submit.
    check_fits(info.require_model_config(), plan.model, f"checkpoint {ref}")
    ctx.log(f"sampling {len(plan.prompt_tokens)} prompts with checkpoint {ref} (step {info.step})")
    model, codec = load_for_generation(store, info, device=device)
    started = time.perf_counter()
    if plan.prompts is not None and codec is not None:
        completions = [
            completion_json(c)
            for c in generate_text(
                model, codec, plan.prompts, plan.generation, on_piece=PieceStream(ctx.sample)
            )
        ]
    else:
        completions = token_completions(model, codec, plan.prompt_tokens, plan.generation)
    seconds = time.perf_counter() - started
    generated = sum(len(c["token_ids"]) for c in completions)
    return {
        "completions": completions,
        "checkpoint": {"experiment": ref.experiment, "tag": ref.tag, "step": info.step},
        "generated_tokens": generated,
        "tokens_per_sec": generated / seconds if seconds > 0 else None,
        "seed": plan.generation.seed,
    }


def completion_json(c: Completion) -> dict[str, Any]:
    return {
        "prompt": c.prompt,
        "text": c.text,
        "token_ids": c.token_ids,
        "finish_reason": c.finish_reason,
    }


def token_completions(
    model: LanguageModel,
    codec: TextCodec | None,
    prompts: list[list[int]],
    settings: GenerationSettings,
) -> list[dict[str, Any]]:
    """Completions of prompts given as token ids: ids, and their text where the codec is
    known."""
    eot = codec.eot_id if codec is not None else None
    vocab = codec.vocab_size if codec is not None else None
    out = generate_tokens(model, prompts, settings, eot_id=eot, vocab_size=vocab)
    return [
        {
            "prompt_tokens": prompt,
            "text": codec.decode(ids) if codec is not None else None,
            "token_ids": ids,
            "finish_reason": "length" if len(ids) >= settings.max_new_tokens else "eot",
        }
        for prompt, ids in zip(prompts, out, strict=True)
    ]


class TrainingSamples:
    """A train run's samples: its prompts continued by the model as it trains, with the same
    seed every time, so that two samples differ only because the model does."""

    def __init__(self, plan: TrainPlan, every: int, tokenizer_json: bytes | None = None) -> None:
        """`tokenizer_json`: the run's dataset's tokenizer, as the run read it (its
        `DataRecord`); None for byte-level text."""
        codec = build_codec(data_tokenizer(plan.data, plan.tokenizer_dataset), tokenizer_json)
        assert codec is not None, "submit refuses samples of data without a known tokenizer"
        self.codec, self.every = codec, every
        self.prompts, self.settings = plan.sample_prompts, plan.sample_settings

    def due(self, step: int, final: bool) -> bool:
        return final or step % self.every == 0

    def take(self, model: LanguageModel, step: int) -> list[dict[str, Any]]:
        """One `sample` event per prompt."""
        return [
            {
                "step": step,
                "prompt": c.prompt,
                "completion": c.text,
                "finish_reason": c.finish_reason,
                "seed": self.settings.seed,
            }
            for c in generate_text(model, self.codec, self.prompts, self.settings)
        ]
