"""The peer a user would pick instead of trainctl's model: HF transformers' LlamaForCausalLM
with the same dimensions, trained with torch AdamW in a plain loop.

Llama has no QK-norm and no logit softcap; trainctl's model has both, so trainctl does
slightly more work per token than the peer (two small RMSNorms per layer and a tanh over the
logits). Everything else maps one to one.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainctl.store.models.presets import ModelConfig


def llama_config(cfg: ModelConfig, seq_len: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.ffn_hidden,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=max(seq_len, cfg.max_seq_len),
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,
        initializer_range=cfg.init_std,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        use_cache=False,
    )


def build_llama(cfg: ModelConfig, seq_len: int, seed: int = 0, device: str = "cpu") -> nn.Module:
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM._from_config(
            llama_config(cfg, seq_len), attn_implementation="sdpa", dtype=torch.float32
        )
    return model.to(device)


def llama_loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy from the logits, upcast to fp32 as HF's own loss does."""
    logits = model(input_ids=tokens).logits  # (B, T, vocab)
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def build_adamw(model: nn.Module, lr: float = 3e-4, weight_decay: float = 0.1) -> Any:
    """AdamW as a plain loop uses it: decay on matrices, none on vectors, betas 0.9/0.95."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0}],
        lr=lr,
        betas=(0.9, 0.95),
        fused=any(p.is_cuda for p in decay) or None,
    )
