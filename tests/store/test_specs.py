"""Run requests: strict JSON types and one name rule; plans: frozen, complete, and read back
from their stored JSON as the worker reads them."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from tests.service.fakes import save_checkpoint
from tests.support.plans import benchmark_plan, train_plan, validate_plan
from tests.support.stores import posix_store
from trainctl.store.kinds.benchmark import BenchmarkPlan, BenchmarkRequest
from trainctl.store.kinds.export import ExportPlan
from trainctl.store.kinds.prepare import PreparePlan, PrepareRequest
from trainctl.store.kinds.sample import SamplePlan
from trainctl.store.kinds.train import TrainPlan, TrainRequest
from trainctl.store.kinds.validate import ValidatePlan, ValidateRequest
from trainctl.store.specs import BatchSpec, DataSpec, ModelSpec, ScheduleSpec
from trainctl.store.training.optim import OptimizerSpec


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"steps": 10, "seed": False}, ("seed",)),
        ({"steps": True}, ("steps",)),
        ({"steps": 10, "max_keep": 2.0}, ("max_keep",)),
        ({"steps": 10, "batch": {"grad_accum_steps": "2"}}, ("batch", "grad_accum_steps")),
        ({"steps": 10, "schedule": {"warmup_frac": False}}, ("schedule", "warmup_frac")),
    ],
)
def test_a_train_spec_refuses_values_of_the_wrong_json_type(
    spec: dict[str, Any], field: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as caught:
        TrainRequest.model_validate(spec)

    assert [error["loc"] for error in caught.value.errors()] == [field]


SPECS: list[type[BaseModel]] = [
    ModelSpec,
    BatchSpec,
    OptimizerSpec,
    PrepareRequest,
    ScheduleSpec,
    DataSpec,
    TrainRequest,
    BenchmarkRequest,
    ValidateRequest,
    PrepareRequest,
]
REQUIRED: dict[type[BaseModel], dict[str, Any]] = {
    TrainRequest: {"steps": 10},
    PrepareRequest: {"name": "corpus", "inputs": ["corpus"]},
}
# JSON type in the published schema -> values of another type that lax mode would convert.
WRONG_VALUES = {"integer": [True, "8"], "number": [False, "0.5"], "boolean": [1, "true"]}
ERROR_TYPES = {"integer": "int_type", "number": "float_type", "boolean": "bool_type"}


def typed_fields() -> list[Any]:
    """(spec, field, JSON type, wrong value) for every number and boolean field of a spec."""
    cases = []
    for spec in SPECS:
        for name, prop in spec.model_json_schema()["properties"].items():
            types = {prop.get("type")} | {option.get("type") for option in prop.get("anyOf", [])}
            for json_type, wrongs in WRONG_VALUES.items():
                if json_type in types:
                    cases += [
                        pytest.param(spec, name, json_type, wrong, id=f"{spec.__name__}.{name}")
                        for wrong in wrongs
                    ]
    return cases


@pytest.mark.parametrize(("spec", "field", "json_type", "wrong"), typed_fields())
def test_every_number_and_boolean_field_refuses_a_value_of_another_json_type(
    spec: type[BaseModel], field: str, json_type: str, wrong: Any
) -> None:
    with pytest.raises(ValidationError) as caught:
        spec.model_validate(REQUIRED.get(spec, {}) | {field: wrong})

    errors = [(error["loc"], error["type"]) for error in caught.value.errors()]
    assert errors == [((field,), ERROR_TYPES[json_type])]


@pytest.mark.parametrize("name", ["step_1\n", "a..b", "..", ".hidden", "a/b", "x" * 129])
def test_a_resume_point_follows_the_one_name_rule(name: str) -> None:
    with pytest.raises(ValidationError, match="resume_from"):
        TrainRequest(steps=1, resume_from=name)


@pytest.mark.parametrize("name", ["exp\n", "a..b", "-x"])
def test_experiment_names_and_checkpoint_refs_follow_the_one_name_rule(name: str) -> None:
    with pytest.raises(ValidationError, match="experiment"):
        TrainRequest(steps=1, experiment=name)
    with pytest.raises(ValidationError, match="checkpoint"):
        ValidateRequest(checkpoint=f"{name}/step_1")


def plans(tmp_path: Path) -> list[BaseModel]:
    store = posix_store(tmp_path)
    save_checkpoint(store, "exp", step=10)
    return [
        train_plan(tmp_path, experiment="exp", steps=10, resume_from="latest"),
        benchmark_plan(),
        validate_plan(tmp_path, checkpoint="latest"),
    ]


def test_a_plan_reads_back_from_its_stored_json(tmp_path: Path) -> None:
    """The run row stores the plan as JSON; the worker validates it again."""
    for plan in plans(tmp_path):
        stored = plan.model_dump(mode="json")

        assert type(plan).model_validate(stored) == plan


def test_a_plan_pins_the_checkpoint_it_reads(tmp_path: Path) -> None:
    train, _, validate = plans(tmp_path)

    assert isinstance(train, TrainPlan) and isinstance(validate, ValidatePlan)
    assert str(train.resume_from) == str(validate.checkpoint) == "exp/step_10"


def test_a_plan_is_frozen(tmp_path: Path) -> None:
    for plan in plans(tmp_path):
        with pytest.raises(ValidationError, match="frozen"):
            plan.seed = 1  # type: ignore[attr-defined]


def optional_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every field, nested ones included, whose type admits None."""
    found = []
    for name, field in model.model_fields.items():
        args = typing.get_args(field.annotation)
        if field.annotation is None or type(None) in args:
            found.append(prefix + name)
        for t in (field.annotation, *args):
            if isinstance(t, type) and issubclass(t, BaseModel):
                found += optional_fields(t, f"{prefix}{name}.")
    return found


# Data other than a dataset names none, and a byte-level tokenizer has no file (nor its hash)
# and no end-of-text token.
DATASET_ABSENCES = ["dataset", "dataset.tokenizer.sha256", "dataset.tokenizer.eot_id"]

# Data other than a mixture names none (a validation never does); its datasets are pinned as
# a dataset is.
MIXTURE_ABSENCES = ["data.mixture", "datasets.tokenizer.sha256", "datasets.tokenizer.eot_id"]


# Sampling without a top-k limit states it with a null.
SAMPLE_ABSENCES = ["sample_every", "sample_settings.top_k"]

# A schedule in fractions states its step counts' absence with nulls: ScheduleSpec.phases,
# one function that submit and the worker both call, turns the fractions into steps.
SCHEDULE_ABSENCES = ["schedule.warmup_steps", "schedule.decay_start", "schedule.decay_steps"]

# A run that is no fork states it, and a fork point in a checkpoint no run wrote (an upload)
# has no parent run.
FORK_ABSENCES = ["fork_from", "fork_from.run_id"]

# A run without evaluations states it, and evaluations without a limit score every item.
EVALS_ABSENCES = ["evals", "evals.limit"]


@pytest.mark.parametrize(
    "plan", [TrainPlan, BenchmarkPlan, ValidatePlan, PreparePlan, SamplePlan, ExportPlan]
)
def test_a_plan_leaves_the_worker_nothing_to_default(plan: type[BaseModel]) -> None:
    # A run without a resume point, without a dataset or without samples, are the absences a
    # plan states (and one without a TensorBoard folder of its own, which writes to the data
    # dir's, or without a W&B project, not mirrored to W&B); a prepare's tokenizing processes
    # default to the cores of the worker that runs it; a checkpoint without a known tokenizer
    # samples from token ids, not text.
    # model.preset, model.hf and model.plugin record what the request named (one of the
    # three); the worker reads model.config alone.
    named_model = ["model.preset", "model.hf", "model.plugin"]
    expected = {
        TrainPlan: [
            *named_model,
            "data.dataset",
            *DATASET_ABSENCES,
            *MIXTURE_ABSENCES,
            "resume_from",
            *SAMPLE_ABSENCES,
            *SCHEDULE_ABSENCES,
            *FORK_ABSENCES,
            *EVALS_ABSENCES,
            "tensorboard_dir",
            "wandb_project",
            "min_nnodes",  # a gang of exactly nnodes, not an elastic one
            "shrink_after_seconds",
        ],
        BenchmarkPlan: [*named_model, *SCHEDULE_ABSENCES],
        ValidatePlan: ["data.dataset", "data.mixture", *DATASET_ABSENCES],
        PreparePlan: ["workers"],
        SamplePlan: [
            "tokenizer",
            "tokenizer.sha256",
            "tokenizer.eot_id",
            "prompts",
            "generation.top_k",
        ],
        ExportPlan: [],
    }
    assert sorted(optional_fields(plan)) == sorted(expected[plan])


@pytest.mark.parametrize(
    ("request_type", "body"),
    [
        (TrainRequest, {"steps": 1}),
        (BenchmarkRequest, {}),
        (ValidateRequest, {}),
        (PrepareRequest, {"name": "x", "inputs": ["x"]}),
    ],
)
def test_a_request_has_no_field_the_server_fills_in(
    request_type: type[BaseModel], body: dict[str, Any]
) -> None:
    assert not {"model_config_resolved", "warnings"} & set(request_type.model_fields)
    with pytest.raises(ValidationError, match="warnings: filled in by the server"):
        request_type.model_validate(body | {"warnings": ["mine"]})


def test_kind_adamw_refuses_the_muon_settings_it_would_ignore() -> None:
    body = {"kind": "adamw", "muon_lr": 0.05, "muon_momentum": 0.5, "adamw_lr": 1e-3}
    with pytest.raises(ValidationError) as caught:
        TrainRequest.model_validate({"steps": 10, "optimizer": body})

    [error] = caught.value.errors()
    assert error["loc"] == ("optimizer",)
    assert "optimizer kind 'adamw' does not read muon_lr, muon_momentum" in error["msg"]


def test_an_adamw_plan_sent_back_as_a_request_is_the_same_request() -> None:
    """A plan holds every setting, those its kind does not read at their defaults: the
    dashboard's resume sends it back as it is."""
    plan = train_plan(steps=10, optimizer={"kind": "adamw", "adamw_lr": 1e-3})
    again = TrainRequest(steps=10, optimizer=plan.optimizer.model_dump(mode="json"))

    assert again.optimizer == plan.optimizer
    assert type(plan).model_validate(plan.model_dump(mode="json")) == plan


def test_an_unknown_optimizer_kind_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(ValidationError, match="Input should be 'muon_adamw' or 'adamw'"):
        OptimizerSpec.model_validate({"kind": "lion"})
