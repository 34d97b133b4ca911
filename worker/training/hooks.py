"""What a Trainer tells its run and asks of it while it trains: one record of hooks.

Every hook has a default that does nothing, so a Trainer given none (a test, a script, a
benchmark) trains, validates and saves, and tells nobody. A worker builds them from its
`RunContext` (`TrainerHooks.of_run`); the ranks of a multi-process run other than rank 0
report nothing (`TrainerHooks.silent`): rank 0 speaks for the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainctl.store.checkpoints.protection import ProtectionPolicy
from trainctl.store.checkpoints.store import CheckpointStore, Protected
from trainctl.worker.drain import Shutdown, as_shutdown

if TYPE_CHECKING:
    from trainctl.worker.context import RunContext

Callback = Callable[[dict[str, Any]], None]


def ignore(data: dict[str, Any]) -> None:
    """A report nobody hears."""


def ignore_progress(step: int, total_steps: int) -> None:
    """Progress nobody hears."""


def never() -> bool:
    return False


def nothing_protected() -> Protected:
    return frozenset()


@dataclass(frozen=True)
class TrainerHooks:
    """The Trainer's hooks (worker.training.loop.Trainer); each defaults to doing nothing."""

    on_metrics: Callback = ignore
    """A train or validation metrics event (`kind`: "train" or "val")."""
    on_checkpoint: Callback = ignore
    """A checkpoint committed: experiment, tag, step, path, save_seconds."""
    on_progress: Callable[[int, int], None] = ignore_progress
    """(step, total steps), every step, unlike metrics: the receiver throttles by time
    (RunContext.progress)."""
    on_sample: Callback = ignore
    """A training sample's generated text."""
    on_health: Callback = ignore
    """A loss-health intervention (worker.training.health): its record, `message` in words."""
    should_stop: Callable[[], bool] = never
    """Asked at every step boundary; True stops the run there, with a checkpoint."""
    protected: Callable[[], Protected] = nothing_protected
    """The checkpoints the retention after a save must keep: asked under the store's guard,
    after the commit, so a run queued meanwhile that depends on an older one keeps it."""
    before_commit: Callable[[], None] | None = None
    """Runs just before a checkpoint becomes visible; what it raises aborts the save (the
    lease check: RunContext.confirm_lease)."""
    after_commit: Callable[[str, int], None] | None = None
    """(tag, step) of a checkpoint just committed, before the retention that follows it, in
    the thread that wrote it (worker.evals.side_runs queues its evaluate runs there)."""
    drain: Shutdown | None = None
    """Set by SIGTERM or a drain request: the stop's save takes the async path and gets until
    its deadline to commit (worker.drain)."""

    def draining(self) -> bool:
        """Whether the run is stopping for a drain, with a deadline for its last save."""
        return self.drain is not None and self.drain.is_set()

    @classmethod
    def silent(cls, should_stop: Callable[[], bool] = never) -> TrainerHooks:
        """A rank's other than 0: it reports nothing and commits nothing, and only asks
        whether to stop (`should_stop`: the ranks agree on it at every step, a collective
        each of them must call)."""
        return cls(should_stop=should_stop)

    @classmethod
    def of_run(
        cls,
        ctx: RunContext,
        store: CheckpointStore,
        experiment: str,
        *,
        should_stop: Callable[[], bool] | None = None,
        after_commit: Callable[[str, int], None] | None = None,
    ) -> TrainerHooks:
        """The hooks of a worker's run: reports go to its run store (fenced by its lease),
        the retention after a save keeps what the runs of `store` depend on, and a commit
        first confirms the lease. `should_stop`: the run's own reasons unless given (the
        ranks of a multi-process run agree on theirs)."""
        protected = ProtectionPolicy(ctx.runs, store).asker(experiment)
        return cls(
            on_metrics=ctx.metrics,
            on_checkpoint=ctx.log_checkpoint,
            on_progress=ctx.progress,
            on_sample=ctx.sample,
            on_health=ctx.log_health,
            should_stop=should_stop or ctx.should_stop,
            protected=ctx.while_owned(protected),
            before_commit=ctx.confirm_lease,
            after_commit=after_commit,
            drain=as_shutdown(ctx.shutdown),
        )
