"""Runs, workers and models as the API shows them: the one place a `RunPublic`'s
`waiting_reason` is filled in, a `WorkerPublic`'s GPU model and memory read from its `info`,
and the models a request may name gathered (`ModelsPublic`)
(docs/design/placement.md, "Placement and gangs", "Waiting, not failing").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from trainctl.service.devices import is_live, live_workers
from trainctl.service.schemas import (
    LineageNodePublic,
    LineagePublic,
    LineageRunPublic,
    ModelsPublic,
    PluginModelPublic,
    PresetPublic,
    RunPublic,
    WorkerPublic,
)
from trainctl.service.sinks.wandb import WandbConfig, wandb_url
from trainctl.store.db.launches import Launch
from trainctl.store.db.lineage import Lineage, LineageNode
from trainctl.store.db.placement import why_waiting
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.db.workers import Worker
from trainctl.store.models.hf_catalog import (
    SUPPORTED_MODEL_TYPES,
    causal_lm_types,
    supported_model_types,
)
from trainctl.store.models.presets import PRESETS


def waiting_reason(run: Run, live: Sequence[Worker], jobs: Sequence[Launch] = ()) -> str | None:
    """Why a queued run waits, in words: the scheduler's reason for its pending job (a
    launch backend's run), or what no `live` worker has (store.db.placement); None for a run
    that waits only for a worker to be free, and for any run not queued."""
    if run.state != "queued":
        return None
    if jobs:
        waiting = [j for j in jobs if j.claimed_at is None and j.ended_at is None]
        if not waiting:
            return f"waiting: a new {jobs[-1].backend} job is being submitted"
        job = waiting[-1]
        why = f" ({job.reason})" if job.reason else ""
        return f"waiting: {job.backend} job {job.job_id} {job.state.lower()}{why}"
    return why_waiting(run.placement, [w.capacity for w in live])


def public_runs(
    runs: RunStore, lease_seconds: float, items: Sequence[Run], wandb: WandbConfig | None = None
) -> list[RunPublic]:
    """The runs as the API shows them, with their jobs and, where `wandb` (the service's W&B
    settings) can name it, their W&B page; the workers are read once, and only when one of the
    runs is queued."""
    queued = any(run.state == "queued" for run in items)
    live = live_workers(runs.workers, lease_seconds) if queued else []
    jobs = runs.launches.of_runs(run.id for run in items)
    return [
        RunPublic.model_validate(
            {
                **vars(run),
                "short_id": run.short_id,
                "waiting_reason": waiting_reason(run, live, jobs.get(run.id, [])),
                "jobs": [vars(job) for job in jobs.get(run.id, [])],
                "wandb_url": wandb_url(wandb, run),
            }
        )
        for run in items
    ]


def public_run(
    runs: RunStore, lease_seconds: float, run: Run, wandb: WandbConfig | None = None
) -> RunPublic:
    return public_runs(runs, lease_seconds, [run], wandb)[0]


def public_lineage(lineage: Lineage) -> LineagePublic:
    """A run's lineage tree as GET /runs/{id}/lineage shows it."""

    def node(n: LineageNode) -> LineageNodePublic:
        brief = LineageRunPublic.model_validate(n.run).model_dump()
        return LineageNodePublic(**brief, forks=[node(f) for f in n.forks])

    return LineagePublic(
        ancestors=[LineageRunPublic.model_validate(r) for r in lineage.ancestors],
        run=LineageRunPublic.model_validate(lineage.run),
        forks=[node(f) for f in lineage.forks],
    )


def public_worker(worker: Worker, lease_seconds: float) -> WorkerPublic:
    """The worker as `/workers` shows it: its GPUs' model and memory read from its `info`
    (the GPU models it found, and its smallest GPU's memory or, on a CPU worker, the host's)."""
    models = worker.info.get("gpus")
    model = models[0] if worker.gpus and isinstance(models, list) and models else None
    memory = worker.info.get("memory_bytes") if worker.gpus else None
    return WorkerPublic(
        **vars(worker),
        gpu_model=str(model) if model is not None else None,
        gpu_memory_bytes=memory if isinstance(memory, int) else None,
        alive=is_live(worker, lease_seconds),
        draining=worker.drain_requested_at is not None,
    )


def public_models(live: Sequence[Worker]) -> ModelsPublic:
    """The models a request may name: the presets, the plug-ins of the `live` workers (each
    with the workers that have it) and the transformers model types submit accepts."""
    presets = []
    for name in PRESETS.names():
        config = PRESETS.get(name)
        presets.append(
            PresetPublic(
                name=name,
                description=PRESETS.doc(name),
                params=config.param_counts()["total"],
                flops_per_token=config.flops_per_token(config.max_seq_len),
                vocab_size=config.vocab_size,
                max_seq_len=config.max_seq_len,
            )
        )
    having: dict[str, list[str]] = {}
    for worker in live:
        for plugin in worker.model_plugins:
            having.setdefault(plugin, []).append(worker.id)
    # What the live workers build, as they reported it (of the types trainctl trains); before
    # any has, what the service's own transformers ships of those (read from its source),
    # labelled as such.
    reported = {t for worker in live for t in worker.hf_model_types} & SUPPORTED_MODEL_TYPES
    catalog = supported_model_types() if causal_lm_types() is not None else None
    types: list[str] | None = None
    source: Literal["workers", "service"] | None = None
    if reported:
        types, source = sorted(reported), "workers"
    elif catalog is not None:
        types, source = sorted(catalog), "service"
    return ModelsPublic(
        presets=presets,
        plugins=[PluginModelPublic(name=n, workers=w) for n, w in sorted(having.items())],
        hf_model_types=types,
        hf_model_types_from=source,
    )
