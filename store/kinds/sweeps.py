"""A sweep: several forks of one checkpoint in one request, queued all together or none
(`POST /runs/forks`; docs/design/forks.md, "Forks"), for example three cooldown lengths."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from trainctl.store.kinds.forks import FORK_REF_PATTERN, check_fork_ref
from trainctl.store.kinds.train import TrainRequest
from trainctl.store.names import MAX_NAME_LENGTH
from trainctl.store.specs import Spec

MAX_VARIANTS = 16
"""The most forks one sweep queues."""


class ForkSweepRequest(Spec):
    """The forks of one checkpoint, each a train request of its own; `from` is every fork's
    `fork_from`."""

    from_: str = Field(
        alias="from",
        pattern=FORK_REF_PATTERN,
        max_length=2 * MAX_NAME_LENGTH + 1,
        description="The checkpoint every variant forks from, '<experiment>/<tag>' ('step_N', "
        "'best', or 'latest' for its newest step), as a train request's `fork_from`.",
    )
    variants: list[TrainRequest] = Field(
        min_length=1,
        max_length=MAX_VARIANTS,
        description="The forks: train requests without `fork_from`, each into an experiment "
        "(its branch name) of its own. Each is refused as a fork would be, and one refused "
        "queues none.",
    )

    @field_validator("from_")
    @classmethod
    def _from_ref(cls, v: str) -> str:
        return check_fork_ref("from", v)

    @model_validator(mode="after")
    def _forks_apart(self) -> ForkSweepRequest:
        names = [variant.experiment for variant in self.variants]
        for i, variant in enumerate(self.variants):
            if "fork_from" in variant.model_fields_set or variant.resume_from is not None:
                field = "fork_from" if "fork_from" in variant.model_fields_set else "resume_from"
                raise ValueError(
                    f"variants.{i}.{field}: every variant forks from the sweep's `from`; "
                    f"remove {field}"
                )
            if (first := names.index(variant.experiment)) < i:
                raise ValueError(
                    f"variants.{i}.experiment: {variant.experiment!r} is variants.{first}'s "
                    "too; each fork needs an experiment (its branch name) of its own"
                )
        return self

    def forks(self) -> list[TrainRequest]:
        """Each variant as the train request it is: a fork of `from`."""
        return [variant.model_copy(update={"fork_from": self.from_}) for variant in self.variants]
