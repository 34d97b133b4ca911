"""The wandb sink: each train run mirrored to one Weights & Biases run (TRAINCTL_WANDB_PROJECT;
docs/design/sinks.md, "Metrics sinks", "Weights & Biases").

W&B's own client (`wandb`, imported only when a run is mirrored: a service without the
setting never loads it) logs from the sink's thread in the service, never in the worker. Every
attempt of a trainctl run, and every service that mirrors it, logs to the one W&B run whose id
is derived from the trainctl run's (`wandb_id`, opened with `resume="allow"`); a fork opens its
W&B run with `fork_from` its parent's at the fork step, and a loss-health rewind
(docs/design/health.md) reopens it with `resume_from` the step it rewound to, so that the
steps trained again replace those W&B had after it.

W&B takes a run's steps in increasing order only, and trainctl's log may hold a step twice (an
attempt resumed from its checkpoint repeats the steps after it). So the sink keeps, in the
cursor's memo, the last W&B step it logged, and in memory the names it logged at it: an event
at an earlier step is not sent again, one at the same step sends only names not sent yet (a
step logged before the W&B run was last opened takes no more). Eval
scores, recorded at the step of the checkpoint they score, often after the run went on or
ended, are logged at the run's current W&B step with that checkpoint step as `eval/step`
(their charts' x-axis, `define_metric`).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trainctl.service.settings import Settings
from trainctl.service.sinks.base import SinkRefused, SinkUnavailable, scalars
from trainctl.store.checkpoints.manifests import MANIFEST_FILE
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.records import Event, Run
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import NotFound, RunNotFound

log = logging.getLogger("trainctl.sinks")

ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What W&B accepts as a run id (and in its URLs)."""
EVAL_STEP = "eval/step"
"""The x-axis of eval scores: the step of the checkpoint they score."""
SAMPLES = "samples"
SAMPLE_COLUMNS: list[str | int] = ["step", "prompt", "completion"]
STATUS_EXIT = {"succeeded": 0, "cancelled": 0}
"""A W&B run's exit code by the trainctl run's end; any other end is 1 (failed)."""
MAX_TAG = 64


@dataclass(frozen=True)
class WandbConfig:
    """The service's W&B settings (TRAINCTL_WANDB_*)."""

    project: str
    entity: str | None
    mode: str
    base_url: str | None
    dir: Path
    """The folder W&B's client makes its own `wandb/` in: the data dir."""
    timeout: float


def wandb_config(settings: Settings) -> WandbConfig | None:
    """The service's W&B settings; None where TRAINCTL_WANDB_PROJECT is unset (the sink is off)."""
    if settings.wandb_project is None:
        return None
    return WandbConfig(
        project=settings.wandb_project,
        entity=settings.wandb_entity,
        mode=settings.wandb_mode,
        base_url=settings.wandb_base_url,
        dir=settings.wandb_dir.parent,  # W&B adds the wandb/ itself
        timeout=settings.wandb_timeout_seconds,
    )


def wandb_id(run_id: str) -> str:
    """The W&B run id of trainctl run `run_id`: the same for every attempt and every service,
    the run id itself where W&B accepts it (a trainctl id is 32 hex digits)."""
    if ID_PATTERN.fullmatch(run_id):  # never `$`: it matches before a final newline
        return run_id
    return hashlib.sha256(run_id.encode()).hexdigest()[:32]


def wandb_url(config: WandbConfig | None, run: Run) -> str | None:
    """The W&B run page of `run`; None where it is not mirrored to W&B, offline (nothing to
    link to) or without an entity (W&B's URLs name it, and only the server knows the key's
    own)."""
    if config is None or config.mode != "online" or config.entity is None:
        return None
    if "wandb" not in (run.spec.get("trackers") or []):
        return None
    app = (config.base_url or "https://api.wandb.ai").rstrip("/")
    parts = urlsplit(app)
    if parts.hostname and parts.hostname.startswith("api."):  # W&B's cloud: api.wandb.ai
        app = f"{parts.scheme}://{parts.netloc.removeprefix('api.')}"
    return f"{app}/{config.entity}/{project_of(config, run)}/runs/{wandb_id(run.id)}"


def project_of(config: WandbConfig, run: Run) -> str:
    """The W&B project of `run`: its plan's (pinned at submit), else the service's."""
    return str(run.spec.get("wandb_project") or config.project)


@dataclass
class _Open:
    """A W&B run this service has open, and where its history stands."""

    run: Any  # wandb.Run: the type lives in a package imported only when used
    step: int
    """The last W&B step logged (-1: none)."""
    keys: set[str] | None = field(default_factory=set)
    """The names logged at `step`; None: that step is closed to further names."""


class WandbSink:
    name = "wandb"

    def __init__(self, config: WandbConfig, checkpoints: CheckpointStore, runs: RunStore) -> None:
        """`runs`: where a fork's parent is read, to know whether W&B has it to fork from."""
        self.config, self.checkpoints, self.runs = config, checkpoints, runs
        self._open: dict[str, _Open] = {}

    def write(self, run: Run, events: Sequence[Event], memo: dict[str, Any]) -> None:
        if not any(_mirrored(e) for e in events):
            return
        wb = self._ensure_run(run, memo)
        try:
            for event in events:
                self._write_event(run, wb, event, memo)
        except (SinkRefused, SinkUnavailable):
            raise
        except Exception as exc:  # the client failed mid-batch: open the run afresh next time
            self._drop(run.id)
            raise SinkUnavailable(f"W&B client: {exc}") from exc
        finally:
            memo["step"] = wb.step

    def finish(self, run: Run, memo: dict[str, Any]) -> None:
        wb = self._open.pop(run.id, None)
        if wb is None:
            return  # nothing was logged in this service since the run's last finish
        try:
            wb.run.finish(exit_code=STATUS_EXIT.get(run.state, 1))
        except Exception as exc:
            raise SinkUnavailable(f"W&B client could not finish the run: {exc}") from exc

    def close(self) -> None:
        for run_id in list(self._open):
            wb = self._open.pop(run_id)
            try:
                # The run goes on elsewhere: a resume (resume="allow") picks it up.
                wb.run.finish()
            except Exception:
                log.exception("wandb sink: finishing W&B run of %s", run_id)

    # ---- the W&B run -------------------------------------------------------------------------

    def _ensure_run(self, run: Run, memo: dict[str, Any]) -> _Open:
        """The W&B run mirroring `run`, opened (resumed, or forked) the first time this
        service logs to it."""
        if run.id in self._open:
            return self._open[run.id]
        fork = run.parent
        kwargs: dict[str, Any] = {"resume": "allow"}
        project = project_of(self.config, run)
        forked = "step" not in memo and self._parent_in(run, project)
        if forked:
            assert fork is not None and fork.run_id is not None
            # fork_from makes a new run; once it exists, later opens resume it.
            kwargs = {"fork_from": f"{wandb_id(fork.run_id)}?_step={fork.step}"}
        handle = self._init(run, project, kwargs)
        # Steps logged already, by this sink before (memo) or, online, as the server knows:
        # W&B resumes a run at the step after its last one.
        last = max(memo.get("step", -1), getattr(handle, "starting_step", 0) - 1)
        if forked:
            assert fork is not None
            last = max(last, fork.step)
        wb = _Open(handle, last, keys=None)  # a step before this open is closed to new names
        self._open[run.id] = wb
        return wb

    def _rewind(self, run: Run, wb: _Open, step: int) -> None:
        """Reopen the W&B run at `step` (`resume_from`): the run went back to its checkpoint
        there and trains the steps after it again, which W&B then takes in place of those it
        had. In place, so the batch being written goes on with it."""
        # Out of the open runs until reopened: if that fails, the batch is offered again,
        # from before this rewind, to a run opened afresh.
        self._open.pop(run.id, None)
        wb.run.finish()
        wb.run = self._init(run, project_of(self.config, run), {
            "resume_from": f"{wandb_id(run.id)}?_step={step}"
        })  # fmt: skip
        wb.step, wb.keys = step, None  # the step it rewound to stays as it was
        self._open[run.id] = wb

    def _init(self, run: Run, project: str, kwargs: dict[str, Any]) -> Any:
        import wandb  # here, not above: a service without TRAINCTL_WANDB_PROJECT never loads it

        try:
            handle = wandb.init(
                project=project,
                entity=self.config.entity,
                id=wandb_id(run.id),
                name=f"{run.experiment}/{run.short_id}",
                group=run.experiment,
                job_type="train",
                config=run.spec,
                notes=_notes(run),
                tags=_tags(run),
                dir=str(self._dir()),
                reinit="create_new",  # one W&B run per trainctl run, several at once
                settings=self._settings(wandb),
                **kwargs,
            )
            handle.define_metric("eval/*", step_metric=EVAL_STEP)
        except wandb.errors.UsageError as exc:
            if "API key" in str(exc):  # the operator's to fix, and `wandb login` takes effect
                raise SinkUnavailable(
                    "no W&B API key: set WANDB_API_KEY or run `wandb login` (~/.netrc)"
                ) from exc
            raise SinkRefused(f"W&B refused the run: {exc}") from exc
        except Exception as exc:  # unreachable, timed out, no key: the next try may do
            raise SinkUnavailable(f"W&B client could not open the run: {exc}") from exc
        return handle

    def _parent_in(self, run: Run, project: str) -> bool:
        """Whether `run` is a fork whose parent W&B has in `project`: mirrored there by this
        sink (its trackers name wandb), so that W&B has a run to branch from."""
        if run.parent is None or run.parent.run_id is None:
            return False
        try:
            parent = self.runs.get(run.parent.run_id)
        except RunNotFound:
            return False
        mirrored = "wandb" in (parent.spec.get("trackers") or [])
        return mirrored and project_of(self.config, parent) == project

    def _settings(self, wandb: Any) -> Any:
        """The client as a guest in the API process: no console capture, no system metrics,
        code or git of the service's own."""
        options: dict[str, Any] = {
            "mode": self.config.mode,
            "console": "off",
            "silent": True,
            "x_disable_stats": True,
            "x_disable_meta": True,
            "x_disable_machine_info": True,
            "x_save_requirements": False,
            "disable_git": True,
            "save_code": False,
            "init_timeout": self.config.timeout,
            "finish_timeout": self.config.timeout,
        }
        if self.config.base_url:
            options["base_url"] = self.config.base_url
        return wandb.Settings(**options)

    def _dir(self) -> Path:
        try:
            self.config.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SinkUnavailable(f"cannot make {self.config.dir}: {exc}") from exc
        return self.config.dir

    def _drop(self, run_id: str) -> None:
        wb = self._open.pop(run_id, None)
        if wb is not None:
            try:
                wb.run.finish(exit_code=1)
            except Exception:
                log.exception("wandb sink: closing W&B run of %s", run_id)

    # ---- events ------------------------------------------------------------------------------

    def _write_event(self, run: Run, wb: _Open, event: Event, memo: dict[str, Any]) -> None:
        data = event.data
        if event.type == "metrics" and data.get("kind") == "eval":
            self._log_eval(wb, data)
        elif event.type == "metrics":
            _log_at(wb, data.get("step"), dict(scalars(data)))
        elif event.type == "sample" and isinstance(data.get("step"), int) and "prompt" in data:
            import wandb

            row = [data["step"], data["prompt"], data.get("completion") or ""]
            table = wandb.Table(columns=SAMPLE_COLUMNS, data=[row])
            _log_at(wb, data["step"], {SAMPLES: table})
        elif event.type == "log" and isinstance(data.get("checkpoint"), dict):
            self._log_checkpoint(run, wb, data["checkpoint"], memo)
        elif (step := _rewound_to(event)) is not None and step < wb.step:
            self._rewind(run, wb, step)

    def _log_eval(self, wb: _Open, data: dict[str, Any]) -> None:
        values = dict(scalars(data))
        if not values:
            return
        values[EVAL_STEP] = float(data["step"])
        # At the run's current step where these names are not logged yet, else the next one.
        step = wb.step if wb.keys is not None and not (wb.keys & values.keys()) else wb.step + 1
        _log_at(wb, max(step, 0), values)

    def _log_checkpoint(
        self, run: Run, wb: _Open, saved: dict[str, Any], memo: dict[str, Any]
    ) -> None:
        """A checkpoint save as a W&B artifact by reference: its manifest's location and
        sha256, never a copy of the weights."""
        experiment, tag, step = saved.get("experiment"), saved.get("tag"), saved.get("step")
        if not (isinstance(experiment, str) and isinstance(tag, str) and isinstance(step, int)):
            return
        # A copy: the mirror compares the memo with the cursor's to know whether to save it.
        logged: dict[str, int] = dict(memo.get("checkpoints", {}))
        if step <= logged.get(tag, -1):
            return  # logged already (a batch offered again, a resumed attempt's save)
        try:
            _, reader = self.checkpoints.open_file(experiment, tag, MANIFEST_FILE)
            with reader:
                manifest = reader.read()
        except NotFound:
            memo["checkpoints"] = logged | {tag: step}
            return  # pruned or deleted since: nothing to point at
        import wandb

        where = self.checkpoints.describe(experiment, tag, MANIFEST_FILE)
        uri = Path(where).as_uri() if where.startswith("/") else where
        artifact = wandb.Artifact(
            _artifact_name(experiment),
            type="model",
            metadata={
                "trainctl_run_id": run.id,
                "experiment": experiment,
                "tag": tag,
                "step": step,
                "manifest_uri": uri,
                "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
            },
        )
        artifact.add_reference(uri, name=MANIFEST_FILE, checksum=False)
        # The tag as its alias: a moving tag (`best`) moves to its newest version.
        wb.run.log_artifact(artifact, aliases=[tag])
        memo["checkpoints"] = logged | {tag: step}


def _log_at(wb: _Open, step: object, values: dict[str, Any]) -> None:
    """Log `values` at W&B step `step` unless sent already: W&B's steps only increase."""
    if not isinstance(step, int) or not values:
        return
    if step < wb.step:
        return  # a repeated step (an attempt resumed from an earlier checkpoint)
    if step == wb.step:
        if wb.keys is None:
            return
        values = {k: v for k, v in values.items() if k not in wb.keys}
        if not values:
            return
    else:
        wb.step, wb.keys = step, set()
    wb.run.log(values, step=step)
    assert wb.keys is not None
    wb.keys |= values.keys()


def _mirrored(event: Event) -> bool:
    if event.type in ("metrics", "sample"):
        return True
    checkpoint = event.type == "log" and isinstance(event.data.get("checkpoint"), dict)
    return checkpoint or _rewound_to(event) is not None


def _rewound_to(event: Event) -> int | None:
    """The step a loss-health rewind went back to (its `log` event's `health` record,
    worker.training.health); None for any other event, or a rewind that found no checkpoint
    to go back to (it stayed where it was: no step is trained twice)."""
    health = event.data.get("health") if event.type == "log" else None
    if not isinstance(health, dict) or health.get("action") != "rewind":
        return None
    step = health.get("rewound_to")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _notes(run: Run) -> str:
    notes = f"trainctl run {run.id} (experiment {run.experiment})"
    if run.parent is not None:
        p = run.parent
        notes += f"; forked from run {p.run_id} at checkpoint {p.experiment}/{p.tag}, step {p.step}"
    return notes


def _tags(run: Run) -> list[str]:
    tags = ["trainctl", f"experiment:{run.experiment}"[:MAX_TAG]]
    if run.parent is not None:
        tags.append("fork")
    return tags


def _artifact_name(experiment: str) -> str:
    """One artifact per experiment's checkpoints, a version per save."""
    return "checkpoints-" + re.sub(r"[^A-Za-z0-9._-]", "-", experiment)
