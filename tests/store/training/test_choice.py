"""A kind's own settings (store/training/choice.py): the built-in kinds' settings models are
their spec's fields, each declared once, and the published schema is as it was; a plug-in kind's
model brings fields of its own, which a request sends beside `kind`, its model checks, a plan
holds, the schema lists and every other kind refuses by name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import Field, StrictInt, ValidationError

from tests.plugins.trainctl_rmsprop.kind import RMSPROP, RMSpropSettings
from tests.support.plans import train_plan
from tests.support.registries import registered
from trainctl.store.kinds.train import TrainRequest, train_need
from trainctl.store.models.presets import ModelConfig
from trainctl.store.training.choice import KindChoice, KindSettings
from trainctl.store.training.optim import BUILT_IN_KINDS, OPTIMIZER_KINDS, OptimizerSpec
from trainctl.store.training.parallelism import (
    BUILT_IN_STRATEGIES,
    PARALLEL_STRATEGIES,
    ParallelismSpec,
    ParallelStrategy,
)


@pytest.fixture
def rmsprop() -> Iterator[str]:
    with registered((OPTIMIZER_KINDS, RMSPROP.name, RMSPROP)):
        yield RMSPROP.name


def refusal(optimizer: dict[str, Any]) -> dict[str, Any]:
    """The one error of a train request with this `optimizer`."""
    with pytest.raises(ValidationError) as caught:
        TrainRequest.model_validate({"steps": 1, "optimizer": optimizer})
    [error] = caught.value.errors()
    return dict(error)


@pytest.mark.parametrize(
    ("spec", "records", "common"),
    [
        (OptimizerSpec, BUILT_IN_KINDS, {"kind", "grad_clip"}),
        (ParallelismSpec, BUILT_IN_STRATEGIES, {"strategy"}),
    ],
)
def test_a_spec_s_settings_are_its_built_in_kinds_settings_each_declared_once(
    spec: type[KindChoice], records: tuple[Any, ...], common: set[str]
) -> None:
    models = [record.settings for record in records]
    assert all(model in spec.__mro__ for model in models)
    assert spec.common_fields() == common
    assert set(spec.model_fields) == common.union(*(m.model_fields for m in models))
    for record in records:
        assert record.reads == set(record.settings.model_fields)
        for name, field in record.settings.model_fields.items():
            assert repr(spec.model_fields[name]) == repr(field), name  # bounds, default, words


def test_the_settings_of_a_built_in_kind_are_its_own_model() -> None:
    spec = OptimizerSpec(kind="adamw", adamw_lr=1e-3)
    settings = spec.settings()
    assert type(settings) is OPTIMIZER_KINDS.get("adamw").settings
    assert settings.model_dump() == {
        "adamw_lr": 1e-3,
        "adamw_beta1": 0.9,
        "adamw_beta2": 0.95,
        "adamw_eps": 1e-8,
        "adamw_weight_decay": 0.1,
    }
    assert ParallelismSpec(
        strategy="fsdp", reshard_after_forward=False
    ).settings().model_dump() == {"reshard_after_forward": False}
    assert ParallelismSpec().settings().model_dump() == {}


def test_a_plugin_kind_takes_its_own_settings_and_its_plan_holds_them(rmsprop: str) -> None:
    plan = train_plan(steps=4, optimizer={"kind": rmsprop, "rmsprop_lr": 0.005})

    assert plan.optimizer.settings() == RMSpropSettings(rmsprop_lr=0.005)
    held = plan.optimizer.model_dump(mode="json")
    # Its defaults are in the plan, as the built-in kinds' are.
    assert (held["rmsprop_lr"], held["rmsprop_alpha"], held["adamw_lr"]) == (0.005, 0.99, 3e-4)
    assert type(plan).model_validate_json(plan.model_dump_json()) == plan  # as a worker reads it
    again = TrainRequest(steps=4, optimizer=held)  # a plan sent back as a request
    assert again.optimizer == plan.optimizer
    assert isinstance(plan.model.config, ModelConfig)
    params = plan.model.config.param_counts()["total"]
    assert train_need(plan).estimate.weights_and_optimizer == params * 4 * 3


@pytest.mark.parametrize(
    ("setting", "where", "error_type"),
    [
        ({"rmsprop_alpha": 1.0}, "rmsprop_alpha", "less_than"),
        ({"rmsprop_lr": 0}, "rmsprop_lr", "greater_than"),
        ({"rmsprop_lr": "0.1"}, "rmsprop_lr", "float_type"),
    ],
)
def test_a_plugin_kind_s_model_refuses_a_setting_at_its_field(
    rmsprop: str, setting: dict[str, Any], where: str, error_type: str
) -> None:
    error = refusal({"kind": rmsprop, **setting})
    assert (error["loc"], error["type"]) == (("optimizer", where), error_type)


@pytest.mark.parametrize(
    ("optimizer", "message"),
    [
        ({"kind": "adamw", "rmsprop_lr": 0.01}, "optimizer kind 'adamw' does not read rmsprop_lr"),
        ({"rmsprop_lr": 0.01}, "optimizer kind 'muon_adamw' does not read rmsprop_lr"),
        ({"kind": "rmsprop", "adamw_lr": 1e-3}, "optimizer kind 'rmsprop' does not read adamw_lr"),
    ],
)
def test_a_setting_the_chosen_kind_does_not_declare_is_refused_by_name(
    rmsprop: str, optimizer: dict[str, Any], message: str
) -> None:
    error = refusal(optimizer)
    assert error["loc"] == ("optimizer",) and message in error["msg"]


@pytest.mark.parametrize(
    ("optimizer", "plugin"),
    [
        ({"kind": "adamw", "rmsprop_lr": 0.01}, False),
        ({"kind": "rmsprop", "rmsprop_beta": 0.5}, True),
    ],
)
def test_a_setting_no_registered_kind_reads_is_refused_at_its_field_as_ever(
    optimizer: dict[str, Any], plugin: bool
) -> None:
    """Without the plug-in `rmsprop_lr` is no kind's, and `rmsprop_beta` is never anyone's."""
    with registered(*([(OPTIMIZER_KINDS, RMSPROP.name, RMSPROP)] if plugin else [])):
        error = refusal(optimizer)
    [name] = optimizer.keys() - {"kind"}
    assert (error["loc"], error["type"]) == (("optimizer", name), "extra_forbidden")


def test_the_schema_lists_a_plugin_kind_s_settings_beside_the_built_ins_as_they_were() -> None:
    before = OptimizerSpec.model_json_schema()
    with registered((OPTIMIZER_KINDS, RMSPROP.name, RMSPROP)):
        during = OptimizerSpec.model_json_schema()
    after = OptimizerSpec.model_json_schema()

    assert before == after and before["additionalProperties"] is False
    assert during["additionalProperties"] is False
    assert during["properties"]["kind"]["enum"] == ["muon_adamw", "adamw", "rmsprop"]
    own = RMSpropSettings.model_json_schema()["properties"]
    assert during["properties"] == {
        **before["properties"],
        "kind": during["properties"]["kind"],
        **own,
    }
    assert own["rmsprop_lr"]["exclusiveMinimum"] == 0 and own["rmsprop_lr"]["maximum"] == 1


# --- a strategy's own settings --------------------------------------------------------------


class StagesSettings(KindSettings):
    stage: StrictInt = Field(1, ge=1, le=3, description="What it shards.")


STAGES = ParallelStrategy(
    name="stages_for_the_test",
    description="a strategy with a setting of its own",
    settings=StagesSettings,
    shards_state=True,
)


def test_a_plugin_strategy_takes_its_own_settings_and_refuses_fsdp_s() -> None:
    with registered((PARALLEL_STRATEGIES, STAGES.name, STAGES)):
        spec = ParallelismSpec.model_validate({"strategy": STAGES.name, "stage": 2})
        assert spec.settings() == StagesSettings(stage=2)
        with pytest.raises(ValidationError, match="'stages_for_the_test' does not read resh"):
            ParallelismSpec.model_validate(
                {"strategy": STAGES.name, "reshard_after_forward": False}
            )
        with pytest.raises(ValidationError, match="strategy 'fsdp' does not read stage"):
            ParallelismSpec.model_validate({"strategy": "fsdp", "stage": 2})
        with pytest.raises(ValidationError) as caught:
            ParallelismSpec.model_validate({"strategy": STAGES.name, "stage": 4})
        assert caught.value.errors()[0]["loc"] == ("stage",)
