"""The asyncio/trio twin of `service.client.TrainctlClient`: the same calls, as coroutines.

async with AsyncTrainctlClient() as api:
    run = await api.submit("train", {"experiment": "demo", "steps": 200})
    async for event in api.events(run.id):
        print(event.type, event.data)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import anyio
import httpx
from pydantic import BaseModel

from service.client import (
    M,
    SseFrames,
    client_kwargs,
    only,
    prune_body,
    raise_for_status,
    resume_headers,
    submission,
)
from service.schemas import (
    CheckpointPublic,
    CheckpointsPublic,
    EventPublic,
    MetricPublic,
    MetricsPublic,
    PruneResult,
    RunPublic,
    RunsPublic,
    WorkerPublic,
    WorkersPublic,
)
from store.vocabulary import TERMINAL_STATES


class AsyncTrainctlClient:
    """The same API for asyncio/trio code: every method is a coroutine, iterators are async."""

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

    async def submit(
        self, kind: str, spec: dict[str, Any] | BaseModel, idempotency_key: str | None = None
    ) -> RunPublic:
        body, headers = submission(spec, idempotency_key)
        return await self._call(RunPublic, "POST", f"/runs/{kind}", json=body, headers=headers)

    async def get_run(self, run_id: str) -> RunPublic:
        return await self._call(RunPublic, "GET", f"/runs/{run_id}")

    async def list_runs(self, **filters: Any) -> RunsPublic:
        return await self._call(RunsPublic, "GET", "/runs", params=only(**filters))

    async def iter_runs(self, **filters: Any) -> AsyncIterator[RunPublic]:
        cursor = filters.pop("cursor", None)
        while True:
            page = await self.list_runs(**filters, cursor=cursor)
            for run in page.items:
                yield run
            if (cursor := page.next_cursor) is None:
                return

    async def cancel_run(self, run_id: str) -> RunPublic:
        return await self._call(RunPublic, "POST", f"/runs/{run_id}/cancel")

    async def wait(self, run_id: str, timeout: float | None = None, poll: float = 0.2) -> RunPublic:
        with anyio.fail_after(timeout):
            while (run := await self.get_run(run_id)).state not in TERMINAL_STATES:
                await anyio.sleep(poll)
        return run

    async def events(
        self, run_id: str, last_event_id: int | None = None
    ) -> AsyncIterator[EventPublic]:
        headers = resume_headers(last_event_id)
        async with self._http.stream("GET", f"/runs/{run_id}/events", headers=headers) as response:
            if not response.is_success:
                await response.aread()
                raise_for_status(response)
            async for event_type, data in _aparse_sse(response.aiter_lines()):
                if event_type == "end":
                    return
                yield EventPublic.model_validate_json(data)

    async def metrics(self, run_id: str, kind: str | None = None) -> list[MetricPublic]:
        url = f"/runs/{run_id}/metrics"
        return (await self._call(MetricsPublic, "GET", url, params=only(kind=kind))).items

    async def list_checkpoints(self, experiment: str | None = None) -> list[CheckpointPublic]:
        params = only(experiment=experiment)
        return (await self._call(CheckpointsPublic, "GET", "/checkpoints", params=params)).items

    async def latest_checkpoint(self, experiment: str | None = None) -> CheckpointPublic:
        params = only(experiment=experiment)
        return await self._call(CheckpointPublic, "GET", "/checkpoints/latest", params=params)

    async def get_checkpoint(self, experiment: str, tag: str) -> CheckpointPublic:
        return await self._call(CheckpointPublic, "GET", f"/checkpoints/{experiment}/{tag}")

    async def prune(
        self, experiment: str, keep_last: int, keep_best: bool = True, dry_run: bool = False
    ) -> PruneResult:
        body = prune_body(experiment, keep_last, keep_best, dry_run)
        return await self._call(PruneResult, "POST", "/checkpoints/prune", json=body)

    async def workers(self) -> list[WorkerPublic]:
        return (await self._call(WorkersPublic, "GET", "/workers")).items

    async def _call(self, model: type[M], method: str, url: str, **kwargs: Any) -> M:
        response = await self._http.request(method, url, **kwargs)
        raise_for_status(response)
        return model.model_validate_json(response.content)


async def _aparse_sse(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, str]]:
    frames = SseFrames()
    async for line in lines:
        if (frame := frames.feed(line)) is not None:
            yield frame
