"""Launch backends: how queued runs reach workers (docs/design/backends.md).

A backend is what the service starts beside the API, by TRAINCTL_BACKEND: `local` (the
supervisor's workers on this node, and any started by hand, claim runs from the queue) or
`slurm` (each attempt of a run is one Slurm job, whose tasks serve it). The run's life cycle
(queue, claims, leases, fencing, attempts, events, checkpoints) is the run store's and the
same under every backend: a backend only starts workers for runs, and tells the store when
a job it started ends without its run having ended (`RunStore.launches`). A new one (a
Kubernetes backend) is a class here with `start`, `stop` and `status`, registered in
`BACKENDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from trainctl.service.settings import Settings
from trainctl.store.db.runs import RunStore

if TYPE_CHECKING:
    from trainctl.service.metrics import ServiceMetrics


class Backend(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None:
        """Stop starting work; hand back what this service's own processes hold."""

    def status(self) -> list[dict[str, object]]: ...


Factory = Callable[[Settings, RunStore, "ServiceMetrics | None"], Backend | None]


def _local(settings: Settings, runs: RunStore, metrics: ServiceMetrics | None) -> Backend | None:
    from trainctl.service.supervisor import Supervisor, default_worker_count

    if default_worker_count(settings)[0] == 0:
        return None  # workers started by hand (or none): nothing to supervise here
    return Supervisor(settings, runs, metrics=metrics)


def _slurm(settings: Settings, runs: RunStore, metrics: ServiceMetrics | None) -> Backend:
    from trainctl.service.backends.slurm import SlurmBackend

    return SlurmBackend(settings, runs)


BACKENDS: dict[str, Factory] = {"local": _local, "slurm": _slurm}


def build_backend(
    settings: Settings, runs: RunStore, metrics: ServiceMetrics | None = None
) -> Backend | None:
    return BACKENDS[settings.backend](settings, runs, metrics)
