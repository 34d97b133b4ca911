"""Python SDK for the trainctl API (httpx): `TrainctlClient` here, `AsyncTrainctlClient` in
`service.sdk.async_client`, with the same calls.

    with TrainctlClient() as api:                 # TRAINCTL_URL, TRAINCTL_API_TOKEN
        run = api.submit_train(experiment="demo", steps=200)
        for event in api.events(run.id):          # EventPublic, until the run ends
            print(event.type, event.data)
        api.download_file("demo", "best", "model.safetensors", Path("weights/"))
        sample = api.submit_sample(checkpoint="demo/best", prompts=["def "])
        for piece in api.sample_stream(sample.id):  # SamplePiece: index, delta, finish_reason
            print(piece.delta, end="")

Answers are the API's own response models (`service.schemas`: RunPublic, CheckpointPublic,
...), so a field typo is a type error, not a KeyError at runtime. Every non-2xx answer raises
`ApiError` carrying the server's `detail`, as the subclass for its status where there is one
(`NotFound`, `Conflict`, `Unauthorized`, `InvalidRequest`).

Failures that a retry can mend are retried, `retries` times with a doubling `backoff`: a
connection refused or broken off, 503 (after its Retry-After), and for reads and submits
(which carry an Idempotency-Key) 502 and 504 too. `events` reconnects where its stream broke
off, with Last-Event-ID, so no event is repeated or skipped.

Each call is defined once, in `service.sdk.calls`; this client performs its steps with
httpx.Client, blocking.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from contextlib import closing
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from trainctl.service.schemas import (
    CheckpointPublic,
    DeliveryPublic,
    EvalItemsPublic,
    EvalTaskPublic,
    EventPublic,
    HealthPublic,
    LineagePublic,
    LogPublic,
    MetricPublic,
    ModelsPublic,
    PruneResult,
    ReadinessPublic,
    RunPublic,
    RunsPublic,
    TokenCreated,
    TokenPublic,
    WebhookCreated,
    WebhookPublic,
    WorkerPublic,
)
from trainctl.service.sdk import calls
from trainctl.service.sdk.calls import Progress, SamplePiece, TrainingSample
from trainctl.service.sdk.steps import (
    CHUNK,
    ApiError,
    Backoff,
    Call,
    Conflict,
    DownloadError,
    Emit,
    InvalidRequest,
    Items,
    NotFound,
    Read,
    RetryPolicy,
    Send,
    Sleep,
    Step,
    Steps,
    StreamInterrupted,
    Unauthorized,
    answered,
    ask,
    client_kwargs,
)
from trainctl.store.vocabulary import Scope, WebhookEvent

__all__ = [
    "ApiError",
    "Conflict",
    "DownloadError",
    "InvalidRequest",
    "NotFound",
    "Progress",
    "SamplePiece",
    "StreamInterrupted",
    "TrainctlClient",
    "TrainingSample",
    "Unauthorized",
]

T = TypeVar("T")
R = TypeVar("R")


class TrainctlClient:
    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        *,
        retries: int = 3,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """`retries`: attempts after the first, and reconnects of an event stream in a row
        (0: none). `backoff`: seconds before the first retry, doubled for each next one."""
        self._retry = RetryPolicy(retries, backoff)
        self._http = httpx.Client(transport=transport, **client_kwargs(base_url, token, timeout))

    @property
    def base_url(self) -> str:
        return str(self._http.base_url)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TrainctlClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- runs ---

    def submit(
        self, kind: str, spec: dict[str, Any] | BaseModel, idempotency_key: str | None = None
    ) -> RunPublic:
        """Queue a run of `kind` (one of store.vocabulary.RUN_KINDS) with a spec."""
        return self._call(calls.submit(kind, spec, idempotency_key))

    def submit_train(self, **spec: Any) -> RunPublic:
        return self._call(calls.submit("train", spec, idempotency_key=None))

    def submit_validate(self, **spec: Any) -> RunPublic:
        return self._call(calls.submit("validate", spec, idempotency_key=None))

    def submit_benchmark(self, **spec: Any) -> RunPublic:
        return self._call(calls.submit("benchmark", spec, idempotency_key=None))

    def submit_prepare(self, **spec: Any) -> RunPublic:
        return self._call(calls.submit("prepare", spec, idempotency_key=None))

    def submit_sample(self, **spec: Any) -> RunPublic:
        return self._call(calls.submit("sample", spec, idempotency_key=None))

    def submit_export(self, **spec: Any) -> RunPublic:
        return self._call(calls.submit("export", spec, idempotency_key=None))

    def submit_evaluate(self, **spec: Any) -> RunPublic:
        """Score a checkpoint on downstream tasks (`eval_tasks`); the result has the scores."""
        return self._call(calls.submit("evaluate", spec, idempotency_key=None))

    def submit_forks(
        self,
        checkpoint: str,
        variants: Sequence[dict[str, Any] | BaseModel],
        idempotency_key: str | None = None,
    ) -> list[RunPublic]:
        """Queue the forks of `checkpoint` ('<experiment>/<tag>'), one per variant (a train
        request without fork_from, each into an experiment of its own): all of them, or none
        when one is refused. A retry with the same `idempotency_key` gets the same runs."""
        return self._call(calls.submit_forks(checkpoint, variants, idempotency_key))

    def get_run(self, run_id: str) -> RunPublic:
        return self._call(calls.get_run(run_id))

    def list_runs(self, **filters: Any) -> RunsPublic:
        """One page. Filters: kind, state, experiment, limit, cursor."""
        return self._call(calls.list_runs(**filters))

    def iter_runs(self, **filters: Any) -> Iterator[RunPublic]:
        """Every matching run, newest first, following the cursors page by page."""
        return self._iterate(calls.iter_runs(**filters))

    def cancel_run(self, run_id: str) -> RunPublic:
        return self._call(calls.cancel_run(run_id))

    def wait(self, run_id: str, timeout: float | None = None, poll: float = 0.2) -> RunPublic:
        """Poll until the run is finished and return it; TimeoutError after `timeout` s."""
        return self._run(calls.wait(run_id, timeout, poll))

    def events(self, run_id: str, last_event_id: int | None = None) -> Iterator[EventPublic]:
        """The run's events as they happen (SSE), ending when the run has finished.

        A stream that breaks off is reopened after the last event delivered (Last-Event-ID),
        so none is repeated or skipped; after `retries` breaks in a row without an event in
        between, `StreamInterrupted` says which `last_event_id` to resume from.
        """
        return self._iterate(calls.events(run_id, last_event_id))

    def sample_stream(self, run_id: str, last_event_id: int | None = None) -> Iterator[SamplePiece]:
        """A sample run's text as it is generated: `events` read as `SamplePiece`s (index,
        delta, finish_reason), ending when the run has finished. `get_run(run_id).result`
        then holds the whole completions, or `.error` why there are none."""
        return self._iterate(calls.sample_stream(run_id, last_event_id))

    def metrics(self, run_id: str, kind: str | None = None) -> list[MetricPublic]:
        """The run's metrics history; each row has the worker's numbers as extra fields."""
        return self._call(calls.metrics(run_id, kind))

    def eval_items(
        self, run_id: str, task: str | None = None, *, offset: int = 0, limit: int | None = None
    ) -> EvalItemsPublic:
        """A page of an evaluate run's predictions for one task's items (`next_offset` the
        next page's; null on the last)."""
        return self._call(calls.eval_items(run_id, task, offset, limit))

    def lineage(self, run_id: str) -> LineagePublic:
        """The run's ancestors (root first) and the tree of the forks of its checkpoints."""
        return self._call(calls.lineage(run_id))

    def logs(self, run_id: str) -> list[LogPublic]:
        return self._call(calls.logs(run_id))

    # --- checkpoints ---

    def list_checkpoints(self, experiment: str | None = None) -> list[CheckpointPublic]:
        return self._call(calls.list_stored("checkpoints", experiment))

    def latest_checkpoint(self, experiment: str | None = None) -> CheckpointPublic:
        return self._call(calls.latest_checkpoint(experiment))

    def best_checkpoint(self, experiment: str | None = None) -> CheckpointPublic:
        return self._call(calls.best_checkpoint(experiment))

    def get_checkpoint(self, experiment: str, tag: str) -> CheckpointPublic:
        return self._call(calls.get_stored("checkpoints", experiment, tag))

    def download_file(
        self,
        experiment: str,
        tag: str,
        name: str,
        dest: Path,
        *,
        on_progress: Progress | None = None,
    ) -> Path:
        """Download one file to `dest` (a file, or a folder to put it in), sha256-checked
        against the manifest where it lists the file. A sharded checkpoint's model.safetensors
        is stitched by the service from its shards and listed nowhere: it comes unchecked.

        The bytes go to `<dest>.part` first and are renamed only once verified. An interrupted
        download leaves the `.part` file, and the next call resumes it with a Range request
        (If-Range: the ETag, so a file that changed meanwhile is fetched whole again).
        """
        return self._run(
            calls.download_file("checkpoints", experiment, tag, name, dest, on_progress)
        )

    def download_archive(self, experiment: str, tag: str, dest: Path) -> Path:
        """Stream the checkpoint's tar to `dest` (a file path, or a folder to put it in)."""
        return self._run(calls.download_archive("checkpoints", experiment, tag, dest))

    def delete_checkpoint(self, experiment: str, tag: str) -> CheckpointPublic:
        return self._call(calls.delete_stored("checkpoints", experiment, tag))

    def prune(
        self, experiment: str, keep_last: int, keep_best: bool = True, dry_run: bool = False
    ) -> PruneResult:
        return self._call(calls.prune(experiment, keep_last, keep_best, dry_run))

    # --- exports: checkpoints written as transformers folders by export runs ---

    def list_exports(self, experiment: str | None = None) -> list[CheckpointPublic]:
        return self._call(calls.list_stored("exports", experiment))

    def get_export(self, experiment: str, tag: str) -> CheckpointPublic:
        """The export of checkpoint experiment/tag: its training facts and files."""
        return self._call(calls.get_stored("exports", experiment, tag))

    def download_export_file(
        self,
        experiment: str,
        tag: str,
        name: str,
        dest: Path,
        *,
        on_progress: Progress | None = None,
    ) -> Path:
        """As `download_file`, from the export: resumable, sha256-checked (an export lists
        every file it holds)."""
        return self._run(calls.download_file("exports", experiment, tag, name, dest, on_progress))

    def download_export_archive(self, experiment: str, tag: str, dest: Path) -> Path:
        return self._run(calls.download_archive("exports", experiment, tag, dest))

    def delete_export(self, experiment: str, tag: str) -> CheckpointPublic:
        """Delete the export (admin scope); its checkpoint stays and can be exported again."""
        return self._call(calls.delete_stored("exports", experiment, tag))

    # --- system ---

    def workers(self) -> list[WorkerPublic]:
        return self._call(calls.workers())

    def drain_worker(self, worker_id: str) -> WorkerPublic:
        """Drain a worker (admin): its run saves and is requeued, then it exits."""
        return self._call(calls.drain_worker(worker_id))

    def models(self) -> ModelsPublic:
        """The models a request may name: presets, live workers' plug-ins, transformers types."""
        return self._call(calls.models())

    def eval_tasks(self) -> list[EvalTaskPublic]:
        """The tasks an evaluate run may name, with their sizes and metrics."""
        return self._call(calls.eval_tasks())

    def health(self) -> HealthPublic:
        return self._call(calls.health())

    def readiness(self) -> ReadinessPublic:
        return self._call(calls.readiness())

    # --- tokens (admin) ---

    def create_token(self, name: str, scope: Scope) -> TokenCreated:
        """A new API token; `.token` is the secret, shown this once."""
        return self._call(calls.create_token(name, scope))

    def list_tokens(self) -> list[TokenPublic]:
        return self._call(calls.list_tokens())

    def revoke_token(self, name: str) -> TokenPublic:
        return self._call(calls.revoke_token(name))

    # --- webhooks (admin) ---

    def create_webhook(
        self, url: str, events: Sequence[WebhookEvent] | None = None
    ) -> WebhookCreated:
        """Register `url` for run state changes (default: the terminal ones); `.secret` signs
        every delivery and is shown this once."""
        return self._call(calls.create_webhook(url, events))

    def list_webhooks(self) -> list[WebhookPublic]:
        return self._call(calls.list_webhooks())

    def delete_webhook(self, webhook_id: int) -> WebhookPublic:
        return self._call(calls.delete_webhook(webhook_id))

    def webhook_deliveries(self, webhook_id: int, limit: int | None = None) -> list[DeliveryPublic]:
        """The webhook's newest deliveries, each with its attempts (the delivery log)."""
        return self._call(calls.webhook_deliveries(webhook_id, limit))

    # --- the driver: performs the steps of `service.sdk.calls` with httpx.Client ---

    def _call(self, call: Call[T]) -> T:
        return self._run(ask(call))

    def _run(self, call: Steps[R]) -> R:
        with closing(self._iterate(answered(call))) as answers:
            return next(answers)

    def _iterate(self, call: Items[T]) -> Generator[T, None, None]:
        """Performs the call's steps, yielding the items it emits, until it returns.

        A transport error from a `Send` or `Read` is raised inside the call, at its `yield`.
        """
        with closing(_Stream()) as stream, closing(call):
            reply: Any = None
            error: httpx.TransportError | None = None
            while True:
                try:
                    step = call.send(reply) if error is None else call.throw(error)
                except StopIteration:
                    return
                reply, error = None, None
                if isinstance(step, Emit):
                    yield step.item
                    continue
                try:
                    reply = self._perform(step, stream)
                except httpx.TransportError as exc:
                    error = exc

    def _perform(self, step: Step, stream: _Stream) -> Any:
        match step:
            case Send(request, stream=True, lines=lines):
                sent = self._http.send(
                    request.build(self._http), stream=True,
                    follow_redirects=request.follow_redirects,
                )  # fmt: skip
                return stream.open(sent, lines)
            case Send(request):
                return self._http.send(
                    request.build(self._http), follow_redirects=request.follow_redirects
                )
            case Read():
                return stream.read()
            case Sleep(seconds):
                time.sleep(seconds)
            case Backoff():
                if (delay := self._retry.delay(step)) is None:
                    return False
                time.sleep(delay)
                return True
        return None


class _Stream:
    """The streamed response a call reads from; closed when the call opens another, or ends."""

    def __init__(self) -> None:
        self.response: httpx.Response | None = None
        self.pieces: Iterator[Any] | None = None

    def open(self, response: httpx.Response, lines: bool) -> httpx.Response:
        self.close()
        self.response = response
        if not response.is_success:
            response.read()  # the body carries the error's detail
        self.pieces = response.iter_lines() if lines else response.iter_bytes(CHUNK)
        return response

    def read(self) -> Any:
        """The next line or chunk; None at the end."""
        assert self.pieces is not None, "Read before a streaming Send"
        return next(self.pieces, None)

    def close(self) -> None:
        if self.response is not None:
            self.response.close()
