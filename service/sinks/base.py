"""What a metrics sink is, and what of the event log it mirrors (docs/design/sinks.md,
"Metrics sinks").

A sink takes a train run's events in order, a batch at a time, and raises `SinkUnavailable`
when it cannot take them now or `SinkRefused` when it never will. Both sinks name metrics
alike (`scalars`: `<kind>/<field>`, an old event log's `lr_muon` as today's `lr/muon`, and an
eval score under its own name, `eval/<task>/<metric>`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from trainctl.store.db.records import Event, Run
from trainctl.store.training.optim import current_metric_names

METRIC_KINDS = ("train", "val", "eval")
"""The kinds of metrics event a train run's log holds (docs/design/shapes.md, "Shapes clients
rely on"): its own training and validation, and the scores evaluate runs record on it at their
checkpoint's step (docs/evals.md)."""
NOT_METRICS = frozenset({"kind", "step", "total_steps"})
"""Fields of a metrics event that locate it rather than measure anything."""


class SinkUnavailable(Exception):
    """The sink cannot take events now; they stay in the log and are offered again."""


class SinkRefused(Exception):
    """The sink will never take these events; the run is no longer mirrored to it."""


class Sink(Protocol):
    name: str
    """The tracker's name in a spec's `trackers`."""

    def write(self, run: Run, events: Sequence[Event], memo: dict[str, Any]) -> None:
        """Mirror the run's next `events` (in id order). `memo` is what the sink kept of the
        run last time; it may change it, and the mirror stores it with the cursor."""

    def finish(self, run: Run, memo: dict[str, Any]) -> None:
        """The run has ended and every event of it was written."""

    def close(self) -> None:
        """Release files and connections; the service is stopping."""


def scalars(data: dict[str, Any]) -> list[tuple[str, float]]:
    """The metrics of a `metrics` event's data as (name, value); none for other kinds.

    Every number counts (what a later trainctl adds is mirrored too); a field that is null,
    text or a flag (an eval event's `evaluate_run`) is not a metric.
    """
    kind = data.get("kind")
    if kind not in METRIC_KINDS or not isinstance(data.get("step"), int):
        return []
    return [
        (tracker_name(kind, key), float(value))
        for key, value in current_metric_names(data).items()
        if key not in NOT_METRICS and isinstance(value, int | float) and not isinstance(value, bool)
    ]


def tracker_name(kind: str, key: str) -> str:
    """A field's name in the trackers: `<kind>/<field>` without the kind's prefix (`val_loss`
    is `val/loss`); a field named under its kind already (`eval/arc_easy/acc`) as it is."""
    if key.startswith(f"{kind}/"):
        return key
    return f"{kind}/{key.removeprefix(f'{kind}_')}"


def sample_tag(run: Run, prompt: str) -> str:
    """One text series per prompt of the run, numbered as in its spec's `sample_prompts`."""
    prompts = run.spec.get("sample_prompts") or []
    return f"samples/{prompts.index(prompt)}" if prompt in prompts else "samples/other"
