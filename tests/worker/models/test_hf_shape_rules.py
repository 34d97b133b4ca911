"""Each shape rule of store/models/hf_rules.py: submit refuses the config naming the field, and
transformers, given the same config unchecked, really fails at the first forward pass."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tests.support.hf_archs import hf
from tests.support.plans import train_plan
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.models.hf_config import HfModelConfig
from trainctl.store.models.hf_rules import RULES
from trainctl.worker.models import build_model
from trainctl.worker.models.hf import ModelBuildError

BROKEN = [
    ("llama", {"head_dim": 15}, "head_dim"),
    ("qwen3", {"head_dim": 15}, "head_dim"),
    ("olmo2", {"hidden_size": 60, "num_attention_heads": 4}, "head_dim"),
    ("gemma3_text", {"head_dim": 15}, "head_dim"),
    ("qwen3_moe", {"head_dim": 15}, "head_dim"),
    ("qwen3_moe", {"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ("qwen3_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step"),
    ("qwen3_next", {"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ("qwen3_next", {"decoder_sparse_step": 0}, "decoder_sparse_step"),
    ("qwen3_next", {"linear_num_value_heads": 3}, "linear_num_value_heads"),
    ("deepseek_v3", {"num_key_value_heads": 2}, "num_key_value_heads"),
    ("deepseek_v3", {"qk_rope_head_dim": 7}, "qk_rope_head_dim"),
    ("deepseek_v3", {"n_group": 3}, "n_group"),
    ("deepseek_v3", {"topk_group": 2}, "topk_group"),
    ("deepseek_v3", {"num_experts_per_tok": 5}, "num_experts_per_tok"),
]


def test_every_rule_is_tested() -> None:
    # The generic rules (head_dim, token ids, sizes) are tested over every listed type in
    # test_hf_listing.py; these are the architectures' own, and a few generic ones.
    tested = {(t, field) for t, _, field in BROKEN}
    assert {(t, r.field) for r in RULES for t in r.model_types} <= tested


@pytest.mark.parametrize(("model_type", "changes", "field"), BROKEN)
def test_a_shape_transformers_cannot_run_is_refused_at_submit_naming_the_field(
    model_type: str, changes: dict[str, Any], field: str
) -> None:
    request = hf(model_type, **changes)
    with pytest.raises(InvalidRequest, match=rf"model.hf: {field}: .*\(got {field} "):
        train_plan(steps=1, model={"hf": request})
    # The worker's build refuses it too, before transformers builds anything.
    fields = {k: v for k, v in request.items() if k != "model_type"}
    config = HfModelConfig.model_construct(
        model_type=model_type,
        fields=fields,
        vocab_size=256,
        max_seq_len=128,
        use_checkpoint_per_layer=False,
        use_compile=False,
        compile_mode="default",
    )
    with pytest.raises(ModelBuildError, match=rf"{field}: "):
        build_model(config)
    # Given to transformers unchecked, the same config fails there: the rule is a real one.
    hf_config = AutoConfig.for_model(model_type, **fields)
    with pytest.raises(Exception):  # noqa: B017 - torch's own, whatever it is
        AutoModelForCausalLM.from_config(hf_config)(
            input_ids=torch.zeros(1, 8, dtype=torch.long), use_cache=False
        )
