"""Muon for the hidden 2-D matrices, AdamW for everything else.

Muon orthogonalises each update of a weight matrix, which only makes sense for matrices that
map activations to activations inside the blocks. The embedding (which is also the tied head)
is a lookup table, and gains/biases are vectors: those go to AdamW, as in modded-nanogpt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class OptimizerConfig:
    muon_lr: float = 0.02
    """Muon learning rate (before Muon's own shape adjustment, see muon_adjust_lr_fn)."""
    muon_momentum: float = 0.95
    """Muon momentum (Nesterov)."""
    muon_weight_decay: float = 0.1
    """Decoupled weight decay of the Muon matrices."""
    muon_adjust_lr_fn: str = "original"
    """How Muon scales lr by matrix shape: "original" (Keller Jordan's max(1, A/B)^0.5, the
    one lr 0.02 was tuned for) or "match_rms_adamw" (Moonshot's 0.2·sqrt(max(A, B)))."""
    adamw_lr: float = 3e-4
    """AdamW learning rate (embedding/tied head, norms, gains)."""
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    adamw_eps: float = 1e-8
    """AdamW epsilon."""
    adamw_weight_decay: float = 0.1
    """AdamW weight decay, applied to the embedding only; vectors are never decayed."""


def split_parameters(
    model: nn.Module,
) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """(muon, adamw_decay, adamw_no_decay). Every trainable parameter lands in exactly one.

    `named_parameters` yields a shared (tied) tensor once, so the tied head counts once.
    """
    muon, decay, no_decay = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.dim() == 2 and "tok_emb" not in name:
            muon.append(p)
        elif p.dim() >= 2:
            decay.append(p)
        else:
            no_decay.append(p)
    return muon, decay, no_decay


def build_optimizers(
    model: nn.Module, config: OptimizerConfig | None = None
) -> tuple[torch.optim.Muon, torch.optim.AdamW]:
    cfg = config or OptimizerConfig()
    muon_params, decay, no_decay = split_parameters(model)
    muon = torch.optim.Muon(
        muon_params,
        lr=cfg.muon_lr,
        momentum=cfg.muon_momentum,
        weight_decay=cfg.muon_weight_decay,
        nesterov=True,
        adjust_lr_fn=cfg.muon_adjust_lr_fn,
    )
    return muon, build_adamw(decay, no_decay, cfg)


def build_adamw(
    decay: list[nn.Parameter], no_decay: list[nn.Parameter], config: OptimizerConfig | None = None
) -> torch.optim.AdamW:
    """AdamW with weight decay on `decay` only.

    Fused on every device: torch has a fused AdamW kernel for CPU as well as CUDA, and on CPU
    it is about 9x faster than the default per-tensor loop (one pass over each parameter
    instead of a dozen; docs/performance.md).
    """
    cfg = config or OptimizerConfig()
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.adamw_weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.adamw_lr,
        betas=cfg.adamw_betas,
        eps=cfg.adamw_eps,
        fused=True,
    )
