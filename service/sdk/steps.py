"""What the SDK's calls and its two clients share: the steps a call is made of, and errors.

Every call is written once, in `service.sdk.calls`, as a generator of steps: it yields a `Send`,
`Read`, `Sleep` or `Backoff` and receives what the step produced, or yields `Emit(item)` to hand
an item to the caller. It does no network I/O itself, so `TrainctlClient` (httpx.Client) and
`AsyncTrainctlClient` (httpx.AsyncClient) are thin drivers of the same code. A transport error
while a driver performs a `Send` or `Read` is raised inside the call at that `yield`, so the
call decides what to do about it (`send` retries, `events` reconnects). Sans-IO:
https://sans-io.readthedocs.io
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Generic, TypeAlias, TypeVar

import httpx

from trainctl import __version__
from trainctl.store.exceptions import TrainctlError

CHUNK = 1 << 20
"""Bytes per read of a streamed download."""
DEFAULT_URL = "http://127.0.0.1:8000"
USER_AGENT = f"trainctl/{__version__} (python-httpx/{httpx.__version__})"
MAX_BACKOFF = 30.0
"""The longest wait between two attempts that the client chooses itself."""
MAX_RETRY_AFTER = 60.0
"""A server asking to wait longer than this (Retry-After) gets its error raised instead: a call
that blocks for minutes is worse than one that fails saying why."""
T = TypeVar("T")
R = TypeVar("R")


# --- errors -------------------------------------------------------------------------------


class ApiError(TrainctlError):
    """The server answered with an error status; `detail` is its explanation."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"HTTP {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class InvalidRequest(ApiError):
    """The request is wrong (HTTP 422, or 400 for a body that cannot be read); `detail` says
    which fields."""


class Unauthorized(ApiError):
    """No API token, or the wrong one (HTTP 401): pass `token=` or set TRAINCTL_API_TOKEN."""


class NotFound(ApiError):
    """No run, checkpoint or endpoint by that name (HTTP 404)."""


class Conflict(ApiError):
    """The request clashes with the current state (HTTP 409): a busy experiment, a protected
    checkpoint, a run that cannot be cancelled, an idempotency key used for another request."""


API_ERRORS: dict[int, type[ApiError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    422: InvalidRequest,
}
"""The ApiError subclass of a status; any other error status raises ApiError itself."""


class DownloadError(TrainctlError):
    """A downloaded file does not match its manifest entry."""


class StreamInterrupted(TrainctlError):
    """A run's event stream kept breaking off, and the client's reconnects are spent.

    `last_event_id` is the id of the last event delivered (None if none was): pass it to
    `events(run_id, last_event_id=...)` to go on from there without repeating or skipping one.
    """

    def __init__(self, run_id: str, last_event_id: int | None, drops: int, why: str) -> None:
        times = "once" if drops == 1 else f"{drops} times in a row"
        resume = (
            f"events({run_id!r}, last_event_id={last_event_id}) goes on after the last event"
            if last_event_id is not None
            else "no event was delivered"
        )
        super().__init__(
            f"the event stream of run {run_id} broke off {times} and the client's retries "
            f"({drops - 1}) are spent; the last time: {why}; {resume}"
        )
        self.run_id = run_id
        self.last_event_id = last_event_id


# --- requests and steps -------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One HTTP request, relative to the client's base URL."""

    method: str
    url: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    follow_redirects: bool = False
    """Follow a redirect: a file download may be sent to a presigned URL of the bucket
    (TRAINCTL_DOWNLOADS=redirect). httpx drops the Authorization header on a redirect to
    another origin, so the bearer token never reaches that host."""

    def build(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        return http.build_request(
            self.method, self.url, params=self.params, json=self.json, headers=self.headers
        )


@dataclass(frozen=True)
class Call(Generic[T]):
    """A call that is one request: send `request`, answer `parse(body)` (`ask` performs it)."""

    request: Request
    parse: Callable[[bytes], T]


@dataclass(frozen=True)
class Send:
    """Send `request` once; answers the response, whatever its status.

    If `stream`, the body is left to `Read` (text lines if `lines`, else byte chunks of up to
    `CHUNK`) unless the status is an error, whose body is read at once for its detail. The
    stream stays open until the next streaming `Send` or the end of the call.
    """

    request: Request
    stream: bool = False
    lines: bool = False


@dataclass(frozen=True)
class Read:
    """The next piece of the open stream; None once it has ended."""


@dataclass(frozen=True)
class Sleep:
    """Wait `seconds`; answers None."""

    seconds: float


@dataclass(frozen=True)
class Backoff:
    """Wait before attempt `attempt + 1` of something that failed, as the client's
    `RetryPolicy` says (or `retry_after` seconds, the server's Retry-After).

    Answers True after waiting, or False at once when the client's retries are spent.
    """

    attempt: int
    retry_after: float | None = None


@dataclass(frozen=True)
class Emit(Generic[T]):
    """Not a step: an item for the caller of an iterating call (`iter_runs`, `events`)."""

    item: T


Step: TypeAlias = Send | Read | Sleep | Backoff
Steps: TypeAlias = Generator[Step, Any, R]
"""A call made of steps that ends with its answer, R."""
Items: TypeAlias = Generator[Step | Emit[T], Any, None]
"""A call made of steps that hands the caller items of type T as they come."""


@dataclass(frozen=True)
class RetryPolicy:
    """How a client retries: the `retries` and `backoff` arguments of both clients."""

    retries: int = 3
    """Attempts after the first, and reconnects of an event stream in a row; 0 disables them."""
    backoff: float = 0.5
    """Seconds before the first retry, doubled for each next one (up to MAX_BACKOFF); each wait
    is drawn between half and all of that, so clients cut off together do not return together."""

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int):
            raise ValueError(f"retries must be a whole number, got {self.retries!r}")
        if self.retries < 0:
            raise ValueError(f"retries must be 0 (no retries) or more, got {self.retries}")
        if not self.backoff >= 0:  # also refuses NaN
            raise ValueError(f"backoff must be 0 seconds or more, got {self.backoff!r}")

    def delay(self, step: Backoff) -> float | None:
        """Seconds to wait before the next attempt, or None once the retries are spent."""
        if step.attempt > self.retries:
            return None
        if step.retry_after is not None:
            return step.retry_after if step.retry_after <= MAX_RETRY_AFTER else None
        ceiling = min(self.backoff * 2 ** (step.attempt - 1), MAX_BACKOFF)
        return random.uniform(ceiling / 2, ceiling)


# --- the steps of a call --------------------------------------------------------------------


def send(request: Request, *, stream: bool = False, lines: bool = False) -> Steps[httpx.Response]:
    """The successful response to `request`, after retries where a retry can mend the failure.

    Raises the ApiError of an error status, or the transport error, once retrying cannot help
    or the retries are spent (`should_retry_error`, `should_retry_status`).
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            response: httpx.Response = yield Send(request, stream, lines)
        except httpx.TransportError as exc:
            if not (should_retry_error(request, exc) and (yield from backoff(attempt))):
                raise
            continue
        if response.is_success:
            return response
        if not (
            should_retry_status(request, response.status_code)
            and (yield from backoff(attempt, retry_after(response)))
        ):
            raise api_error(response)


def ask(call: Call[T]) -> Steps[T]:
    """The parsed answer to `call`, typed (`run = yield from ask(get_run(run_id))`)."""
    response = yield from send(call.request)
    return call.parse(response.content)


def open_stream(request: Request, *, lines: bool = False) -> Steps[httpx.Response]:
    return (yield from send(request, stream=True, lines=lines))


def read_bytes() -> Steps[bytes | None]:
    chunk: bytes | None = yield Read()
    return chunk


def read_line() -> Steps[str | None]:
    line: str | None = yield Read()
    return line


def backoff(attempt: int, retry_after: float | None = None) -> Steps[bool]:
    """Whether to try again, after waiting as the client's retry policy says."""
    again: bool = yield Backoff(attempt, retry_after)
    return again


def answered(call: Steps[R]) -> Items[R]:
    """The call's answer as its one item, so a driver runs every call through one loop."""
    yield Emit((yield from call))


# --- when to retry ------------------------------------------------------------------------

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
NOT_CONNECTED = (httpx.ConnectError, httpx.ConnectTimeout)
"""The request never reached the server: sending it again cannot do anything twice."""
CUT_OFF = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
"""The connection broke while the request was sent or answered: the server may have acted."""


def is_repeatable(request: Request) -> bool:
    """Whether sending it twice does what sending it once does: a read, or a submit under an
    Idempotency-Key (the server answers a repeated key with the first run)."""
    return request.method in SAFE_METHODS or "Idempotency-Key" in request.headers


def should_retry_error(request: Request, exc: httpx.TransportError) -> bool:
    """Connecting failed, or the connection broke off with a repeatable request.

    Timeouts while waiting for an answer are not retried: the server is slow, not gone, and
    another attempt would only pile on.
    """
    return isinstance(exc, NOT_CONNECTED) or (isinstance(exc, CUT_OFF) and is_repeatable(request))


def should_retry_status(request: Request, status_code: int) -> bool:
    """503: the server could not handle the request now. 502 and 504: a proxy lost the
    server's answer, which may have come after acting, so only a repeatable request."""
    return status_code == 503 or (status_code in (502, 504) and is_repeatable(request))


def retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asks to wait (Retry-After: seconds or an HTTP date), if it says."""
    value = response.headers.get("Retry-After", "").strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT; an obsolete form may lack the zone
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


# --- for the drivers ----------------------------------------------------------------------


def client_kwargs(base_url: str | None, token: str | None, timeout: float) -> dict[str, Any]:
    """Explicit arguments win; otherwise TRAINCTL_URL and TRAINCTL_API_TOKEN, like the CLI."""
    token = token if token is not None else os.environ.get("TRAINCTL_API_TOKEN")
    headers = {"User-Agent": USER_AGENT}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return {
        "base_url": base_url or os.environ.get("TRAINCTL_URL") or DEFAULT_URL,
        "headers": headers,
        # Reads may wait long on an idle event stream (keepalives come every 15 s); connecting
        # should fail fast when the service is not there.
        "timeout": httpx.Timeout(timeout, connect=min(timeout, 10.0)),
    }


def api_error(response: httpx.Response) -> ApiError:
    """The ApiError (subclass by status) with the server's `detail` for an error answer."""
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    detail = detail if detail is not None else response.text
    error = API_ERRORS.get(response.status_code, ApiError)
    return error(response.status_code, str(detail or response.reason_phrase))
