"""Retries, reconnects and the User-Agent of both SDK clients, over real connections.

A `Proxy` (tests/service/sdk/proxy.py) sits between a client and the uvicorn server and
misbehaves on cue: it cuts a stream after so many bytes, loses an answer after the server acted
on the request, or answers in the server's place (a 503, a stream without its end frame).
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

import trainctl
from tests.service.sdk.clients import CPU_TRAIN
from tests.service.sdk.proxy import Action, Forward, Lose, Proxy, Seen, answer, error_answer
from trainctl.service.schemas import EventPublic, RunPublic
from trainctl.service.sdk.async_client import AsyncTrainctlClient
from trainctl.service.sdk.client import ApiError, StreamInterrupted, TrainctlClient
from trainctl.service.sdk.steps import retry_after
from trainctl.service.sse import event_frame
from trainctl.store.db.runs import RunStore

CLIENTS = ["sync", "async"]
FAST = 0.01
"""A backoff without the default half-second waits: these tests count attempts, not seconds."""


# --- helpers -------------------------------------------------------------------


def finished_run(api: TrainctlClient, runs: RunStore, events: int) -> tuple[RunPublic, list[Any]]:
    """A finished run with `events` log events (about 300 bytes a frame), and its whole log."""
    run = api.submit_train(**CPU_TRAIN)
    for i in range(events):
        runs.append_event(run.id, "log", {"level": "info", "message": f"line {i:03d} " + "x" * 80})
    claimed = runs.claim("w", lease_seconds=60)
    assert claimed is not None and claimed.id == run.id
    runs.finish(run.id, "w", claimed.attempt, "succeeded")
    log = [EventPublic.model_validate(e) for e in runs.events(run.id)]
    assert len(log) > events  # the state changes are events too
    return run, log


def follow(
    kind: str,
    url: str,
    run_id: str,
    last_event_id: int | None = None,
    *,
    retries: int = 3,
    backoff: float = FAST,
) -> tuple[list[EventPublic], Exception | None]:
    """The events a `kind` client delivers, and the error that ended them, if one did."""
    received: list[EventPublic] = []
    if kind == "sync":
        with TrainctlClient(url, timeout=10, retries=retries, backoff=backoff) as api:
            try:
                received.extend(api.events(run_id, last_event_id))
            except Exception as exc:
                return received, exc
        return received, None

    async def main() -> Exception | None:
        async with AsyncTrainctlClient(url, timeout=10, retries=retries, backoff=backoff) as api:
            try:
                async for event in api.events(run_id, last_event_id):
                    received.append(event)
            except Exception as exc:
                return exc
        return None

    return received, anyio.run(main)


def call(
    kind: str, url: str, method: str, *args: Any, retries: int = 3, backoff: float = FAST
) -> Any:
    """`method(*args)` of a `kind` client of `url`."""
    if kind == "sync":
        with TrainctlClient(url, timeout=10, retries=retries, backoff=backoff) as api:
            return getattr(api, method)(*args)

    async def main() -> Any:
        async with AsyncTrainctlClient(url, timeout=10, retries=retries, backoff=backoff) as api:
            result = getattr(api, method)(*args)
            assert not isinstance(result, AsyncIterator), "use follow() for a stream"
            return await result

    return anyio.run(main)


def last_event_ids(requests: Sequence[Seen]) -> list[int | None]:
    return [int(v) if (v := s.headers.get("last-event-id")) else None for s in requests]


# --- events reconnect -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("reset", [False, True], ids=["fin", "reset"])
def test_a_dropped_event_stream_resumes_after_the_last_event_delivered(
    kind: str, reset: bool, api: TrainctlClient, runs: RunStore, server_app: FastAPI
) -> None:
    run, log = finished_run(api, runs, events=40)
    path = f"/runs/{run.id}/events"

    with Proxy(server_app.state.base_url, [Forward(cut=3000, reset=reset)]) as proxy:
        received, error = follow(kind, proxy.url, run.id)

    assert error is None
    assert received == log  # every event, in order, none twice
    first, resumed = last_event_ids(proxy.seen_at(path))
    assert first is None
    assert resumed in [e.id for e in log[:-1]]  # cut mid-stream, after a delivered event


@pytest.mark.slow
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_stream_that_ends_without_its_end_frame_is_resumed(
    kind: str, api: TrainctlClient, runs: RunStore, server_app: FastAPI
) -> None:
    run, log = finished_run(api, runs, events=3)
    frames = "".join(event_frame(e) for e in runs.events(run.id, limit=2)).encode()
    ended_early = answer(200, frames, "text/event-stream")

    with Proxy(server_app.state.base_url, [ended_early]) as proxy:
        received, error = follow(kind, proxy.url, run.id)

    assert error is None
    assert received == log
    assert last_event_ids(proxy.seen) == [None, log[1].id]


@pytest.mark.slow
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_stream_that_keeps_breaking_gives_up_saying_where_to_resume(
    kind: str, api: TrainctlClient, runs: RunStore, server_app: FastAPI
) -> None:
    run, log = finished_run(api, runs, events=40)
    # Events come through once; after that every reconnect breaks before the first event.
    script: list[Action] = [Forward(cut=3000)]

    with Proxy(server_app.state.base_url, script, then=Forward(cut=0)) as proxy:
        received, error = follow(kind, proxy.url, run.id, retries=2)
    assert isinstance(error, StreamInterrupted)
    rest, _ = follow(kind, server_app.state.base_url, run.id, error.last_event_id)

    assert "broke off 3 times in a row" in str(error)
    assert f"last_event_id={received[-1].id}" in str(error)
    assert error.last_event_id == received[-1].id
    assert last_event_ids(proxy.seen) == [None, received[-1].id, received[-1].id]
    assert received + rest == log


def test_with_retries_0_a_dropped_stream_is_not_reopened(
    api: TrainctlClient, runs: RunStore, server_app: FastAPI
) -> None:
    run, _ = finished_run(api, runs, events=40)

    with Proxy(server_app.state.base_url, [Forward(cut=3000)]) as proxy:
        received, error = follow("sync", proxy.url, run.id, retries=0)

    assert isinstance(error, StreamInterrupted)
    assert "broke off once and the client's retries (0) are spent" in str(error)
    assert error.last_event_id == received[-1].id
    assert len(proxy.seen) == 1


# --- retries --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_503_is_retried_after_its_retry_after(
    kind: str, api: TrainctlClient, server_app: FastAPI
) -> None:
    run = api.submit_train(**CPU_TRAIN)
    busy = error_answer(503, "the run database cannot be queried", retry_after="1")

    with Proxy(server_app.state.base_url, [busy]) as proxy:
        started = time.monotonic()
        got = call(kind, proxy.url, "get_run", run.id)
        waited = time.monotonic() - started

    assert got == run
    assert len(proxy.seen) == 2
    assert waited >= 1.0  # Retry-After, not the 0.01 s backoff


@pytest.mark.slow
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_submit_whose_answer_was_lost_is_retried_and_makes_one_run(
    kind: str, runs: RunStore, server_app: FastAPI
) -> None:
    with Proxy(server_app.state.base_url, [Lose()]) as proxy:
        run = call(kind, proxy.url, "submit", "train", CPU_TRAIN)

    first, retry = proxy.seen
    assert first.headers["idempotency-key"] == retry.headers["idempotency-key"]
    assert [r.id for r in runs.list_runs()[0]] == [run.id]


def test_without_retries_a_lost_answer_raises_though_the_server_acted(
    runs: RunStore, server_app: FastAPI
) -> None:
    with Proxy(server_app.state.base_url, [Lose()]) as proxy, pytest.raises(httpx.TransportError):
        call("sync", proxy.url, "submit", "train", CPU_TRAIN, retries=0)

    assert len(proxy.seen) == 1
    assert len(runs.list_runs()[0]) == 1  # why a retry must carry the same key


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "failure", "attempts"),
    [
        ("get_run", Lose(), 3),  # a read is repeated
        ("get_run", error_answer(502, "bad gateway"), 3),
        ("get_run", error_answer(504, "gateway timeout"), 3),
        ("cancel_run", error_answer(503, "try again"), 3),  # 503: the server did not act
        ("cancel_run", Lose(), 1),  # the server may have acted: not repeated
        ("cancel_run", error_answer(502, "bad gateway"), 1),
        ("get_run", error_answer(500, "a bug"), 1),  # retrying cannot mend it
        ("get_run", error_answer(404, "no such run"), 1),
    ],
)
def test_only_what_a_retry_can_mend_is_retried_and_only_retries_times(
    method: str, failure: Action, attempts: int, api: TrainctlClient, server_app: FastAPI
) -> None:
    run = api.submit_train(**CPU_TRAIN)

    with (
        Proxy(server_app.state.base_url, then=failure) as proxy,
        pytest.raises((ApiError, httpx.TransportError)),
    ):
        call("sync", proxy.url, method, run.id, retries=2)

    assert len(proxy.seen) == attempts


def test_retries_0_sends_once() -> None:
    with (
        Proxy("http://127.0.0.1:9", then=error_answer(503, "busy")) as proxy,
        pytest.raises(ApiError) as busy,
    ):
        call("sync", proxy.url, "health", retries=0)

    assert busy.value.status_code == 503
    assert len(proxy.seen) == 1


def test_a_refused_connection_is_retried_with_backoff_then_raised() -> None:
    with socket.socket() as closed:  # bound, never listening: connecting is refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(httpx.ConnectError):
            call("sync", url, "health", retries=2, backoff=0.2)
        waited = time.monotonic() - started

    assert waited >= 0.1 + 0.2  # at least half of each of the two backoffs (0.2 s, 0.4 s)


def test_a_retry_after_longer_than_a_minute_is_raised_at_once() -> None:
    down = error_answer(503, "down", retry_after="3600")
    with Proxy("http://127.0.0.1:9", then=down) as proxy, pytest.raises(ApiError, match="down"):
        call("sync", proxy.url, "health")

    assert len(proxy.seen) == 1


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("5", 5.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0), ("soon", None), (None, None)],
)
def test_retry_after_is_read_as_seconds_or_an_http_date(
    header: str | None, seconds: float | None
) -> None:
    headers = {"Retry-After": header} if header is not None else {}

    assert retry_after(httpx.Response(503, headers=headers)) == seconds


def test_a_retry_after_date_to_come_is_the_seconds_until_then() -> None:
    then = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    seconds = retry_after(httpx.Response(503, headers={"Retry-After": then}))

    assert seconds is not None and 20 < seconds <= 30


@pytest.mark.parametrize("bad", [{"retries": -1}, {"retries": 1.5}, {"backoff": -0.1}])
def test_bad_retry_settings_are_refused_naming_the_value(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=str(next(iter(bad.values())))):
        TrainctlClient("http://127.0.0.1:9", **bad)


# --- user agent -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", CLIENTS)
def test_the_server_is_told_the_sdk_and_its_version(kind: str, server_app: FastAPI) -> None:
    with Proxy(server_app.state.base_url) as proxy:
        call(kind, proxy.url, "health")

    agent = proxy.seen[0].headers["user-agent"]
    assert agent == f"trainctl/{trainctl.__version__} (python-httpx/{httpx.__version__})"
    assert trainctl.__version__[0].isdigit()
