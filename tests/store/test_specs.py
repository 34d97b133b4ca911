"""Run specs: strict JSON types, and resolved specs that read back as the worker reads them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from store.specs import (
    BatchSpec,
    BenchmarkSpec,
    DataSpec,
    ModelSpec,
    OptimizerSpec,
    ScheduleSpec,
    TrainSpec,
    ValidateSpec,
    resolve_benchmark,
    resolve_train,
    resolve_validate,
)


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
        TrainSpec.model_validate(spec)

    assert [error["loc"] for error in caught.value.errors()] == [field]


SPECS: list[type[BaseModel]] = [
    ModelSpec,
    BatchSpec,
    OptimizerSpec,
    ScheduleSpec,
    DataSpec,
    TrainSpec,
    BenchmarkSpec,
    ValidateSpec,
]
REQUIRED: dict[type[BaseModel], dict[str, Any]] = {TrainSpec: {"steps": 10}}
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


def resolved_specs() -> list[BaseModel]:
    cpu: dict[str, Any] = {"cuda_available": False}
    return [
        resolve_train(TrainSpec(steps=10), data_roots=[], **cpu),
        resolve_benchmark(BenchmarkSpec(), **cpu),
        resolve_validate(ValidateSpec(), data_roots=[], max_seq_len=256, **cpu),
    ]


@pytest.mark.parametrize("spec", resolved_specs(), ids=lambda spec: type(spec).__name__)
def test_a_resolved_spec_reads_back_from_its_stored_json(spec: BaseModel) -> None:
    """The run row stores the resolved spec as JSON; the worker validates it again (strictly)."""
    stored = spec.model_dump(mode="json")

    assert type(spec).model_validate(stored) == spec
