"""Loss health of a train run: what a request's `health` asks of the loop when a step's loss
or gradient norm is not finite, or the loss spikes (docs/design/health.md, "Loss health").

The store half: the options, their defaults and what is refused at submit. The worker half,
which judges each step and acts on it, is `worker.training.health`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictFloat, StrictInt, model_validator

from trainctl.store.specs import MAX_STEPS, Spec

SpikeAction = Literal["off", "log", "skip", "rewind"]
NonFiniteAction = Literal["skip", "fail"]
# What a run's event says was done about one step (the `action` of its `health` record, the
# label of trainctl_health_interventions_total): a spike's action, or a non-finite step's.
INTERVENTIONS = ("log", "skip", "rewind", "fail")


class RewindSpec(Spec):
    """How a `rewind` goes back (read only when `spike.action` is 'rewind')."""

    min_steps_back: StrictInt = Field(
        1,
        ge=1,
        le=MAX_STEPS,
        description="Reload the newest step_<N> checkpoint of the run at least this many "
        "steps before the spiking step (1: the newest before it). The checkpoints of the run "
        "after it are deleted: they lie on the path into the spike.",
    )
    lr_factor: StrictFloat = Field(
        1.0,
        gt=0,
        le=1,
        description="After a rewind, train `lr_steps` steps at the schedule's lr times this "
        "factor; 1: the schedule's lr.",
    )
    lr_steps: StrictInt = Field(
        0, ge=0, le=MAX_STEPS, description="Steps the lowered lr lasts after each rewind."
    )
    max_rewinds: StrictInt = Field(
        3,
        ge=1,
        le=1000,
        description="Rewinds one run may make, over all its attempts; one more spike fails "
        "the run, naming the steps it rewound from, rather than looping.",
    )


class SpikeSpec(Spec):
    """A spike: the step's loss more than `z_threshold` standard deviations above an
    exponential moving average of the losses before it."""

    action: SpikeAction = Field(
        "rewind",
        description="'rewind': reload the last good checkpoint (`health.rewind`), skip the "
        "spiking step's data window and go on; 'skip': leave the step's update out; 'log': "
        "only say so; 'off': no detection.",
    )
    z_threshold: StrictFloat = Field(
        6.0,
        gt=0,
        le=1000,
        description="How many standard deviations above the average loss make a spike.",
    )
    warmup_steps: StrictInt = Field(
        100,
        ge=1,
        le=MAX_STEPS,
        description="Steps the average learns from before any loss is judged (counted from "
        "the start of the run; a resume continues the saved average).",
    )
    ema_decay: StrictFloat = Field(
        0.98,
        gt=0,
        lt=1,
        description="Weight of the past in the moving mean and variance of the loss (0.98: "
        "about the last 50 steps).",
    )


class HealthSpec(Spec):
    """What the loop does about a non-finite step and a loss spike; every check on by
    default, each one can be turned off."""

    nonfinite: NonFiniteAction = Field(
        "skip",
        description="A step whose loss or gradient norm is NaN or infinite on any rank: "
        "'skip' leaves its update out on every rank (the step still counts, and the schedule "
        "moves on); 'fail' fails the run. Either way the weights never see it.",
    )
    max_skips_in_a_row: StrictInt = Field(
        10,
        ge=1,
        le=MAX_STEPS,
        description="Consecutive skipped steps (non-finite or spikes) after which the run "
        "fails: a model that diverged does not recover by skipping.",
    )
    spike: SpikeSpec = Field(default_factory=SpikeSpec, description="Loss spikes.")
    rewind: RewindSpec = Field(
        default_factory=RewindSpec, description="How a spike's rewind goes back."
    )

    @model_validator(mode="after")
    def _consistent(self) -> HealthSpec:
        if self.spike.action != "rewind" and self.rewind != RewindSpec():
            raise ValueError(
                f"health.rewind is read only when health.spike.action is 'rewind', not "
                f"{self.spike.action!r}: leave health.rewind out or set the action to 'rewind'"
            )
        r = self.rewind
        if (r.lr_factor < 1) != (r.lr_steps > 0):
            raise ValueError(
                f"health.rewind.lr_factor {r.lr_factor} with health.rewind.lr_steps "
                f"{r.lr_steps}: a lowered lr needs both, a factor below 1 and the steps it "
                "lasts"
            )
        return self
