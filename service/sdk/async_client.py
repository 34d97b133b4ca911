"""The asyncio/trio twin of `service.sdk.client.TrainctlClient`: the same calls, as coroutines.

    async with AsyncTrainctlClient() as api:
        run = await api.submit_train(experiment="demo", steps=200)
        async for event in api.events(run.id):
            print(event.type, event.data)

Each call is defined once, in `service.sdk.calls`, and documented on `TrainctlClient`; this
client performs its steps with httpx.AsyncClient and anyio. (A download writes its file from
the event loop, a chunk of up to 1 MiB at a time, as the sync client does.)
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing, closing
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import anyio
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
    "AsyncTrainctlClient",
    "Conflict",
    "DownloadError",
    "InvalidRequest",
    "NotFound",
    "Progress",
    "SamplePiece",
    "StreamInterrupted",
    "TrainingSample",
    "Unauthorized",
]

T = TypeVar("T")
R = TypeVar("R")


class AsyncTrainctlClient:
    """TrainctlClient's calls for asyncio/trio code: coroutines, and async iterators."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        *,
        retries: int = 3,
        backoff: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._retry = RetryPolicy(retries, backoff)
        kwargs = client_kwargs(base_url, token, timeout)
        self._http = httpx.AsyncClient(transport=transport, **kwargs)

    @property
    def base_url(self) -> str:
        return str(self._http.base_url)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncTrainctlClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- runs ---

    async def submit(
        self, kind: str, spec: dict[str, Any] | BaseModel, idempotency_key: str | None = None
    ) -> RunPublic:
        return await self._call(calls.submit(kind, spec, idempotency_key))

    async def submit_train(self, **spec: Any) -> RunPublic:
        return await self._call(calls.submit("train", spec, idempotency_key=None))

    async def submit_validate(self, **spec: Any) -> RunPublic:
        return await self._call(calls.submit("validate", spec, idempotency_key=None))

    async def submit_benchmark(self, **spec: Any) -> RunPublic:
        return await self._call(calls.submit("benchmark", spec, idempotency_key=None))

    async def submit_prepare(self, **spec: Any) -> RunPublic:
        return await self._call(calls.submit("prepare", spec, idempotency_key=None))

    async def submit_sample(self, **spec: Any) -> RunPublic:
        return await self._call(calls.submit("sample", spec, idempotency_key=None))

    async def submit_export(self, **spec: Any) -> RunPublic:
        return await self._call(calls.submit("export", spec, idempotency_key=None))

    async def submit_evaluate(self, **spec: Any) -> RunPublic:
        """Score a checkpoint on downstream tasks (`eval_tasks`); the result has the scores."""
        return await self._call(calls.submit("evaluate", spec, idempotency_key=None))

    async def submit_forks(
        self,
        checkpoint: str,
        variants: Sequence[dict[str, Any] | BaseModel],
        idempotency_key: str | None = None,
    ) -> list[RunPublic]:
        return await self._call(calls.submit_forks(checkpoint, variants, idempotency_key))

    async def get_run(self, run_id: str) -> RunPublic:
        return await self._call(calls.get_run(run_id))

    async def list_runs(self, **filters: Any) -> RunsPublic:
        return await self._call(calls.list_runs(**filters))

    def iter_runs(self, **filters: Any) -> AsyncIterator[RunPublic]:
        return self._iterate(calls.iter_runs(**filters))

    async def cancel_run(self, run_id: str) -> RunPublic:
        return await self._call(calls.cancel_run(run_id))

    async def wait(self, run_id: str, timeout: float | None = None, poll: float = 0.2) -> RunPublic:
        return await self._run(calls.wait(run_id, timeout, poll))

    def events(self, run_id: str, last_event_id: int | None = None) -> AsyncIterator[EventPublic]:
        return self._iterate(calls.events(run_id, last_event_id))

    def sample_stream(
        self, run_id: str, last_event_id: int | None = None
    ) -> AsyncIterator[SamplePiece]:
        return self._iterate(calls.sample_stream(run_id, last_event_id))

    async def metrics(self, run_id: str, kind: str | None = None) -> list[MetricPublic]:
        return await self._call(calls.metrics(run_id, kind))

    async def eval_items(
        self, run_id: str, task: str | None = None, *, offset: int = 0, limit: int | None = None
    ) -> EvalItemsPublic:
        """A page of an evaluate run's predictions for one task's items (`next_offset` the
        next page's; null on the last)."""
        return await self._call(calls.eval_items(run_id, task, offset, limit))

    async def lineage(self, run_id: str) -> LineagePublic:
        """The run's ancestors (root first) and the tree of the forks of its checkpoints."""
        return await self._call(calls.lineage(run_id))

    async def logs(self, run_id: str) -> list[LogPublic]:
        return await self._call(calls.logs(run_id))

    # --- checkpoints ---

    async def list_checkpoints(self, experiment: str | None = None) -> list[CheckpointPublic]:
        return await self._call(calls.list_stored("checkpoints", experiment))

    async def latest_checkpoint(self, experiment: str | None = None) -> CheckpointPublic:
        return await self._call(calls.latest_checkpoint(experiment))

    async def best_checkpoint(self, experiment: str | None = None) -> CheckpointPublic:
        return await self._call(calls.best_checkpoint(experiment))

    async def get_checkpoint(self, experiment: str, tag: str) -> CheckpointPublic:
        return await self._call(calls.get_stored("checkpoints", experiment, tag))

    async def download_file(
        self,
        experiment: str,
        tag: str,
        name: str,
        dest: Path,
        *,
        on_progress: Progress | None = None,
    ) -> Path:
        return await self._run(
            calls.download_file("checkpoints", experiment, tag, name, dest, on_progress)
        )

    async def download_archive(self, experiment: str, tag: str, dest: Path) -> Path:
        return await self._run(calls.download_archive("checkpoints", experiment, tag, dest))

    async def delete_checkpoint(self, experiment: str, tag: str) -> CheckpointPublic:
        return await self._call(calls.delete_stored("checkpoints", experiment, tag))

    async def prune(
        self, experiment: str, keep_last: int, keep_best: bool = True, dry_run: bool = False
    ) -> PruneResult:
        return await self._call(calls.prune(experiment, keep_last, keep_best, dry_run))

    # --- exports ---

    async def list_exports(self, experiment: str | None = None) -> list[CheckpointPublic]:
        return await self._call(calls.list_stored("exports", experiment))

    async def get_export(self, experiment: str, tag: str) -> CheckpointPublic:
        return await self._call(calls.get_stored("exports", experiment, tag))

    async def download_export_file(
        self,
        experiment: str,
        tag: str,
        name: str,
        dest: Path,
        *,
        on_progress: Progress | None = None,
    ) -> Path:
        download = calls.download_file("exports", experiment, tag, name, dest, on_progress)
        return await self._run(download)

    async def download_export_archive(self, experiment: str, tag: str, dest: Path) -> Path:
        return await self._run(calls.download_archive("exports", experiment, tag, dest))

    async def delete_export(self, experiment: str, tag: str) -> CheckpointPublic:
        return await self._call(calls.delete_stored("exports", experiment, tag))

    # --- system ---

    async def workers(self) -> list[WorkerPublic]:
        return await self._call(calls.workers())

    async def drain_worker(self, worker_id: str) -> WorkerPublic:
        """Drain a worker (admin): its run saves and is requeued, then it exits."""
        return await self._call(calls.drain_worker(worker_id))

    async def models(self) -> ModelsPublic:
        """The models a request may name: presets, live workers' plug-ins, transformers types."""
        return await self._call(calls.models())

    async def eval_tasks(self) -> list[EvalTaskPublic]:
        """The tasks an evaluate run may name, with their sizes and metrics."""
        return await self._call(calls.eval_tasks())

    async def health(self) -> HealthPublic:
        return await self._call(calls.health())

    async def readiness(self) -> ReadinessPublic:
        return await self._call(calls.readiness())

    # --- tokens (admin) ---

    async def create_token(self, name: str, scope: Scope) -> TokenCreated:
        """A new API token; `.token` is the secret, shown this once."""
        return await self._call(calls.create_token(name, scope))

    async def list_tokens(self) -> list[TokenPublic]:
        return await self._call(calls.list_tokens())

    async def revoke_token(self, name: str) -> TokenPublic:
        return await self._call(calls.revoke_token(name))

    # --- webhooks (admin) ---

    async def create_webhook(
        self, url: str, events: Sequence[WebhookEvent] | None = None
    ) -> WebhookCreated:
        """Register `url` for run state changes (default: the terminal ones); `.secret` signs
        every delivery and is shown this once."""
        return await self._call(calls.create_webhook(url, events))

    async def list_webhooks(self) -> list[WebhookPublic]:
        return await self._call(calls.list_webhooks())

    async def delete_webhook(self, webhook_id: int) -> WebhookPublic:
        return await self._call(calls.delete_webhook(webhook_id))

    async def webhook_deliveries(
        self, webhook_id: int, limit: int | None = None
    ) -> list[DeliveryPublic]:
        """The webhook's newest deliveries, each with its attempts (the delivery log)."""
        return await self._call(calls.webhook_deliveries(webhook_id, limit))

    # --- the driver: performs the steps of `service.sdk.calls` with httpx.AsyncClient ---

    async def _call(self, call: Call[T]) -> T:
        return await self._run(ask(call))

    async def _run(self, call: Steps[R]) -> R:
        async with aclosing(self._iterate(answered(call))) as answers:
            return await anext(answers)

    async def _iterate(self, call: Items[T]) -> AsyncGenerator[T, None]:
        """Performs the call's steps, yielding the items it emits, until it returns.

        A transport error from a `Send` or `Read` is raised inside the call, at its `yield`.
        """
        async with aclosing(_Stream()) as stream:
            with closing(call):
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
                        reply = await self._perform(step, stream)
                    except httpx.TransportError as exc:
                        error = exc

    async def _perform(self, step: Step, stream: _Stream) -> Any:
        match step:
            case Send(request, stream=True, lines=lines):
                response = await self._http.send(
                    request.build(self._http), stream=True,
                    follow_redirects=request.follow_redirects,
                )  # fmt: skip
                return await stream.open(response, lines)
            case Send(request):
                return await self._http.send(
                    request.build(self._http), follow_redirects=request.follow_redirects
                )
            case Read():
                return await stream.read()
            case Sleep(seconds):
                await anyio.sleep(seconds)
            case Backoff():
                if (delay := self._retry.delay(step)) is None:
                    return False
                await anyio.sleep(delay)
                return True
        return None


class _Stream:
    """The streamed response a call reads from; closed when the call opens another, or ends."""

    def __init__(self) -> None:
        self.response: httpx.Response | None = None
        self.pieces: AsyncIterator[Any] | None = None

    async def open(self, response: httpx.Response, lines: bool) -> httpx.Response:
        await self.aclose()
        self.response = response
        if not response.is_success:
            await response.aread()  # the body carries the error's detail
        self.pieces = response.aiter_lines() if lines else response.aiter_bytes(CHUNK)
        return response

    async def read(self) -> Any:
        """The next line or chunk; None at the end."""
        assert self.pieces is not None, "Read before a streaming Send"
        return await anext(self.pieces, None)

    async def aclose(self) -> None:
        if self.response is not None:
            await self.response.aclose()
