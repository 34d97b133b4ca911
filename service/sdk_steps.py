"""What the SDK's calls and its two clients share: the steps a call is made of, and errors.

A call that needs more than one request (follow cursors, poll, stream a file) is written once,
in `service.sdk_calls`, as a generator of steps: it yields a `Call`, `Sleep`, `Open` or `Read`
and receives what the step produced, or yields `Emit(item)` to hand an item to the caller. It
does no network I/O itself, so `TrainctlClient` (httpx.Client) and `AsyncTrainctlClient`
(httpx.AsyncClient) are thin drivers of the same code. Sans-IO: https://sans-io.readthedocs.io
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeAlias, TypeVar

import httpx

from trainctl.store.exceptions import TrainctlError

CHUNK = 1 << 20
"""Bytes per read of a streamed download."""
DEFAULT_URL = "http://127.0.0.1:8000"
T = TypeVar("T")
R = TypeVar("R")


class ApiError(TrainctlError):
    """The server answered with an error status; `detail` is its explanation."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"HTTP {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class DownloadError(TrainctlError):
    """A downloaded file does not match its manifest entry."""


@dataclass(frozen=True)
class Request:
    """One HTTP request, relative to the client's base URL."""

    method: str
    url: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    def build(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        return http.build_request(
            self.method, self.url, params=self.params, json=self.json, headers=self.headers
        )


@dataclass(frozen=True)
class Call(Generic[T]):
    """Send `request`, raise `ApiError` on an error status, answer `parse(body)`."""

    request: Request
    parse: Callable[[bytes], T]


@dataclass(frozen=True)
class Sleep:
    """Wait `seconds`; answers None."""

    seconds: float


@dataclass(frozen=True)
class Open:
    """Send `request` and keep its body streaming; answers the response (status and headers).

    Raises `ApiError` on an error status. The stream stays open until the call ends; `Read`
    takes its next piece: text lines if `lines`, else byte chunks of up to `CHUNK`.
    """

    request: Request
    lines: bool = False


@dataclass(frozen=True)
class Read:
    """The next piece of the open stream; None once it has ended."""


@dataclass(frozen=True)
class Emit(Generic[T]):
    """Not a step: an item for the caller of an iterating call (`iter_runs`, `events`)."""

    item: T


Step: TypeAlias = Call[Any] | Sleep | Open | Read
Steps: TypeAlias = Generator[Step, Any, R]
"""A call made of steps that ends with its answer, R."""
Items: TypeAlias = Generator[Step | Emit[T], Any, None]
"""A call made of steps that hands the caller items of type T as they come."""


def ask(call: Call[T]) -> Steps[T]:
    """The parsed answer to `call`, typed (`run = yield from ask(get_run(run_id))`)."""
    answer: T = yield call
    return answer


def open_stream(request: Request, *, lines: bool = False) -> Steps[httpx.Response]:
    response: httpx.Response = yield Open(request, lines)
    return response


def read_bytes() -> Steps[bytes | None]:
    chunk: bytes | None = yield Read()
    return chunk


def read_line() -> Steps[str | None]:
    line: str | None = yield Read()
    return line


def answered(call: Steps[R]) -> Items[R]:
    """The call's answer as its one item, so a driver runs every call through one loop."""
    yield Emit((yield from call))


# --- for the drivers ----------------------------------------------------------------------


def client_kwargs(base_url: str | None, token: str | None, timeout: float) -> dict[str, Any]:
    """Explicit arguments win; otherwise TRAINCTL_URL and TRAINCTL_API_TOKEN, like the CLI."""
    token = token if token is not None else os.environ.get("TRAINCTL_API_TOKEN")
    return {
        "base_url": base_url or os.environ.get("TRAINCTL_URL") or DEFAULT_URL,
        "headers": {"Authorization": f"Bearer {token}"} if token else {},
        # Reads may wait long on an idle event stream (keepalives come every 15 s); connecting
        # should fail fast when the service is not there.
        "timeout": httpx.Timeout(timeout, connect=min(timeout, 10.0)),
    }


def raise_for_status(response: httpx.Response) -> None:
    """ApiError with the server's `detail` for a non-2xx answer (a streamed one read first)."""
    if response.is_success:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    detail = detail if detail is not None else response.text
    raise ApiError(response.status_code, str(detail or response.reason_phrase))
