"""The scorer on the built-in GPT and a transformers llama, byte-level: each continuation's
log-likelihood is the sum of its tokens' log-softmax, whatever the batching, and the metrics
follow from them."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.support.hf_archs import ARCHITECTURES, hf
from tests.support.plans import train_plan
from trainctl.store.data.codec import TextCodec
from trainctl.store.models.hf_config import HfModelConfig
from trainctl.worker.evals.scorer import (
    _worth_sharing,
    encode_pair,
    loglikelihoods,
    score_items,
    task_metrics,
)
from trainctl.worker.evals.tasks import Item
from trainctl.worker.models import build_model

pytest.importorskip("transformers", reason="the worker extra installs transformers")

LLAMA = HfModelConfig(
    model_type="llama",
    fields={
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 256,
        "max_position_embeddings": 128,
    },
    vocab_size=256,
    max_seq_len=128,
)
ITEMS = [
    Item("Question: What is 2 + 2?\nAnswer:", ("4", "five", "22"), 0),
    Item("The cat sat on the", ("mat.", "moon and then went home", "é"), 2),
]


def one_by_one(model: Any, ctx: tuple[int, ...], cont: tuple[int, ...]) -> float:
    tokens = torch.tensor([(ctx + cont)[:-1]])
    with torch.no_grad():
        logprobs = F.log_softmax(model(tokens).float(), dim=-1)[0, -len(cont) :]
    return float(logprobs.gather(-1, torch.tensor(cont)[:, None]).sum())


@pytest.fixture(params=["gpt", "llama"])
def model(request: pytest.FixtureRequest) -> Any:
    config: Any = "tiny" if request.param == "gpt" else LLAMA
    return build_model(config, seed=0).eval()


def test_a_byte_level_request_splits_at_the_context_s_bytes() -> None:
    codec = TextCodec()
    assert encode_pair(codec, "ab ", "c") == ((97, 98), (32, 99))


def test_log_likelihoods_are_the_same_batched_or_one_by_one(model: Any) -> None:
    codec = TextCodec()
    requests = [
        encode_pair(codec, item.query, " " + choice) for item in ITEMS for choice in item.choices
    ]
    expected = [one_by_one(model, *r) for r in requests]
    for batch_size in (1, 3, 32):
        got = [ll for ll, _ in loglikelihoods(model, requests, batch_size=batch_size)]
        assert got == pytest.approx(expected, abs=1e-4)


def test_the_metrics_follow_from_the_log_likelihoods(model: Any) -> None:
    scores = score_items(model, TextCodec(), ITEMS, [item.query for item in ITEMS])
    for item, score in zip(ITEMS, scores, strict=True):
        ll = score.loglikelihoods
        assert score.pred == ll.index(max(ll))
        per_char = [v / len(c) for v, c in zip(ll, item.choices, strict=True)]
        assert score.pred_norm == per_char.index(max(per_char))
        assert score.gold_bytes == len((" " + item.choices[item.gold]).encode())
    metrics = task_metrics(scores)
    assert metrics["acc"] == sum(s.pred == s.gold for s in scores) / 2
    bits = sum(s.gold_nats for s in scores) / math.log(2)
    assert metrics["bits_per_byte"] == pytest.approx(bits / sum(s.gold_bytes for s in scores))


@pytest.mark.parametrize("architecture", ["gpt", *ARCHITECTURES])
def test_choices_continuing_one_context_from_its_kv_cache_score_as_whole_rows(
    architecture: str,
) -> None:
    """The shared-prefix path (one context's keys and values, fanned out to its choices) on
    every cache the tested architectures keep: transformers' own, a sliding window
    (gemma3_text), latent attention (deepseek_v3); Qwen3-Next's linear-attention states do
    not fan out, and its choices are scored as whole rows."""
    config: Any = (
        "tiny"
        if architecture == "gpt"
        else train_plan(steps=1, model={"hf": hf(architecture)}).model.config
    )
    model = build_model(config, seed=0).eval()
    codec = TextCodec()
    context = "Question: which of these is a colour of the sky on a clear day?\nAnswer:"
    requests = [encode_pair(codec, context, " " + c) for c in ("blue", "green", "an owl")]
    assert _worth_sharing(model, requests[0][0], [cont for _, cont in requests])
    expected = [one_by_one(model, *r) for r in requests]
    got = [ll for ll, _ in loglikelihoods(model, requests)]
    assert got == pytest.approx(expected, abs=1e-4)
