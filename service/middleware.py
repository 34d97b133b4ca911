"""Per-request plumbing: a request id on every response, an access log line, HTTP metrics.

A plain ASGI middleware rather than Starlette's BaseHTTPMiddleware, so that event streams
pass through unbuffered and their duration is measured to the end of the stream.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from http import HTTPStatus

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainctl.service.logs import REQUEST_ID
from trainctl.service.metrics import ServiceMetrics

log = logging.getLogger("trainctl.http")
REQUEST_ID_HEADER = "X-Request-ID"
# A client's id is echoed only when it is short and plain, so it cannot forge log lines or
# carry anything but an id into them.
VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Probes and scrapes every few seconds would drown the log; they are logged at debug level.
QUIET_ROUTES = {"/healthz", "/readyz", "/metrics"}


def route_template(scope: Scope) -> str:
    """`/runs/{run_id}` rather than the path itself, so metrics labels stay few."""
    route = scope.get("route")  # set by FastAPI's API routes
    if route is not None and hasattr(route, "path"):
        return str(route.path)
    if str(scope.get("path", "")).startswith("/static/"):
        return "/static"
    if "endpoint" in scope:  # the few plain routes (the dashboard page)
        return str(scope["path"])
    return "unmatched"


class RequestMiddleware:
    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get(REQUEST_ID_HEADER)
        request_id = given if given and VALID_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)
        # For the 500 handler (service.errors): Starlette runs it outside this middleware,
        # after REQUEST_ID is reset, and sends its answer past `send_with_id`.
        scope.setdefault("state", {})["request_id"] = request_id
        status, start = 500, time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            seconds = time.perf_counter() - start
            route = route_template(scope)
            self.metrics.observe_request(scope["method"], route, status, seconds)
            log.log(
                logging.DEBUG if route in QUIET_ROUTES else logging.INFO,
                "%s %s %d %.1fms",
                scope["method"],
                scope["path"],
                status,
                seconds * 1000,
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": round(seconds * 1000, 1),
                    "run_id": scope.get("path_params", {}).get("run_id"),
                    "client": (scope.get("client") or ("-",))[0],
                },
            )
            REQUEST_ID.reset(token)


class HostAllowList:
    """Answer 400 to a request whose Host header names no host this service is for.

    A loopback service without a token trusts whoever can reach it; through DNS rebinding a
    web page the user visits can reach it too, but its requests carry the page's host name.
    """

    def __init__(self, app: ASGIApp, allowed: list[str]) -> None:
        self.app, self.allowed = app, {h.lower().strip("[]") for h in allowed}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or "*" in self.allowed:
            await self.app(scope, receive, send)
            return
        host = _host_name(Headers(scope=scope).get("host", ""))
        if host in self.allowed:
            await self.app(scope, receive, send)
            return
        shown = host if VALID_REQUEST_ID.fullmatch(host) else "(unprintable)"
        response = JSONResponse(
            status_code=400,
            content={
                "detail": f"host {shown!r} is not one this service answers to; set "
                "TRAINCTL_ALLOWED_HOSTS to serve it (it guards a loopback service against "
                "DNS rebinding)"
            },
        )
        await response(scope, receive, send)


def _host_name(header: str) -> str:
    """The host of a Host header, without its port: `[::1]:8000` -> `::1`."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


# Every answer: nothing here is meant to be framed, sniffed, or to leak its URL onwards. The
# dashboard loads only its own scripts and styles (vendored, no CDN) and calls only this API.
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
}


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)


class JsonErrors:
    """Every error answer as `{"detail": ...}`, including those the framework writes in plain
    text below the routes: a body over the size limit (413), a bad or unsatisfiable Range of
    a download (400, 416)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int | None) -> None:
        self.app = app
        self.details = {
            413: f"the request body is larger than the {max_body_bytes or 0:,} bytes this "
            "service accepts (TRAINCTL_MAX_BODY_BYTES)",
            416: "the requested range lies outside the file; Content-Range gives its size",
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: Message | None = None
        body: list[bytes] = []

        async def send_json(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and _plain_error(message):
                held = message  # answered once its body, the framework's words, is read
                return
            if held is None:
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            words = b"".join(body).decode("utf-8", "replace").strip()
            status = held["status"]
            detail = self.details.get(status) or words or HTTPStatus(status).phrase
            payload = json.dumps({"detail": detail}).encode()
            headers = MutableHeaders(raw=list(held["headers"]))
            headers["content-type"] = "application/json"
            headers["content-length"] = str(len(payload))
            await send({**held, "headers": headers.raw})
            await send({"type": "http.response.body", "body": payload})

        await self.app(scope, receive, send_json)


def _plain_error(start: Message) -> bool:
    content_type = Headers(raw=start.get("headers", [])).get("content-type", "")
    return int(start["status"]) >= 400 and content_type.startswith("text/plain")
