"""Validation loss and the forward-shape check."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainctl.worker.data.loader import Batch, generate_synthetic_batch
from trainctl.worker.stops import maybe_stop


def synthetic_batches(
    batch_size: int, seq_len: int, vocab_size: int, num_batches: int, seed: int = 0
) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    return [
        generate_synthetic_batch(batch_size, seq_len, vocab_size, generator=g)
        for _ in range(num_batches)
    ]


def vocab_of(model: nn.Module) -> int:
    """The model's own vocabulary (the seed hard-coded 64,000)."""
    config: Any = getattr(model, "config")  # noqa: B009 - nn.Module types attributes loosely
    return int(config.vocab_size)


@torch.no_grad()
def compute_validation_loss(
    model: nn.Module,
    batch_size: int = 4,
    seq_len: int = 256,
    vocab_size: int | None = None,
    num_batches: int = 8,
    device: torch.device | str = "cpu",
    *,
    batches: Iterable[Batch] | None = None,
    autocast_dtype: torch.dtype | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Mean next-token loss over `batches` (or seeded synthetic ones): {loss, ppl, n_tokens}.

    Runs in eval mode under no_grad and puts the model back in the mode it was in.
    """
    if batches is None:
        vocab = vocab_size or vocab_of(model)
        batches = synthetic_batches(batch_size, seq_len, vocab, num_batches, seed)
    was_training = model.training
    model.eval()
    device = torch.device(device)
    # Summed on the device in float64, which is what adding each batch's float32 loss to a
    # Python float did, without a host-device sync per batch: one read at the end.
    total, n_tokens = torch.zeros((), dtype=torch.float64, device=device), 0
    try:
        for tokens, targets in batches:
            maybe_stop()  # a run's validation of many batches stops at a cancel (worker.stops)
            tokens, targets = tokens.to(device), targets.to(device)
            with torch.autocast(
                device.type,
                dtype=autocast_dtype or torch.bfloat16,
                enabled=autocast_dtype is not None,
            ):
                logits = model(tokens)
            total += F.cross_entropy(
                logits.float().flatten(0, 1), targets.flatten(), reduction="sum"
            ).double()
            n_tokens += targets.numel()
    finally:
        model.train(was_training)
    if n_tokens == 0:
        raise ValueError("validation got no batches")
    loss = total.item() / n_tokens
    return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "n_tokens": n_tokens}


@torch.no_grad()
def validate_forward_shape(
    model: nn.Module, batch_size: int = 2, seq_len: int = 16, device: torch.device | str = "cpu"
) -> tuple[int, ...]:
    """Check that the model maps (B, T) tokens to (B, T, its own vocab) logits."""
    vocab = vocab_of(model)
    was_training = model.training
    model.eval()
    try:
        tokens = torch.randint(0, vocab, (batch_size, seq_len), device=device)
        shape = tuple(model(tokens).shape)
    finally:
        model.train(was_training)
    expected = (batch_size, seq_len, vocab)
    if shape != expected:
        raise ValueError(f"model output shape {shape} != expected {expected}")
    return shape
