"""The asyncio/trio twin of `service.client.TrainctlClient`: the same calls, as coroutines.

    async with AsyncTrainctlClient() as api:
        run = await api.submit_train(experiment="demo", steps=200)
        async for event in api.events(run.id):
            print(event.type, event.data)

Each call is defined once, in `service.sdk_calls`, and documented on `TrainctlClient`; this
client performs its steps with httpx.AsyncClient and anyio. (A download writes its file from
the event loop, a chunk of up to 1 MiB at a time, as the sync client does.)
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AsyncExitStack, aclosing, closing
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import anyio
import httpx
from pydantic import BaseModel

from trainctl.service import sdk_calls as calls
from trainctl.service.schemas import (
    CheckpointPublic,
    EventPublic,
    HealthPublic,
    LogPublic,
    MetricPublic,
    PruneResult,
    ReadinessPublic,
    RunPublic,
    RunsPublic,
    WorkerPublic,
)
from trainctl.service.sdk_calls import Progress
from trainctl.service.sdk_steps import (
    CHUNK,
    ApiError,
    Call,
    DownloadError,
    Emit,
    Items,
    Open,
    Read,
    Sleep,
    Steps,
    answered,
    client_kwargs,
    raise_for_status,
)

__all__ = ["ApiError", "AsyncTrainctlClient", "DownloadError", "Progress"]

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
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
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

    async def metrics(self, run_id: str, kind: str | None = None) -> list[MetricPublic]:
        return await self._call(calls.metrics(run_id, kind))

    async def logs(self, run_id: str) -> list[LogPublic]:
        return await self._call(calls.logs(run_id))

    # --- checkpoints ---

    async def list_checkpoints(self, experiment: str | None = None) -> list[CheckpointPublic]:
        return await self._call(calls.list_checkpoints(experiment))

    async def latest_checkpoint(self, experiment: str | None = None) -> CheckpointPublic:
        return await self._call(calls.latest_checkpoint(experiment))

    async def best_checkpoint(self, experiment: str | None = None) -> CheckpointPublic:
        return await self._call(calls.best_checkpoint(experiment))

    async def get_checkpoint(self, experiment: str, tag: str) -> CheckpointPublic:
        return await self._call(calls.get_checkpoint(experiment, tag))

    async def download_file(
        self,
        experiment: str,
        tag: str,
        name: str,
        dest: Path,
        *,
        on_progress: Progress | None = None,
    ) -> Path:
        return await self._run(calls.download_file(experiment, tag, name, dest, on_progress))

    async def download_archive(self, experiment: str, tag: str, dest: Path) -> Path:
        return await self._run(calls.download_archive(experiment, tag, dest))

    async def delete_checkpoint(self, experiment: str, tag: str) -> CheckpointPublic:
        return await self._call(calls.delete_checkpoint(experiment, tag))

    async def prune(
        self, experiment: str, keep_last: int, keep_best: bool = True, dry_run: bool = False
    ) -> PruneResult:
        return await self._call(calls.prune(experiment, keep_last, keep_best, dry_run))

    # --- system ---

    async def workers(self) -> list[WorkerPublic]:
        return await self._call(calls.workers())

    async def health(self) -> HealthPublic:
        return await self._call(calls.health())

    async def readiness(self) -> ReadinessPublic:
        return await self._call(calls.readiness())

    # --- the driver: performs the steps of `service.sdk_calls` with httpx.AsyncClient ---

    async def _call(self, call: Call[T]) -> T:
        response = await self._http.send(call.request.build(self._http))
        raise_for_status(response)
        return call.parse(response.content)

    async def _run(self, call: Steps[R]) -> R:
        async with aclosing(self._iterate(answered(call))) as answers:
            return await anext(answers)

    async def _iterate(self, call: Items[T]) -> AsyncGenerator[T, None]:
        """Performs the call's steps, yielding the items it emits, until it returns."""
        async with AsyncExitStack() as streams:
            with closing(call):
                pieces: AsyncIterator[Any] | None = None  # the open stream's lines or chunks
                reply: Any = None
                while True:
                    try:
                        step = call.send(reply)
                    except StopIteration:
                        return
                    reply = None
                    match step:
                        case Emit(item):
                            yield item
                        case Call():
                            reply = await self._call(step)
                        case Sleep(seconds):
                            await anyio.sleep(seconds)
                        case Open(request, lines):
                            reply = await self._http.send(request.build(self._http), stream=True)
                            streams.push_async_callback(reply.aclose)
                            if not reply.is_success:
                                await reply.aread()  # the body carries the error's detail
                                raise_for_status(reply)
                            pieces = reply.aiter_lines() if lines else reply.aiter_bytes(CHUNK)
                        case Read():
                            assert pieces is not None, "Read before Open"
                            reply = await anext(pieces, None)
