"""Multiple-choice scoring by log-likelihood, as lm-evaluation-harness's HF model class
scores (`HFLM.loglikelihood`), so that its predictions and ours are the same.

Each choice is a request (context, `" " + choice`). It is tokenized as the harness does it:
whitespace ending the context moves to the continuation, the whole text is encoded, and the
continuation is what follows the context's own tokens (a BPE merge across the boundary
stays in the continuation). No BOS is added; the tokens are left-truncated to the model's
context plus one, and the last token is not fed. The log-likelihood of a continuation is the
sum of its tokens' log-softmax. Rows are sorted by length and batched (right-padded: the
attention is causal, so padding never reaches a real position), each distinct request is
computed once, and the forward runs under training's autocast (bf16 on CUDA). The choices of
one context share it: its keys and values are computed once and each choice continues from a
copy (the KV cache), where that feeds a third fewer tokens than whole rows would.

`acc` takes the choice of the largest log-likelihood; `acc_norm` divides it by the choice's
length in characters first, as the harness does (its `len(choice)`, without the delimiter);
`bits_per_byte` is the gold continuation's negative log-likelihood in bits over its UTF-8
bytes, summed over the items before dividing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from trainctl.store.data.codec import TextCodec
from trainctl.worker.evals.tasks import TARGET_DELIMITER, Item
from trainctl.worker.models import LanguageModel
from trainctl.worker.models.generation import cache_dtype, step_mode
from trainctl.worker.stops import maybe_stop

Request = tuple[tuple[int, ...], tuple[int, ...]]
"""Context ids, continuation ids."""


def encode_pair(codec: TextCodec, context: str, continuation: str) -> Request:
    """The harness's split of context and continuation into tokens (HFLM._encode_pair)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = codec.encode(context + continuation)
    n = len(codec.encode(context))
    return tuple(whole[:n]), tuple(whole[n:])


def loglikelihoods(
    model: LanguageModel, requests: Sequence[Request], *, batch_size: int = 32
) -> list[tuple[float, bool]]:
    """Each request's continuation log-likelihood and whether it is the greedy one. Each
    distinct request is computed once; the continuations of one context (an item's choices)
    share its computation where that saves at least a third of the tokens (`_shared`)."""
    by_context: dict[tuple[int, ...], list[tuple[int, ...]]] = defaultdict(list)
    for ctx, cont in dict.fromkeys(requests):
        by_context[ctx].append(cont)
    results: dict[Request, tuple[float, bool]] = {}
    rows: list[Request] = []
    sharing = True  # until the model's cache turns out not to fan out
    for ctx, conts in by_context.items():
        maybe_stop()  # per item: a cancel stops a scoring of any size (worker.stops)
        shared = None
        if sharing and _worth_sharing(model, ctx, conts):
            shared = _shared(model, ctx, conts)
            sharing = shared is not None
        if shared is None:
            rows += [(ctx, cont) for cont in conts]
        else:
            results.update(shared)
    results.update(_whole_rows(model, rows, batch_size))
    return [results[r] for r in requests]


def _worth_sharing(
    model: LanguageModel, ctx: tuple[int, ...], conts: Sequence[tuple[int, ...]]
) -> bool:
    """Whether the context is computed once for all `conts`: nothing is truncated, and the
    tokens fed fall by a third or more (a KV-cache pass costs a second forward call, and
    batch-1 calls use a GPU less well)."""
    longest = max(map(len, conts))
    if len(ctx) < 2 or len(ctx) + longest > model.config.max_seq_len + 1:
        return False
    whole = sum(len(ctx) + len(c) for c in conts)
    return whole >= 1.5 * (len(ctx) + sum(map(len, conts)))


def _shared(
    model: LanguageModel, ctx: tuple[int, ...], conts: Sequence[tuple[int, ...]]
) -> dict[Request, tuple[float, bool]] | None:
    """The context's keys and values once (all but its last token, whose logits predict
    every continuation's first), then each continuation from a copy of them, in one batch
    right-padded: attention is causal, so padding never reaches a real position. None for a
    model that keeps no cache (a plug-in's) or one whose cache cannot fan out."""
    device = next(model.parameters()).device
    longest = max(map(len, conts))
    cache: Any = model.new_cache(1, len(ctx) - 1 + longest, device, cache_dtype(model, device))
    if cache is None:
        return None
    tokens = torch.zeros((len(conts), longest), dtype=torch.long)
    for i, cont in enumerate(conts):
        tokens[i, : len(cont)] = torch.tensor((ctx[-1], *cont[:-1]))
    with step_mode(device):
        model.forward_cached(torch.tensor([ctx[:-1]], device=device), cache, last_only=True)
        if not cache.fan_out(len(conts)):
            return None
        logits = model.forward_cached(tokens.to(device), cache)  # (n, longest, vocab)
    logprobs = F.log_softmax(logits.float(), dim=-1)
    return {
        (ctx, cont): _continuation(logprobs[i, : len(cont)], cont, device)
        for i, cont in enumerate(conts)
    }


def _whole_rows(
    model: LanguageModel, requests: Sequence[Request], batch_size: int
) -> dict[Request, tuple[float, bool]]:
    """Each request as one row of context and continuation (left-truncated to the model's
    context plus one), longest first, in batches."""
    max_len = model.config.max_seq_len
    ordered = sorted(requests, key=lambda r: -len(r[0] + r[1]))
    results: dict[Request, tuple[float, bool]] = {}
    device = next(model.parameters()).device
    for start in range(0, len(ordered), batch_size):
        maybe_stop()
        batch = ordered[start : start + batch_size]
        rows = [(ctx + cont)[-(max_len + 1) :][:-1] for ctx, cont in batch]
        tokens = torch.zeros((len(rows), max(map(len, rows))), dtype=torch.long)
        for i, row in enumerate(rows):
            tokens[i, : len(row)] = torch.tensor(row)
        with step_mode(device):
            logits = model(tokens.to(device))  # (B, T, vocab)
        logprobs = F.log_softmax(logits.float(), dim=-1)
        for i, (request, row) in enumerate(zip(batch, rows, strict=True)):
            end, n = len(row), len(request[1])
            results[request] = _continuation(logprobs[i, end - n : end], request[1], device)
    return results


def _continuation(
    logprobs: torch.Tensor, cont: tuple[int, ...], device: torch.device
) -> tuple[float, bool]:
    """The continuation's log-likelihood from the log-softmax at the positions predicting
    it, (n_cont, vocab), and whether each of its tokens is the argmax."""
    target = torch.tensor(cont, device=device)
    ll = float(logprobs.gather(-1, target[:, None]).sum())
    return ll, bool((logprobs.argmax(-1) == target).all())


@dataclass(frozen=True)
class ItemScore:
    loglikelihoods: tuple[float, ...]
    pred: int
    """The choice of the largest log-likelihood (acc)."""
    pred_norm: int
    """The choice of the largest log-likelihood per character (acc_norm)."""
    gold: int
    gold_nats: float
    """The gold continuation's negative log-likelihood."""
    gold_bytes: int
    """UTF-8 bytes of the gold continuation, the delimiter included."""


def argmax(values: Sequence[float]) -> int:
    """The first index of the largest value, as numpy's argmax breaks ties."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def score_items(
    model: LanguageModel,
    codec: TextCodec,
    items: Sequence[Item],
    contexts: Sequence[str],
    *,
    batch_size: int = 32,
) -> list[ItemScore]:
    """Score each item's choices after its context."""
    requests = []
    for item, context in zip(items, contexts, strict=True):
        maybe_stop()  # tokenizing 25-shot contexts of thousands of items takes a while too
        requests += [encode_pair(codec, context, TARGET_DELIMITER + c) for c in item.choices]
    lls = iter(loglikelihoods(model, requests, batch_size=batch_size))
    scores = []
    for item in items:
        ll = tuple(next(lls)[0] for _ in item.choices)
        gold_text = TARGET_DELIMITER + item.choices[item.gold]
        scores.append(
            ItemScore(
                loglikelihoods=ll,
                pred=argmax(ll),
                pred_norm=argmax([v / len(c) for v, c in zip(ll, item.choices, strict=True)]),
                gold=item.gold,
                gold_nats=-ll[item.gold],
                gold_bytes=len(gold_text.encode("utf-8")),
            )
        )
    return scores


def task_metrics(scores: Sequence[ItemScore]) -> dict[str, float]:
    """acc, acc_norm (means over the items) and bits_per_byte (over all gold bytes)."""
    n = len(scores)
    return {
        "acc": sum(s.pred == s.gold for s in scores) / n,
        "acc_norm": sum(s.pred_norm == s.gold for s in scores) / n,
        "bits_per_byte": sum(s.gold_nats for s in scores)
        / (math.log(2) * sum(s.gold_bytes for s in scores)),
    }
