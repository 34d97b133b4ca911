"""Multiple-choice scoring by log-likelihood, as lm-evaluation-harness's HF model class
scores (`HFLM.loglikelihood`), so that its predictions and ours are the same.

Each choice is a request (context, `" " + choice`). It is tokenized as the harness does it:
whitespace ending the context moves to the continuation, the whole text is encoded, and the
continuation is what follows the context's own tokens (a BPE merge across the boundary
stays in the continuation). No BOS is added; the tokens are left-truncated to the model's
context plus one, and the last token is not fed. The log-likelihood of a continuation is the
sum of its tokens' log-softmax. Rows are sorted by length and batched (right-padded: the
attention is causal, so padding never reaches a real position), each distinct request is
computed once, and the forward runs under training's autocast (bf16 on CUDA).

`acc` takes the choice of the largest log-likelihood; `acc_norm` divides it by the choice's
length in characters first, as the harness does (its `len(choice)`, without the delimiter);
`bits_per_byte` is the gold continuation's negative log-likelihood in bits over its UTF-8
bytes, summed over the items before dividing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainctl.store.data.codec import TextCodec
from trainctl.worker.evals.tasks import TARGET_DELIMITER, Item
from trainctl.worker.generate import autocast_dtype
from trainctl.worker.models import LanguageModel

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
    """Each request's continuation log-likelihood and whether it is the greedy one."""
    max_len = model.config.max_seq_len
    distinct = sorted(set(requests), key=lambda r: -len(r[0] + r[1]))
    results: dict[Request, tuple[float, bool]] = {}
    device = next(model.parameters()).device
    dtype = autocast_dtype(device)
    for start in range(0, len(distinct), batch_size):
        batch = distinct[start : start + batch_size]
        rows = [(ctx + cont)[-(max_len + 1) :][:-1] for ctx, cont in batch]
        tokens = torch.zeros((len(rows), max(map(len, rows))), dtype=torch.long)
        for i, row in enumerate(rows):
            tokens[i, : len(row)] = torch.tensor(row)
        with (
            torch.inference_mode(),
            torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None),
        ):
            logits = model(tokens.to(device))  # (B, T, vocab)
        logprobs = F.log_softmax(logits.float(), dim=-1)
        for i, (request, row) in enumerate(zip(batch, rows, strict=True)):
            cont = torch.tensor(request[1], device=device)
            end = len(row)
            here = logprobs[i, end - len(cont) : end]  # (n_cont, vocab)
            ll = float(here.gather(-1, cont[:, None]).sum())
            results[request] = (ll, bool((here.argmax(-1) == cont).all()))
    return [results[r] for r in requests]


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
    requests = [
        encode_pair(codec, context, TARGET_DELIMITER + choice)
        for item, context in zip(items, contexts, strict=True)
        for choice in item.choices
    ]
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
