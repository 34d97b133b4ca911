"""A plug-in model for the tests: a one-layer MLP language model, declared under
`trainctl.models` as `tiny_mlp` (docs/models.md, "Plug-in models")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainctl.worker.models.plugin import ModelPlugin


class TinyMLP(nn.Module):
    """Each position's next token from its own embedding, through one hidden layer."""

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.hidden = nn.Linear(d_model, d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden(self.embed(idx))))  # (B, T, vocab)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.forward(idx)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return loss, loss


def build(config: dict[str, Any], seed: int | None) -> TinyMLP:
    unknown = set(config) - {"vocab_size", "max_seq_len", "d_model"}
    if unknown:
        raise ValueError(f"tiny_mlp has no field {', '.join(sorted(unknown))}")
    return TinyMLP(config["vocab_size"], config.get("d_model", 32))


def muon_params(model: nn.Module) -> Iterable[str]:
    return ["hidden.weight"]


def flops_per_token(config: dict[str, Any], seq_len: int) -> float:
    d, vocab = config.get("d_model", 32), config["vocab_size"]
    return 6.0 * (d * d + d * vocab)


MODEL = ModelPlugin(build=build, muon_params=muon_params, flops_per_token=flops_per_token)
