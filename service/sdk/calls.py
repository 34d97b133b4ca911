"""Every call of the trainctl API, defined once for both SDK clients.

A call that is one request is a `Call`: method, path, query, body, headers, and how its answer
is read. A call made of several requests is a generator of steps (`service.sdk.steps`):
`iter_runs` follows cursors, `wait` polls until the run is finished, `events` follows the SSE
stream to its `end` frame (reconnecting where it broke off; `sample_stream` is the same stream
read as a sample run's text), and the downloads stream to disk.
Every request is retried where that is safe (`sdk_steps.send`). `TrainctlClient` and
`AsyncTrainctlClient` perform the steps; their methods are one line each.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict

from trainctl.service.schemas import (
    CheckpointPublic,
    CheckpointsPublic,
    DeliveriesPublic,
    DeliveryPublic,
    EvalItemsPublic,
    EvalTaskPublic,
    EvalTasksPublic,
    EventPublic,
    ForkSweepPublic,
    HealthPublic,
    LineagePublic,
    LogPublic,
    LogsPublic,
    MetricPublic,
    MetricsPublic,
    ModelsPublic,
    PruneResult,
    ReadinessPublic,
    RunPublic,
    RunsPublic,
    TokenCreated,
    TokenPublic,
    TokensPublic,
    WebhookCreated,
    WebhookPublic,
    WebhooksPublic,
    WorkerPublic,
    WorkersPublic,
)
from trainctl.service.sdk.steps import (
    CHUNK,
    Call,
    DownloadError,
    Emit,
    Items,
    Request,
    Sleep,
    Steps,
    StreamInterrupted,
    ask,
    backoff,
    open_stream,
    read_bytes,
    read_line,
)
from trainctl.store.vocabulary import SWEEP_NAME, TERMINAL_STATES, Scope, WebhookEvent

Progress = Callable[[int, int | None], None]
"""Download progress: (bytes on disk, total bytes or None)."""
Store = Literal["checkpoints", "exports"]
"""Where a checkpoint-like folder is served: `/checkpoints/...`, or `/exports/...` for the
transformers folders export runs write. Both answer the same models and the same file, Range
and archive responses, so one definition of each call reads either."""
FinishReason = Literal["eot", "stop", "length"]
"""Why a completion ended: the end-of-text token, a stop string, or max_new_tokens (as
worker.models.generation says it; the SDK does not import the worker, which needs torch)."""
T = TypeVar("T")

# --- runs ---


def submit(
    kind: str, spec: dict[str, Any] | BaseModel, idempotency_key: str | None
) -> Call[RunPublic]:
    if isinstance(spec, BaseModel):
        spec = spec.model_dump(mode="json", exclude_unset=True)
    # Always a key (a fresh one unless the caller has theirs), so that a retry after a lost
    # answer gets the run the first attempt created instead of a second run.
    headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
    request = Request("POST", f"/runs/{kind}", json=spec, headers=headers)
    return Call(request, RunPublic.model_validate_json)


def submit_forks(
    checkpoint: str,
    variants: Sequence[dict[str, Any] | BaseModel],
    idempotency_key: str | None,
) -> Call[list[RunPublic]]:
    """A sweep: the forks of `checkpoint` ('<experiment>/<tag>'), one per variant (a train
    request without fork_from), queued all together or none; a key as `submit` sends one."""
    body = {
        "from": checkpoint,
        "variants": [
            v.model_dump(mode="json", exclude_unset=True) if isinstance(v, BaseModel) else v
            for v in variants
        ],
    }
    headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
    request = Request("POST", f"/runs/{SWEEP_NAME}", json=body, headers=headers)
    return Call(request, lambda answer: ForkSweepPublic.model_validate_json(answer).items)


def get_run(run_id: str) -> Call[RunPublic]:
    return Call(Request("GET", f"/runs/{run_id}"), RunPublic.model_validate_json)


def list_runs(**filters: Any) -> Call[RunsPublic]:
    return Call(Request("GET", "/runs", params=only(**filters)), RunsPublic.model_validate_json)


def iter_runs(**filters: Any) -> Items[RunPublic]:
    cursor = filters.pop("cursor", None)
    while True:
        page = yield from ask(list_runs(**filters, cursor=cursor))
        for run in page.items:
            yield Emit(run)
        if (cursor := page.next_cursor) is None:
            return


def cancel_run(run_id: str) -> Call[RunPublic]:
    return Call(Request("POST", f"/runs/{run_id}/cancel"), RunPublic.model_validate_json)


def wait(run_id: str, timeout: float | None, poll: float) -> Steps[RunPublic]:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        run = yield from ask(get_run(run_id))
        if run.state in TERMINAL_STATES:
            return run
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"run {run_id} is still {run.state} after {timeout} s")
        yield Sleep(poll)


def events(run_id: str, last_event_id: int | None) -> Items[EventPublic]:
    return follow(run_id, last_event_id, lambda event: event)


def sample_stream(run_id: str, last_event_id: int | None) -> Items[SamplePiece]:
    return follow(run_id, last_event_id, SamplePiece.from_event)


def follow(
    run_id: str, last_event_id: int | None, pick: Callable[[EventPublic], T | None]
) -> Items[T]:
    """The run's events as `pick` reads them (None: not one it wants), to the run's end."""
    last = last_event_id  # of the last event delivered: where a reconnect resumes
    drops = 0  # in a row, without an event delivered in between
    while True:
        headers = {"Last-Event-ID": str(last)} if last is not None else {}
        request = Request("GET", f"/runs/{run_id}/events", headers=headers)
        yield from open_stream(request, lines=True)
        frames = SseFrames()  # a frame cut off with the connection is read again, whole
        try:
            while (line := (yield from read_line())) is not None:
                if (frame := frames.feed(line)) is None:
                    continue
                event_type, data = frame
                if event_type == "end":  # the run has finished; the server closes the stream
                    return
                event = EventPublic.model_validate_json(data)
                if last is None or event.id > last:
                    last, drops = event.id, 0
                    if (item := pick(event)) is not None:
                        yield Emit(item)
            why = "the stream ended before the run's end frame"
        except httpx.TransportError as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        drops += 1
        if not (yield from backoff(drops)):
            raise StreamInterrupted(run_id, last, drops, why)


def metrics(run_id: str, kind: str | None) -> Call[list[MetricPublic]]:
    request = Request("GET", f"/runs/{run_id}/metrics", params=only(kind=kind))
    return Call(request, lambda body: MetricsPublic.model_validate_json(body).items)


def eval_items(
    run_id: str, task: str | None, offset: int, limit: int | None
) -> Call[EvalItemsPublic]:
    params = only(task=task, offset=offset, limit=limit)
    request = Request("GET", f"/runs/{run_id}/evals/items", params=params)
    return Call(request, EvalItemsPublic.model_validate_json)


def lineage(run_id: str) -> Call[LineagePublic]:
    request = Request("GET", f"/runs/{run_id}/lineage")
    return Call(request, LineagePublic.model_validate_json)


def logs(run_id: str) -> Call[list[LogPublic]]:
    request = Request("GET", f"/runs/{run_id}/logs")
    return Call(request, lambda body: LogsPublic.model_validate_json(body).items)


# --- checkpoints ---


def list_stored(store: Store, experiment: str | None) -> Call[list[CheckpointPublic]]:
    request = Request("GET", f"/{store}", params=only(experiment=experiment))
    return Call(request, lambda body: CheckpointsPublic.model_validate_json(body).items)


def latest_checkpoint(experiment: str | None) -> Call[CheckpointPublic]:
    request = Request("GET", "/checkpoints/latest", params=only(experiment=experiment))
    return Call(request, CheckpointPublic.model_validate_json)


def best_checkpoint(experiment: str | None) -> Call[CheckpointPublic]:
    request = Request("GET", "/checkpoints/best", params=only(experiment=experiment))
    return Call(request, CheckpointPublic.model_validate_json)


def get_stored(store: Store, experiment: str, tag: str) -> Call[CheckpointPublic]:
    request = Request("GET", f"/{store}/{experiment}/{tag}")
    return Call(request, CheckpointPublic.model_validate_json)


def download_file(
    store: Store, experiment: str, tag: str, name: str, dest: Path, on_progress: Progress | None
) -> Steps[Path]:
    stored = yield from ask(get_stored(store, experiment, tag))
    download = Download(stored, name, Path(dest), on_progress)
    url = f"/{store}/{experiment}/{tag}/files/{name}"
    request = Request("GET", url, headers=download.request_headers(), follow_redirects=True)
    response = yield from open_stream(request)
    with download.open(resumed=response.status_code == 206) as out:
        while (chunk := (yield from read_bytes())) is not None:
            download.write(out, chunk)
    return download.finish()


def download_archive(store: Store, experiment: str, tag: str, dest: Path) -> Steps[Path]:
    dest = Path(dest)
    target = dest / f"{experiment}-{tag}.tar" if dest.is_dir() else dest
    partial = target.with_name(f"{target.name}.part")
    yield from open_stream(Request("GET", f"/{store}/{experiment}/{tag}/archive"))
    try:
        with open(partial, "wb") as out:
            while (chunk := (yield from read_bytes())) is not None:
                out.write(chunk)
    except BaseException:  # a stream cut short, Ctrl-C: no .part left behind, none to resume
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, target)
    return target


def delete_stored(store: Store, experiment: str, tag: str) -> Call[CheckpointPublic]:
    request = Request("DELETE", f"/{store}/{experiment}/{tag}")
    return Call(request, CheckpointPublic.model_validate_json)


def prune(experiment: str, keep_last: int, keep_best: bool, dry_run: bool) -> Call[PruneResult]:
    body = {
        "experiment": experiment,
        "keep_last": keep_last,
        "keep_best": keep_best,
        "dry_run": dry_run,
    }
    return Call(Request("POST", "/checkpoints/prune", json=body), PruneResult.model_validate_json)


# --- system ---


def workers() -> Call[list[WorkerPublic]]:
    return Call(
        Request("GET", "/workers"), lambda body: WorkersPublic.model_validate_json(body).items
    )


def drain_worker(worker_id: str) -> Call[WorkerPublic]:
    return Call(
        Request("POST", f"/workers/{worker_id}/drain"),
        WorkerPublic.model_validate_json,
    )


def models() -> Call[ModelsPublic]:
    return Call(Request("GET", "/models"), ModelsPublic.model_validate_json)


def eval_tasks() -> Call[list[EvalTaskPublic]]:
    return Call(
        Request("GET", "/evals/tasks"), lambda body: EvalTasksPublic.model_validate_json(body).items
    )


def health() -> Call[HealthPublic]:
    return Call(Request("GET", "/healthz"), HealthPublic.model_validate_json)


def readiness() -> Call[ReadinessPublic]:
    return Call(Request("GET", "/readyz"), ReadinessPublic.model_validate_json)


# --- tokens (admin) ---


def create_token(name: str, scope: Scope) -> Call[TokenCreated]:
    body = {"name": name, "scope": scope}
    return Call(Request("POST", "/tokens", json=body), TokenCreated.model_validate_json)


def list_tokens() -> Call[list[TokenPublic]]:
    return Call(
        Request("GET", "/tokens"), lambda body: TokensPublic.model_validate_json(body).items
    )


def revoke_token(name: str) -> Call[TokenPublic]:
    return Call(Request("DELETE", f"/tokens/{name}"), TokenPublic.model_validate_json)


# --- webhooks (admin) ---


def create_webhook(url: str, events: Sequence[WebhookEvent] | None) -> Call[WebhookCreated]:
    body: dict[str, Any] = {"url": url}
    if events is not None:
        body["events"] = list(events)
    return Call(Request("POST", "/webhooks", json=body), WebhookCreated.model_validate_json)


def list_webhooks() -> Call[list[WebhookPublic]]:
    return Call(
        Request("GET", "/webhooks"), lambda body: WebhooksPublic.model_validate_json(body).items
    )


def delete_webhook(webhook_id: int) -> Call[WebhookPublic]:
    return Call(Request("DELETE", f"/webhooks/{webhook_id}"), WebhookPublic.model_validate_json)


def webhook_deliveries(webhook_id: int, limit: int | None) -> Call[list[DeliveryPublic]]:
    request = Request("GET", f"/webhooks/{webhook_id}/deliveries", params=only(limit=limit))
    return Call(request, lambda body: DeliveriesPublic.model_validate_json(body).items)


# --- the parts of the calls above ---------------------------------------------------------


def only(**params: Any) -> dict[str, Any]:
    """The query without its unset (None) parameters."""
    return {k: v for k, v in params.items() if v is not None}


class Download:
    """One file download into `<target>.part`, resumable, verified against the manifest
    where it lists the file (a sharded checkpoint's stitched model file it does not)."""

    def __init__(
        self, checkpoint: CheckpointPublic, name: str, dest: Path, on_progress: Progress | None
    ) -> None:
        entry = next((f for f in checkpoint.files if f.name == name), None)
        self.label = f"{checkpoint.experiment}/{checkpoint.tag}/{name}"
        self.sha256 = entry.sha256 if entry else None  # the manifest does not list itself
        self.total = entry.size if entry else None
        self.target = dest / name if dest.is_dir() else dest
        self.part = self.target.with_name(f"{self.target.name}.part")
        self.on_progress = on_progress or (lambda done, total: None)
        self.digest = hashlib.sha256()
        self.done = 0

    def request_headers(self) -> dict[str, str]:
        """Range to resume the .part file; If-Range (the ETag) so a changed file comes whole."""
        have = self.part.stat().st_size if self.part.exists() else 0
        if not have or self.sha256 is None or (self.total is not None and have > self.total):
            return {}
        return {"Range": f"bytes={have}-", "If-Range": f'"{self.sha256}"'}

    def open(self, resumed: bool) -> IO[bytes]:
        """The .part file to write to: appended to if the server resumed (206), else anew."""
        if not resumed:
            return open(self.part, "wb")
        with open(self.part, "rb") as f:
            while chunk := f.read(CHUNK):
                self.digest.update(chunk)
                self.done += len(chunk)
        self.on_progress(self.done, self.total)
        return open(self.part, "ab")

    def write(self, out: IO[bytes], chunk: bytes) -> None:
        out.write(chunk)
        self.digest.update(chunk)
        self.done += len(chunk)
        self.on_progress(self.done, self.total)

    def finish(self) -> Path:
        digest = self.digest.hexdigest()
        if self.sha256 is not None and digest != self.sha256:
            self.part.unlink()  # a resume would only extend the wrong bytes
            raise DownloadError(
                f"{self.label}: sha256 {digest} does not match the manifest's {self.sha256}; "
                "the partial file was removed, download it again"
            )
        os.replace(self.part, self.target)
        return self.target


class SamplePiece(BaseModel):
    """A piece of a sample run's text: the data of its `sample` events.

    A completion's pieces, joined in order, are its text; the last one says why it ended.
    Pieces of several completions may come interleaved (the prompts are decoded together).
    """

    model_config = ConfigDict(frozen=True)

    index: int
    """Which completion: the place of its prompt in the request's prompts."""
    delta: str
    """The text that follows the completion's previous pieces (may be empty in the last)."""
    finish_reason: FinishReason | None = None
    """None until the completion's last piece."""

    @classmethod
    def from_event(cls, event: EventPublic) -> SamplePiece | None:
        """The piece a sample run's event carries; None for its other events (state, log).

        Only for sample runs: a train run's `sample` events are `TrainingSample`s.
        """
        return cls.model_validate(event.data) if event.type == "sample" else None


class TrainingSample(BaseModel):
    """The data of a train run's `sample` events (`sample_every`): one prompt continued by the
    model at a step, with the same seed every time, so samples differ only as the model does."""

    model_config = ConfigDict(frozen=True)

    step: int
    prompt: str
    completion: str
    finish_reason: FinishReason | None = None
    seed: int

    @classmethod
    def from_event(cls, event: EventPublic) -> TrainingSample | None:
        """The sample a train run's event carries; None for its other events."""
        return cls.model_validate(event.data) if event.type == "sample" else None


class SseFrames:
    """Assembles SSE lines into (event type, data) frames; comments and ids are skipped."""

    def __init__(self) -> None:
        self.event_type, self.data = "message", list[str]()

    def feed(self, line: str) -> tuple[str, str] | None:
        """The frame a blank line completes, else None."""
        if not line:
            frame = (self.event_type, "\n".join(self.data)) if self.data else None
            self.event_type, self.data = "message", []
            return frame
        if not line.startswith(":"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                self.event_type = value
            elif field == "data":
                self.data.append(value)
        return None
