"""The one name rule (store/names.py): what becomes a path component, on any system."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from trainctl.store.checkpoints.memory import MemoryStorage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.exceptions import InvalidName
from trainctl.store.kinds.prepare import PrepareRequest
from trainctl.store.kinds.sample import SampleRequest
from trainctl.store.kinds.train import TrainRequest
from trainctl.store.kinds.validate import ValidateRequest
from trainctl.store.names import (
    MAX_NAME_LENGTH,
    NAME_PATTERN,
    is_device_name,
    is_valid_experiment,
    is_valid_name,
    validate_name,
)

DEVICE_NAMES = ["CON", "con", "Nul", "PRN", "aux", "COM1", "com9", "LPT1", "lpt0", "COM0"]
WITH_EXTENSIONS = ["aux.txt", "NUL.tar.gz", "con.json", "Com1.bin", "lpt3.x"]
ENDING_IN_A_DOT = ["a.", "a.b.", "step_1.", "x" * 127 + "."]
# Near a device name, yet not one: Windows reserves the stem before the first '.' only.
NEAR_DEVICES = ["CONSOLE", "nul-x", "COM10", "LPT", "a.con", "con_1", "auxiliary", "x.nul"]


@pytest.mark.parametrize("name", DEVICE_NAMES + WITH_EXTENSIONS + ENDING_IN_A_DOT)
def test_windows_device_names_and_a_final_dot_are_no_names(name: str) -> None:
    assert not is_valid_name(name)
    with pytest.raises(InvalidName, match=re.escape(repr(name))):
        validate_name("tag", name)


@pytest.mark.parametrize("name", [*NEAR_DEVICES, "a.b", "v1.2.3", "best", "latest", "9lives"])
def test_names_near_the_rule_are_names(name: str) -> None:
    assert is_valid_name(name)


@pytest.mark.parametrize("name", DEVICE_NAMES[:3] + WITH_EXTENSIONS[:2] + ENDING_IN_A_DOT[:2])
def test_every_request_that_takes_a_name_refuses_a_device_name_or_a_final_dot(name: str) -> None:
    made = [
        lambda: TrainRequest(steps=1, experiment=name),
        lambda: TrainRequest(steps=1, resume_from=name),
        lambda: ValidateRequest(checkpoint=f"{name}/step_1"),
        lambda: ValidateRequest(checkpoint=f"exp/{name}"),
        lambda: SampleRequest(checkpoint="latest", experiment=name, prompts=["x"]),
        lambda: PrepareRequest(name=name, inputs=["x"]),
    ]
    for make in made:
        with pytest.raises(ValidationError):
            make()


@pytest.mark.parametrize("reference", ["latest", "best"])
def test_an_experiment_is_never_named_after_a_checkpoint_reference(reference: str) -> None:
    assert not is_valid_experiment(reference)
    made = [
        lambda: TrainRequest(steps=1, experiment=reference),
        lambda: ValidateRequest(checkpoint=f"{reference}/step_1"),
        lambda: ValidateRequest(checkpoint="latest", experiment=reference),
    ]
    for make in made:
        with pytest.raises(ValidationError, match="name"):
            make()
    # ... while as tags and references they keep their meaning.
    assert ValidateRequest(checkpoint=reference).checkpoint == reference
    assert ValidateRequest(checkpoint="exp/best").checkpoint == "exp/best"


@pytest.mark.parametrize("experiment", ["latest", "best", "CON", "a."])
def test_the_store_writes_no_checkpoint_under_such_an_experiment(experiment: str) -> None:
    with pytest.raises(InvalidName, match=re.escape(repr(experiment))):
        CheckpointStore(MemoryStorage()).stage(experiment, "step_1")


# Names near every edge: dots, separators, a final newline, device stems, lengths.
NAME_TEXT = st.text(alphabet="aCONUL19._-\n", max_size=12) | st.builds(
    lambda head, n: head + "a" * n, st.sampled_from(["", "a.", ".", "con."]), st.integers(120, 135)
)


@given(NAME_TEXT)
def test_the_published_pattern_is_the_rule_but_for_device_names_which_it_describes(
    name: str,
) -> None:
    # JSON Schema's pattern (ECMA 262) searches, and its `$` is the very end: Python's \Z.
    published = re.search(NAME_PATTERN.replace("$", r"\Z"), name) is not None
    within = published and len(name) <= MAX_NAME_LENGTH

    assert (within and not is_device_name(name)) == is_valid_name(name)
