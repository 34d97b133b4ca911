"""The one place where errors become HTTP responses (docs/architecture.md, "Rooms").

Domain errors carry messages written for users (store.exceptions); here each class gets its
status. Validation errors get a `detail` that names every bad field in one readable string,
plus the raw pydantic `errors` for programs.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from trainctl.service.middleware import REQUEST_ID_HEADER, body_too_large
from trainctl.service.schemas import ErrorPublic, ValidationErrorPublic
from trainctl.store.db.outages import UNAVAILABLE
from trainctl.store.db.submissions import QUEUE_RETRY_SECONDS
from trainctl.store.exceptions import (
    CheckpointCorrupt,
    Conflict,
    DatabaseStalled,
    Forbidden,
    InvalidRequest,
    InVariant,
    NotFound,
    QueueFull,
    StorageUnavailable,
    TrainctlError,
)
from trainctl.store.text import repair, repaired

log = logging.getLogger("trainctl.service")

# Most specific first: the first class an error is an instance of decides its status.
STATUS_BY_ERROR: tuple[tuple[type[TrainctlError], int], ...] = (
    (NotFound, 404),
    (Conflict, 409),
    (InvalidRequest, 422),
    (Forbidden, 403),
    (QueueFull, 429),
    # The checkpoint exists but is damaged or does not fit: the store's state, not the request.
    (CheckpointCorrupt, 409),
    # The bucket cannot be reached or refuses our credentials: the service's set-up or an
    # outage, never the request's fault, and it may pass.
    (StorageUnavailable, 503),
    # The run database stopped answering (a paused server): an outage, refused at once.
    (DatabaseStalled, 503),
)

# Seconds a client waits before retrying what a 503 of an outage refused.
OUTAGE_RETRY_SECONDS = 5


class Overloaded(Exception):
    """The service holds as much of something as it may (store requests, event streams): a
    429 when it is the caller's own share, a 503 when it is the service's; retry later."""

    def __init__(self, detail: str, *, status: int, retry_after: int) -> None:
        super().__init__(detail)
        self.status, self.retry_after = status, retry_after


def status_for(exc: TrainctlError) -> int:
    while isinstance(exc, InVariant):  # a sweep's variant is refused as its run would be
        exc = exc.cause
    return next((code for cls, code in STATUS_BY_ERROR if isinstance(exc, cls)), 500)


ERROR_DESCRIPTIONS = {
    400: "The body cannot be read at all (it is not UTF-8 text).",
    401: "No token, or the wrong one, while the server has a TRAINCTL_API_TOKEN.",
    403: "The token is valid, but its scope does not allow this.",
    404: "Nothing by that name, or no endpoint matches the path.",
    409: "The request clashes with the current state (see `detail`).",
    413: "The body is larger than the server accepts.",
    422: "The request is invalid; `detail` names every bad field.",
    429: "Too many runs are queued, or event streams open, for this token or in all; retry "
    "after `Retry-After` seconds.",
    503: "The run database or the checkpoint storage cannot be reached, or the service is "
    "busy (store requests, event streams); retry after `Retry-After` seconds.",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries documenting that these statuses answer with an error body."""
    return {
        code: {
            "model": ValidationErrorPublic if code == 422 else ErrorPublic,
            "description": ERROR_DESCRIPTIONS[code],
        }
        for code in codes
    }


MAX_ERRORS_SHOWN = 50
"""A body can hold 80,000 bad fields; the answer names the first ones and counts the rest."""


def describe_errors(errors: Sequence[Any]) -> str:
    """'body.steps: Input should be greater than or equal to 1; body.model.preset: ...'."""
    shown = "; ".join(_describe(error) for error in errors[:MAX_ERRORS_SHOWN])
    if len(errors) > MAX_ERRORS_SHOWN:
        shown += f"; and {len(errors) - MAX_ERRORS_SHOWN:,} more errors"
    return shown or "invalid request"


def _describe(error: Any) -> str:
    loc = [str(part) for part in error.get("loc", ())]
    msg = str(error.get("msg", "invalid value"))
    number = error.get("input")
    if error.get("type") == "int_type" and isinstance(number, float):
        # A literal of more than 20 digits, or an integral one past that (1.5e4299), is read
        # as a float (service/routing.py); say why an integer field refuses it.
        msg += f"; got {number:.6g}, a number beyond what any bound here allows"
    if error.get("type") == "json_invalid":
        # loc is ("body", <character offset>) for a body that is not JSON at all.
        problem = (error.get("ctx") or {}).get("error", "not valid JSON")
        where = f" at character {loc[1]}" if len(loc) > 1 else ""
        return f"body: invalid JSON{where}: {problem}"
    return f"{'.'.join(loc) or 'request'}: {msg}"


def _validation_response(errors: Sequence[Any]) -> JSONResponse:
    # `input` can hold whatever the client sent (bytes, huge bodies): keep loc/msg/type/ctx.
    raw = [{k: v for k, v in e.items() if k not in ("input", "url")} for e in errors]
    raw = raw[:MAX_ERRORS_SHOWN]
    # Repaired (store.text): a location or a message may quote text UTF-8 cannot encode
    # (a key of the body), and the answer must still be written.
    content = {"detail": describe_errors(errors), "errors": jsonable_encoder(raw)}
    return JSONResponse(status_code=422, content=repaired(content))


async def handle_request_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return _validation_response(exc.errors())


async def handle_pydantic_validation(request: Request, exc: Exception) -> JSONResponse:
    """A model validated inside the service (not at the edge) failed: still the client's input."""
    assert isinstance(exc, ValidationError)
    return _validation_response(exc.errors())


async def handle_domain_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TrainctlError)
    code = status_for(exc)
    if code == 500:
        log.error("unmapped domain error on %s %s", request.method, request.url.path, exc_info=exc)
    elif code == 503:
        log.error("%s on %s %s: %s", type(exc).__name__, request.method, request.url.path, exc)
    headers = None
    if isinstance(exc, QueueFull):
        headers = {"Retry-After": str(QUEUE_RETRY_SECONDS)}
    elif code == 503:
        headers = {"Retry-After": str(OUTAGE_RETRY_SECONDS)}
    content = {"detail": repair(str(exc))}  # a message may quote what the client sent
    return JSONResponse(status_code=code, content=content, headers=headers)


async def handle_database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.error("run database unavailable on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        status_code=503,
        content={"detail": "the run database cannot be queried; try again shortly"},
        headers={"Retry-After": str(OUTAGE_RETRY_SECONDS)},
    )


async def handle_overloaded(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Overloaded)
    headers = {"Retry-After": str(exc.retry_after)}
    return JSONResponse(status_code=exc.status, content={"detail": str(exc)}, headers=headers)


async def handle_http_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's own answer, in words a user can act on where FastAPI's are generic."""
    assert isinstance(exc, StarletteHTTPException)
    detail, headers = exc.detail, exc.headers
    if exc.status_code == 404 and detail == "Not Found":
        detail = (
            f"no endpoint matches {request.method} {request.url.path}; names in a path must be "
            "single segments without '/' or '..' (see /docs for the endpoints)"
        )
    elif exc.status_code == 413:
        detail = body_too_large(request.app.state.settings.max_body_bytes)
    elif exc.status_code == 400 and detail == "There was an error parsing the body":
        detail = "the body cannot be parsed: send JSON encoded as UTF-8"
    elif exc.status_code == 405 and detail == "Method Not Allowed":
        allowed = allowed_methods(request, exc)
        headers = {**(headers or {}), "Allow": allowed}
        detail = f"{request.method} is not allowed on {request.url.path}; allowed: {allowed}"
    return JSONResponse(status_code=exc.status_code, content={"detail": detail}, headers=headers)


def allowed_methods(request: Request, exc: StarletteHTTPException) -> str:
    """Every method of the path that matched (`DELETE, GET` on a checkpoint).

    Starlette's 405 names the methods of the first route whose path matched, but a path has
    one route per method (FastAPI declares them so): the others are allowed too. The first
    path that matches is the one the router chose (`/runs/train` before `/runs/{run_id}`).
    """
    methods: dict[str, set[str]] = {}
    for route in iter_route_contexts(request.app.routes):
        if route.path is not None and route.methods:
            match, _ = route.matches(request.scope)
            if match is not Match.NONE:
                methods.setdefault(route.path, set()).update(route.methods)
    chosen = next(iter(methods.values()), None)  # none: a mount, /static, answered itself
    return ", ".join(sorted(chosen)) if chosen else (exc.headers or {}).get("Allow", "")


async def handle_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """A bug: the traceback goes to the log, the client gets the request id to find it by.

    Starlette calls this from its outermost layer, which RequestMiddleware wraps
    (TrainctlApi.build_middleware_stack); the id comes from the request's state, where that
    middleware puts it. Starlette re-raises the error afterwards; `service.logs` keeps the
    server from logging the traceback a second time.
    """
    # RequestMiddleware sets it; a fresh one still ties this answer to the log line.
    request_id = getattr(request.state, "request_id", None) or uuid.uuid4().hex
    log.error(
        "unhandled error on %s %s",
        request.method,
        request.url.path,
        exc_info=exc,
        extra={"request_id": request_id},
    )
    return JSONResponse(
        status_code=500,
        content={"detail": f"internal error (see the server log); request id {request_id}"},
        headers={REQUEST_ID_HEADER: request_id},
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, handle_request_validation)
    app.add_exception_handler(ValidationError, handle_pydantic_validation)
    app.add_exception_handler(TrainctlError, handle_domain_error)
    for unavailable in UNAVAILABLE:  # refused, cut off, or no pooled connection in time
        app.add_exception_handler(unavailable, handle_database_unavailable)
    app.add_exception_handler(Overloaded, handle_overloaded)
    app.add_exception_handler(StarletteHTTPException, handle_http_error)
    # Exception (any other error): Starlette's ServerErrorMiddleware answers with this.
    app.add_exception_handler(Exception, handle_unexpected_error)
