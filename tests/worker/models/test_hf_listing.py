"""Every transformers type GET /models lists trains, and what a listed type cannot build or
run is refused at submit naming the field (docs/models.md, "What is checked where"): the
generic rules (token ids, the rotary dimension, the bound on every size) over every listed
type, each shown to be a real one where transformers, given the config unchecked, fails."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from tests.support.hf_archs import BASE, TINY, base, hf
from tests.support.plans import train_plan
from trainctl.service.presenters import public_models
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.models.generation import GenerationSettings
from trainctl.store.models.hf_catalog import config_fields
from trainctl.store.models.hf_config import HfModelConfig
from trainctl.store.models.hf_rules import ROTARY_FIELDS, dimension_cap
from trainctl.worker.models import build_model
from trainctl.worker.models.generation import generate_tokens
from trainctl.worker.models.hf import ModelBuildError
from trainctl.worker.training.memory import count_params

LISTED = public_models([]).hf_model_types or []
REFUSED = (InvalidRequest, ValidationError)


def one_step(config: HfModelConfig) -> float:
    model = build_model(config, seed=0)
    tokens = torch.randint(0, config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    loss, _ = model.loss(tokens, tokens)
    loss.backward()
    return float(loss.detach())


def unchecked(request: dict[str, Any]) -> HfModelConfig:
    """The config as a plan would hold it had submit not checked it."""
    fields = {k: v for k, v in request.items() if k != "model_type"}
    return HfModelConfig.model_construct(
        model_type=request["model_type"],
        fields=fields,
        vocab_size=256,
        max_seq_len=128,
        use_checkpoint_per_layer=False,
        use_compile=False,
        compile_mode="default",
    )


def test_the_listing_names_the_types_tested_here() -> None:
    assert LISTED and set(LISTED) <= set(TINY)
    assert {"mamba", "rwkv", "phi3", "gpt_neox", "mistral"} <= set(LISTED)


@pytest.mark.parametrize("model_type", LISTED)
def test_every_listed_type_trains_a_step(model_type: str) -> None:
    plan = train_plan(steps=1, model={"hf": hf(model_type)})
    assert isinstance(plan.model.config, HfModelConfig)
    assert math.isfinite(one_step(plan.model.config))


@pytest.mark.parametrize("model_type", LISTED)
def test_every_listed_type_samples(model_type: str) -> None:
    """A train run samples as it goes: Mamba's and RWKV's recurrent state is no
    past_key_values cache, so they decode recomputing the prefix."""
    config = train_plan(steps=1, model={"hf": hf(model_type)}).model.config
    model = build_model(config, seed=0).eval()
    settings = GenerationSettings(max_new_tokens=3, temperature=0.0)
    out = generate_tokens(model, [[1, 2, 3], [4, 5]], settings)
    assert [len(row) for row in out] == [3, 3]


@pytest.mark.parametrize("model_type", LISTED)
def test_a_listed_types_defaults_at_a_small_size_build_or_are_refused_naming_a_field(
    model_type: str,
) -> None:
    """The model type's own defaults, with only the tiny sizes given (phi3's pad and eos
    ids are 32000): refused naming a field, or built (on the meta device: a default may be
    wide) with the parameters submit's estimate does not undercount tenfold."""
    request = {"model_type": model_type, **base(model_type)}
    try:
        plan = train_plan(steps=1, model={"hf": request})
    except REFUSED as exc:
        assert any(f in str(exc) for f in config_fields(model_type) or ()), str(exc)
        return
    config = plan.model.config
    assert isinstance(config, HfModelConfig)
    assert count_params(config) <= 10 * config.sizes()["params"]


def test_phi3s_default_pad_token_is_refused_naming_it() -> None:
    with pytest.raises(REFUSED, match=r"pad_token_id 32000.*vocab_size - 1 \(255\)"):
        train_plan(steps=1, model={"hf": {"model_type": "phi3", **base("phi3")}})


def _rotary(model_type: str) -> bool:
    return bool((config_fields(model_type) or frozenset()) & ROTARY_FIELDS)


ODD_HEADS = [t for t in LISTED if _rotary(t)]


@pytest.mark.parametrize("model_type", ODD_HEADS)
def test_an_odd_rotary_head_dimension_is_refused_naming_head_dim(model_type: str) -> None:
    """Hidden 60 over 4 heads (head_dim 15), or head_dim 15 where the type takes it."""
    taken = config_fields(model_type) or frozenset()
    if "qk_rope_head_dim" in taken:
        change, field = {"qk_rope_head_dim": 7}, "qk_rope_head_dim"
    elif "head_dim" in taken:
        change, field = {"head_dim": 15}, "head_dim"
    else:
        change, field = {"hidden_size": 60, "num_attention_heads": 4}, "head_dim"
    change = {k: v for k, v in change.items() if k in taken or k in BASE}
    request = hf(model_type, **change)
    with pytest.raises(REFUSED, match=rf"{field}: rotary embeddings"):
        train_plan(steps=1, model={"hf": request})
    # The worker refuses it too, before building anything.
    with pytest.raises(ModelBuildError, match=rf"{field}: rotary embeddings"):
        build_model(unchecked(request))


@pytest.mark.parametrize("model_type", LISTED)
@pytest.mark.parametrize("field", ["pad_token_id", "bos_token_id", "eos_token_id"])
def test_a_token_id_outside_the_vocabulary_is_refused_naming_it(
    model_type: str, field: str
) -> None:
    request = hf(model_type, **{field: 256})
    with pytest.raises(REFUSED, match=rf"{field} 256: token ids are from 0"):
        train_plan(steps=1, model={"hf": request})
    with pytest.raises(ModelBuildError, match=rf"{field} 256"):
        build_model(unchecked(request))


def _size_fields(model_type: str) -> list[str]:
    return sorted(
        k for k in config_fields(model_type) or () if dimension_cap(k) is not None and k not in BASE
    )


HUGE = [(t, k) for t in LISTED for k in _size_fields(t)]


@pytest.mark.parametrize(("model_type", "field"), HUGE)
def test_a_huge_value_in_any_size_field_is_refused_naming_it(model_type: str, field: str) -> None:
    request = hf(model_type, **{field: 1 << 26})
    with pytest.raises(REFUSED, match=rf"{field} 67108864 \(at most"):
        train_plan(steps=1, model={"hf": request})
    with pytest.raises(ModelBuildError, match=rf"{field} 67108864"):
        build_model(unchecked(request))
