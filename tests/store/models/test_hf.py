"""A transformers architecture in a request: what submit checks without torch (store.models.hf)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from trainctl.store.exceptions import InvalidRequest
from trainctl.store.kinds.train import TrainPlan, TrainRequest, resolve_train, train_need
from trainctl.store.models.hf_catalog import causal_lm_types, config_signature
from trainctl.store.models.hf_config import HfModelConfig
from trainctl.store.specs import ModelSpec

TINY_QWEN3 = {
    "model_type": "qwen3",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 128,
}


def refusal(hf: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        ModelSpec(hf=hf)
    return str(caught.value)


def test_the_catalog_reads_transformers_without_importing_torch() -> None:
    code = (
        "import sys; "
        "from trainctl.store.models.hf_catalog import causal_lm_types, config_signature; "
        "assert 'qwen3_next' in causal_lm_types(); assert config_signature('llama'); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_tested_architecture_is_a_causal_lm_with_a_readable_config() -> None:
    types = causal_lm_types()
    assert types is not None
    for model_type in ("llama", "qwen3", "qwen3_moe", "olmo2", "gemma3_text", "deepseek_v3"):
        assert model_type in types
        signature = config_signature(model_type)
        assert signature is not None and "hidden_size" in signature.defaults


def test_an_unknown_model_type_is_refused_naming_it() -> None:
    assert "'no_such_model' is not a causal LM" in refusal({"model_type": "no_such_model"})


@pytest.mark.parametrize("key", ["auto_map", "trust_remote_code", "_name_or_path", "dtype"])
def test_fields_that_load_or_run_something_are_refused(key: str) -> None:
    assert f"{key}: not accepted" in refusal({"model_type": "llama", key: "x"})


def test_a_field_the_config_does_not_have_is_refused_listing_those_it_has() -> None:
    message = refusal({"model_type": "llama", "n_layers": 2})
    assert "LlamaConfig has no field n_layers" in message and "num_hidden_layers" in message


@pytest.mark.parametrize("value", [{"a": 1}, [[[1]]], float("nan")])
def test_values_are_json_scalars_and_lists(value: Any) -> None:
    refusal({"model_type": "llama", "hidden_size": value})


def test_hf_and_a_preset_are_one_or_the_other() -> None:
    with pytest.raises(ValidationError, match=r"preset \(with overrides\) and hf: each names"):
        ModelSpec(hf={"model_type": "llama"}, preset="tiny")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
        ({"model_type": "llama", "head_dim": None, "hidden_size": 66}, "not divisible"),
        ({"vocab_size": 0}, "vocab_size must be an integer"),
    ],
)
def test_head_counts_and_sizes_that_cannot_work_are_422s(
    change: dict[str, Any], message: str
) -> None:
    request = TrainRequest(steps=1, model={"hf": TINY_QWEN3 | change})
    with pytest.raises(InvalidRequest, match=message):
        resolve_train(request, cuda_available=False, data_roots=[])


def test_a_plan_holds_the_architecture_and_reads_back_as_one() -> None:
    request = TrainRequest(steps=5, model={"hf": TINY_QWEN3}, batch={"seq_len": 64})
    plan = resolve_train(request, cuda_available=False, data_roots=[])
    config = plan.model.config
    assert isinstance(config, HfModelConfig)
    assert (config.model_type, config.vocab_size, config.max_seq_len) == ("qwen3", 256, 128)
    assert plan.model.preset is None and plan.model.hf == TINY_QWEN3
    assert TrainPlan.model_validate_json(plan.model_dump_json()) == plan
    assert train_need(plan).estimate.weights_and_optimizer > 0


def test_defaults_read_from_transformers_fill_the_sizes_submit_checks() -> None:
    # llama's default vocabulary is 32,000 and its context 2,048: byte-level data fits.
    request = TrainRequest(steps=1, model={"hf": {"model_type": "llama"}})
    config = resolve_train(request, cuda_available=False, data_roots=[]).model.config
    assert (config.vocab_size, config.max_seq_len) == (32000, 2048)


def test_a_field_the_modeling_code_reads_is_accepted_though_init_does_not_take_it() -> None:
    # Qwen3MoeConfig.__init__ has no head_dim; its attention reads getattr(config, "head_dim").
    hf = {**TINY_QWEN3, "model_type": "qwen3_moe", "head_dim": 32}
    ModelSpec(hf=hf)
    signature = config_signature("qwen3_moe")
    assert signature is not None and "head_dim" not in signature.defaults


def test_a_field_the_config_computes_or_the_base_class_defines_is_still_refused() -> None:
    # DeepSeek-V3 computes qk_head_dim from its two parts; use_return_dict is a property.
    assert "DeepseekV3Config has no field qk_head_dim" in refusal(
        {"model_type": "deepseek_v3", "qk_head_dim": 24}
    )
    message = refusal({"model_type": "qwen3_moe", "use_return_dict": True, "n_layers": 2})
    assert "has no field n_layers, use_return_dict" in message and "head_dim" in message
