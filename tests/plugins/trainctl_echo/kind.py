"""The `echo` kind's record: request, plan, resolver, placement, steps (store side)."""

from __future__ import annotations

from pydantic import Field, StrictInt

from trainctl.store.exceptions import InvalidRequest
from trainctl.store.kinds.base import RunKind, one_cpu
from trainctl.store.names import Name
from trainctl.store.plans import CheckpointRef
from trainctl.store.registry import Ref
from trainctl.store.specs import Request, Spec


class EchoRequest(Request):
    message: str = Field(min_length=1, max_length=200, description="What to say.")
    steps: StrictInt = Field(3, ge=1, le=1000, description="How many times.")
    experiment: Name = Field("echo", description="Where the run is listed.")
    hold_seconds: float = Field(
        0, ge=0, le=600, description="A wait after each line that no stop cuts short."
    )


class EchoPlan(Spec):
    message: str
    steps: StrictInt
    experiment: Name
    hold_seconds: float = 0

    @property
    def filed_under(self) -> str:
        return self.experiment

    @property
    def depends_on(self) -> CheckpointRef | None:
        return None


def plan_echo(request: EchoRequest, ctx: object) -> EchoPlan:
    if "forbidden" in request.message:
        raise InvalidRequest("message: the echo kind refuses to say 'forbidden'")
    return EchoPlan(
        message=request.message,
        steps=request.steps,
        experiment=request.experiment,
        hold_seconds=request.hold_seconds,
    )


ECHO = RunKind(
    name="echo",
    request=EchoRequest,
    plan=EchoPlan,
    summary="Queue an echo run (a test plug-in).",
    resolve=Ref("trainctl_echo.kind:plan_echo"),
    placement=one_cpu,
    memory=None,
    has_steps=True,
    executor="echo",
)
