"""Prometheus metrics: the queue, the workers, running runs, and the HTTP API itself.

Gauges (runs by state, queue depth, workers alive, each running run's loss and tokens/s) are
read from the run store when Prometheus scrapes. Step times and checkpoint saves come from
the runs' event logs: each scrape reads the events written since the previous one and
observes them into histograms, and counts the loss-health interventions (their log lines'
`health`). A checkpoint save's duration is the gap between the last
metrics event before it (the step, or the validation, that it follows) and its "saved
checkpoint" log line, both stamped by the store's clock. The supervisor counts the local
workers it restarts and the slots it gave up on (their worker kept crashing at start), when
it is given this object.

Everything lives in one process's registry, so with several uvicorn processes each would
count only its own HTTP requests; trainctl serves from one process (`trainctl serve`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from trainctl.service.devices import live_workers
from trainctl.service.history import PAGE
from trainctl.service.settings import Settings
from trainctl.store.db.records import Event, Run
from trainctl.store.db.runs import RunStore
from trainctl.store.db.stats import count_runs_by_state
from trainctl.store.vocabulary import RUN_STATES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
SAVE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


@dataclass
class RunFollower:
    """Where this process has read a run's event log up to, and what it saw last."""

    run: Run
    after_id: int = 0
    loss: float | None = None
    tokens_per_sec: float | None = None
    step: int | None = None
    slowdowns: dict[str, float] = field(default_factory=dict)
    """Its stragglers' slowdowns by rank, from its last straggler report (a `straggler` log
    event: worker.training.hangs); {} when it has none."""


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_requests = Counter(
            "trainctl_http_requests",
            "HTTP requests answered, by route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.http_latency = Histogram(
            "trainctl_http_request_duration_seconds",
            "Time to answer an HTTP request (an event stream: until it closed).",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.step_time = Histogram(
            "trainctl_step_time_seconds",
            "Optimizer step time reported by workers (train; benchmark measure steps).",
            ["kind"],
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.checkpoint_save = Histogram(
            "trainctl_checkpoint_save_seconds",
            "Checkpoint save time: from the metrics event before it to its 'saved' log line.",
            buckets=SAVE_BUCKETS,
            registry=self.registry,
        )
        self.hangs = Counter(
            "trainctl_run_hangs",
            "Attempts of train runs stopped because a rank hung (a `hang` log event).",
            registry=self.registry,
        )
        self.health_interventions = Counter(
            "trainctl_health_interventions",
            "Loss-health interventions of train runs (docs/design/health.md), by action: "
            "log, skip, rewind, fail.",
            ["action"],
            registry=self.registry,
        )
        self.worker_restarts = Counter(
            "trainctl_worker_restarts",
            "Local workers started again after they exited, by slot.",
            ["slot"],
            registry=self.registry,
        )
        self.worker_slots_given_up = Gauge(
            "trainctl_worker_slots_given_up",
            "Local worker slots no longer restarted: their worker kept crashing at start.",
            registry=self.registry,
        )
        self._followers: dict[str, RunFollower] = {}
        self._gauges: list[Metric] = []
        self._lock = threading.Lock()
        self.registry.register(_Snapshot(self))

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.http_requests.labels(method, route, str(status)).inc()
        self.http_latency.labels(method, route, str(status)).observe(seconds)

    def render(self, runs: RunStore, settings: Settings) -> bytes:
        """The exposition text, after catching up with the store."""
        with self._lock:  # two scrapes at once must not observe the same events twice
            self._gauges = self._read_store(runs, settings)
            return generate_latest(self.registry)

    def _read_store(self, runs: RunStore, settings: Settings) -> list[Metric]:
        counts = count_runs_by_state(runs)
        by_state = GaugeMetricFamily("trainctl_runs", "Runs by state.", labels=["state"])
        for state in RUN_STATES:
            by_state.add_metric([state], counts.get(state, 0))
        alive = len(live_workers(runs.workers, settings.lease_seconds))
        return [
            by_state,
            GaugeMetricFamily("trainctl_queue_depth", "Runs waiting for a worker.",
                              value=counts.get("queued", 0)),
            GaugeMetricFamily("trainctl_workers_alive", "Workers seen within the lease.",
                              value=alive),
            *self._follow_running(runs),
        ]  # fmt: skip

    def _follow_running(self, runs: RunStore) -> Iterator[Metric]:
        running, _ = runs.list_runs(state="running", limit=500)
        for run in running:
            self._followers.setdefault(run.id, RunFollower(run)).run = run
        current = {run.id for run in running}
        labels = ["run_id", "experiment", "kind"]
        loss = GaugeMetricFamily("trainctl_run_loss", "Latest training loss.", labels=labels)
        speed = GaugeMetricFamily(
            "trainctl_run_tokens_per_second", "Latest tokens/s of a step.", labels=labels
        )
        step = GaugeMetricFamily("trainctl_run_step", "Latest step reported.", labels=labels)
        slow = GaugeMetricFamily(
            "trainctl_run_straggler_slowdown",
            "A straggling rank's median own step time over the other ranks', minus 1 (0.25: "
            "25 % slower), as last reported; no sample while a run has no straggler.",
            labels=[*labels, "rank"],
        )
        for run_id, follower in list(self._followers.items()):
            # A run that finished since the last scrape is read one last time, then dropped.
            self._catch_up(runs, follower)
            if run_id not in current:
                del self._followers[run_id]
                continue
            values = [run_id, follower.run.experiment, follower.run.kind]
            for family, value in (
                (loss, follower.loss),
                (speed, follower.tokens_per_sec),
                (step, follower.step),
            ):
                if value is not None:
                    family.add_metric(values, value)
            for rank, slowdown in follower.slowdowns.items():
                slow.add_metric([*values, rank], slowdown)
        return iter([loss, speed, step, slow])

    def _catch_up(self, runs: RunStore, follower: RunFollower) -> None:
        while True:
            page = runs.events(follower.run.id, after_id=follower.after_id, limit=PAGE)
            for event in page:
                self._observe(follower, event)
                follower.after_id = event.id
            if len(page) < PAGE:
                return

    def _observe(self, follower: RunFollower, event: Event) -> None:
        data = event.data
        if event.type == "metrics":
            if data.get("kind") in ("train", "measure") and "step_time_sec" in data:
                self.step_time.labels(data["kind"]).observe(float(data["step_time_sec"]))
                follower.loss = _number(data.get("loss"), follower.loss)
                follower.tokens_per_sec = _number(data.get("tokens_per_sec"), None)
                follower.step = int(data.get("step", 0))
        elif event.type == "log" and isinstance(health := data.get("health"), dict):
            self.health_interventions.labels(str(health.get("action"))).inc()
        elif event.type == "log" and isinstance(saved := data.get("checkpoint"), dict):
            seconds = _number(saved.get("save_seconds"), None)
            if seconds is not None:
                self.checkpoint_save.observe(max(seconds, 0.0))
        elif event.type == "log" and isinstance(straggler := data.get("straggler"), dict):
            slowdowns = straggler.get("slowdowns")
            if isinstance(slowdowns, dict):
                found = {str(rank): _number(v, None) for rank, v in slowdowns.items()}
                follower.slowdowns = {r: x for r, x in found.items() if x is not None}
        elif event.type == "log" and isinstance(data.get("hang"), dict):
            self.hangs.inc()


class _Snapshot:
    """A collector that hands out the gauges `render` just read from the store."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # names are only known at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics._gauges)


def _number(value: object, default: float | None) -> float | None:
    return float(value) if isinstance(value, int | float) else default
