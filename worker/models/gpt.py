"""A decoder-only language model: tied embeddings, RMSNorm, RoPE, grouped-query attention
with QK-norm, SwiGLU, logit softcap and optional multi-token-prediction heads.

Configs and the preset registry live in `store.models.presets` (no torch), so the API can validate
a spec without importing this module; they are re-exported here for the worker's callers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainctl.store.models.presets import PRESETS, ModelConfig, get_preset, register_preset

__all__ = [
    "GPT",
    "PRESETS",
    "KVCache",
    "ModelConfig",
    "build_model",
    "get_preset",
    "register_preset",
]

IGNORE_INDEX = -100


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    t = torch.arange(max_seq_len, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)  # (T, hd/2)
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, nh, T, hd); rotate pairs (x1, x2) of the two halves of the head dimension.
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class LayerKV:
    """One layer's view of a `KVCache`: its buffers and the positions already filled."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, pos: int) -> None:
        self.k, self.v, self.pos = k, v, pos

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions' keys and values; return every position's so far."""
        end = self.pos + k.shape[2]
        self.k[:, :, self.pos : end] = k  # (B, n_kv, T, hd) into (B, n_kv, max_len, hd)
        self.v[:, :, self.pos : end] = v
        return self.k[:, :, :end], self.v[:, :, :end]

    def mask(self, T: int) -> torch.Tensor | None:
        """Which keys each of `T` new queries may see, where SDPA's `is_causal` is not right.

        Query i sits at position pos + i and sees keys 0..pos + i: the causal mask aligned to
        the bottom right of the (T, pos + T) scores. `is_causal` aligns it to the top left,
        which is right only for an empty cache; one query sees every key, so needs no mask.
        """
        if T == 1 or self.pos == 0:
            return None
        ones = torch.ones(T, self.pos + T, dtype=torch.bool, device=self.k.device)
        return ones.tril(diagonal=self.pos)


class KVCache:
    """Keys and values of the positions a model has seen, for decoding one token at a time.

    Each layer's buffers are allocated once, (B, n_kv_heads, max_len, head_dim): a step
    writes its position in place instead of concatenating (and copying) the whole past.
    Every row holds the same `pos` positions; `GPT.forward_cached` appends and advances it.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        batch_size: int,
        max_len: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if max_len > cfg.max_seq_len:
            raise ValueError(
                f"a cache of {max_len} positions exceeds the model's max_seq_len {cfg.max_seq_len}"
            )
        shape = (batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)]
        self.max_len = max_len
        self.pos = 0

    def layer(self, i: int) -> LayerKV:
        return LayerKV(self.k[i], self.v[i], self.pos)

    def fan_out(self, n: int) -> bool:
        """Its one row as n, in place: a prefix computed once, continued n ways (the eval
        scorer's choices after one context)."""
        self.k = [t.expand(n, -1, -1, -1).contiguous() for t in self.k]
        self.v = [t.expand(n, -1, -1, -1).contiguous() for t in self.v]
        return True

    def check_room(self, T: int) -> None:
        if self.pos + T > self.max_len:
            raise ValueError(
                f"sequence length {self.pos + T} exceeds the cache's {self.max_len} positions"
            )


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: LayerKV | None = None
    ) -> torch.Tensor:
        """`cos`, `sin`: the RoPE tables at x's absolute positions. With `kv`, x continues the
        positions it holds: its keys and values are appended and attention sees them all."""
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)
        q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        gqa = self.n_kv_heads != self.n_heads
        if kv is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            mask = kv.mask(T)
            k, v = kv.append(k, v)  # (B, n_kv, pos + T, hd)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None and T > 1, enable_gqa=gqa
            )
        return cast(torch.Tensor, self.wo(y.transpose(1, 2).reshape(B, T, -1)))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w_gate = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.w_down = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.w_down(F.silu(self.w_gate(x)) * self.w_up(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: LayerKV | None = None
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, kv)
        return x + self.mlp(self.mlp_norm(x))


class MTPHead(nn.Module):
    """Predicts the token `depth` positions beyond the next one from the final hidden state.

    It shares the tied embedding as its output matrix, so each depth adds only d² + d.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.proj(self.norm(h)))


class GPT(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    compiled_loss: (
        Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None
    ) = None
    """`eager_loss` under torch.compile, set by `compile_model`; None: eager."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mtp_heads = nn.ModuleList(MTPHead(cfg) for _ in range(cfg.mtp_depth))
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        # Not persistent: they are a function of the config, which the checkpoint records.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.config.init_std
        # Residual output projections are scaled down with depth (GPT-2) so the residual
        # stream's variance does not grow with the number of layers.
        resid_std = std / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith(("wo.weight", "w_down.weight")):
                nn.init.normal_(p, 0.0, resid_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def hidden(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Final hidden states of `idx`: (B, T) -> (B, T, C). With a cache, idx continues the
        `cache.pos` positions it holds (see `forward_cached`)."""
        start, T = (cache.pos if cache is not None else 0), idx.shape[1]
        if start + T > self.config.max_seq_len:
            raise ValueError(
                f"sequence length {start + T} exceeds the model's max_seq_len "
                f"{self.config.max_seq_len}"
            )
        if cache is not None:
            cache.check_room(T)
        cos, sin = self.rope_cos[start : start + T], self.rope_sin[start : start + T]
        x = self.tok_emb(idx)  # (B, T, C)
        for i, block in enumerate(self.blocks):
            if cache is not None:
                x = block(x, cos, sin, cache.layer(i))
            elif self.config.use_checkpoint_per_layer and self.training:
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        if cache is not None:
            cache.pos += T
        return cast(torch.Tensor, self.final_norm(x))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        logits = F.linear(h, self.tok_emb.weight)  # tied head: (B, T, vocab)
        cap = self.config.logit_softcap
        if cap > 0:
            logits = cap * torch.tanh(logits / cap)
        return logits

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits of the next token at every position: (B, T) -> (B, T, vocab)."""
        return self.head(self.hidden(idx))

    def new_cache(
        self, batch_size: int, total: int, device: torch.device, dtype: torch.dtype
    ) -> KVCache:
        """A KV cache for `batch_size` rows of up to `total` positions (`forward_cached`)."""
        return KVCache(self.config, batch_size, total, device=device, dtype=dtype)

    def next_logits(self, idx: torch.Tensor) -> torch.Tensor:
        """The last position's logits of idx, without a cache: (B, T) -> (B, vocab)."""
        return self.head(self.hidden(idx)[:, -1])

    def forward_cached(
        self, idx: torch.Tensor, cache: KVCache, *, last_only: bool = False
    ) -> torch.Tensor:
        """`forward` of idx as the continuation of the positions `cache` holds, appending
        idx's keys and values to it: a whole prompt at once, then one token per step.

        (B, T) -> (B, T, vocab), or (B, 1, vocab) with `last_only` (a prompt's last position
        is all that sampling needs; the head over every position costs T x vocab x C).
        A method of its own, not an argument of `forward`: a compiled model compiles
        `forward`, and a cache position that changes every step would recompile it each time.
        The MTP heads take no part: they are a training signal.
        """
        h = self.hidden(idx, cache)
        return self.head(h[:, -1:] if last_only else h)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training loss (next-token plus weighted MTP losses) and the next-token loss alone.

        Compiled where the config says so (`compile_model`): training calls this method, not
        `forward`, so compiling `forward` alone would leave every train step eager.
        """
        if self.compiled_loss is not None and not torch.compiler.is_compiling():
            return self.compiled_loss(idx, targets)
        return self.eager_loss(idx, targets)

    def eager_loss(
        self, idx: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`loss` as written: what `compile_model` compiles."""
        h = self.hidden(idx)
        main = self.head_loss(h, targets)
        total = main
        for depth, (mtp, weight) in enumerate(
            zip(self.mtp_heads, self.config.mtp_weights(), strict=True), start=1
        ):
            # Head `depth` at position t predicts targets[t + depth]; the last positions
            # have no such target and are ignored.
            shifted = torch.full_like(targets, IGNORE_INDEX)
            shifted[:, :-depth] = targets[:, depth:]
            total = total + weight * self.head_loss(mtp(h), shifted)
        return total, main

    def head_loss(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the softcapped tied head: `cross_entropy(self.head(h), t)`.

        In eager mode the head, softcap and loss run as one fused function that never keeps
        the (B, T, vocab) logits for backward (see `fused_head_loss`): on CPU that is a
        third of a step at vocab 64,000. Under torch.compile, inductor fuses the plain
        expression itself, so the compiled graph sees that instead.
        """
        if torch.compiler.is_compiling():
            return cross_entropy(self.head(h), targets)
        return fused_head_loss(h, self.tok_emb.weight, targets, self.config.logit_softcap)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )


# Rows of the head done at once: bounds the fused loss's scratch to 2**26 fp32 logits.
HEAD_CHUNK_ELEMENTS = 1 << 26


class _FusedHeadLoss(torch.autograd.Function):
    """Tied head + logit softcap + mean cross-entropy, with the gradients made in forward.

    Forward computes each chunk's logits once, turns them in place into the softmax
    gradient, multiplies it straight into grad_h and grad_w and drops it: the only tensors
    kept for backward are those two gradients (the sizes of h and w). The plain expression
    keeps several (N, vocab) tensors alive and makes as many again in backward, and on CPU
    each of those is a fresh page-faulted allocation. Same maths (`test_model` checks it
    against the plain expression); the last bits of the loss can differ.
    """

    @staticmethod
    def forward(
        ctx: Any, h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, cap: float, grad: bool
    ) -> torch.Tensor:
        valid = targets != IGNORE_INDEX  # (N,)
        n_valid = valid.sum()
        scale = valid.float() / n_valid.clamp(min=1).float()  # d(mean)/d(row loss)
        safe = targets.clamp(min=0)[:, None]  # (N, 1): ignored rows read column 0, weight 0
        grad_h = torch.empty_like(h) if grad else None
        grad_w: torch.Tensor | None = None
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        rows = max(1, HEAD_CHUNK_ELEMENTS // w.shape[0])
        for i in range(0, h.shape[0], rows):
            hc, sl = h[i : i + rows], slice(i, i + rows)
            z = F.linear(hc, w).float()  # (n, vocab)
            if cap > 0:
                t = z.div_(cap).tanh_()  # z now holds tanh(logits / cap)
                z = t * cap  # capped logits: |z| <= cap, so exp cannot overflow
            else:
                z = z - z.amax(dim=1, keepdim=True)
            picked = z.gather(1, safe[sl]).squeeze(1)
            e = z.exp_()
            s = e.sum(dim=1)
            total += ((s.log() - picked) * valid[sl]).sum()
            if grad_h is None:
                continue
            p = e.mul_((scale[sl] / s)[:, None])  # softmax, scaled by 1/n_valid
            p.scatter_add_(1, safe[sl], -scale[sl, None])  # minus the one-hot target
            if cap > 0:
                p.addcmul_(p, t.mul_(t), value=-1)  # chain rule of the softcap: (1 - tanh²)
            p = p.to(w.dtype)
            grad_h[sl] = F.linear(p, w.t()).to(h.dtype)  # p @ w
            gw = F.linear(p.t(), hc.t().to(w.dtype)).float()  # p.T @ h: (vocab, C)
            grad_w = gw if grad_w is None else grad_w.add_(gw)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.w_dtype = w.dtype
        return total / n_valid.float()

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        grad_h, grad_w = ctx.saved_tensors
        # In place: these buffers exist only for this one backward (no retain_graph use).
        return grad_h.mul_(grad_out), grad_w.mul_(grad_out).to(ctx.w_dtype), None, None, None


def fused_head_loss(
    h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, cap: float
) -> torch.Tensor:
    """`cross_entropy(cap * tanh((h @ w.T) / cap), targets)` over h: (..., C), targets: (...)."""
    grad = torch.is_grad_enabled() and (h.requires_grad or w.requires_grad)
    loss = _FusedHeadLoss.apply(h.reshape(-1, h.size(-1)), w, targets.reshape(-1), cap, grad)
    return cast(torch.Tensor, loss)


def resolve_config(config: ModelConfig | str | dict[str, Any], **overrides: Any) -> ModelConfig:
    if isinstance(config, str):
        config = get_preset(config)
    elif isinstance(config, dict):
        config = ModelConfig.from_dict(config)
    return config.replace(**overrides) if overrides else config


def build_model(
    config: ModelConfig | str | dict[str, Any],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int | None = None,
    **overrides: Any,
) -> GPT:
    """Build a model from a preset name, a config, or a config dict (a checkpoint's metadata).

    `seed` makes initialisation reproducible without touching the global RNG stream.
    """
    cfg = resolve_config(config, **overrides)
    if seed is None:
        model = GPT(cfg)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = GPT(cfg)
    model.to(device=device, dtype=dtype)
    if cfg.use_compile:
        compile_model(model, cfg.compile_mode)
    return model


def compile_model(model: GPT, mode: str) -> None:
    """torch.compile what training and validation call: `loss` (a method of its own, which
    `nn.Module.compile` does not reach) and `forward`. In place, so state_dict keys stay free
    of "_orig_mod."."""
    torch_mode = None if mode == "default" else mode
    model.compile(mode=torch_mode)
    model.compiled_loss = torch.compile(model.eager_loss, mode=torch_mode)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
