"""No graph breaks in what the train step compiles (issue 46's CPU part, docs/performance.md
item 7): a break splits the step into several graphs, each a separate CUDA graph under
`reduce-overhead` with Python between them, which is the GPU time a compiled step exists to
save. Dynamo's tracing is the same on the CPU as on a GPU, so the count is taken here, where
it costs seconds rather than device minutes, and a new break fails this test with its reason.

`torch._dynamo.explain` traces without compiling (no inductor), so the test is cheap."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo

from tests.support.hf_archs import hf
from tests.support.plans import train_plan
from trainctl.worker.models import build_model

TOKENS = (2, 64)


def gpt(**changes: Any) -> Callable[..., Any]:
    # `eager_loss` is what `compile_model` compiles for training (worker/models/gpt.py).
    return build_model("tiny", **changes).eager_loss


def llama(**changes: Any) -> Callable[..., Any]:
    config = train_plan(steps=1, model={"hf": hf("llama")}).model.config
    return build_model(config, **changes).loss


@pytest.mark.parametrize(
    ("build", "changes"),
    [
        (gpt, {}),
        (gpt, {"use_checkpoint_per_layer": True}),
        (gpt, {"use_checkpoint_per_layer": True, "mtp_depth": 1, "mtp_loss_weights": (0.3,)}),
        (llama, {}),
        (llama, {"use_checkpoint_per_layer": True}),
    ],
    ids=["gpt", "gpt-checkpointed", "gpt-checkpointed-mtp", "llama", "llama-checkpointed"],
)
def test_the_train_step_s_loss_is_one_graph(
    build: Callable[..., Callable[..., Any]], changes: dict[str, Any]
) -> None:
    loss = build(**changes)
    vocab = 256 if build is llama else 512
    tokens, targets = torch.randint(0, vocab, TOKENS), torch.randint(0, vocab, TOKENS)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(loss)(tokens, targets)
    reasons = [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_break_count == 0, reasons
    assert explained.graph_count == 1
