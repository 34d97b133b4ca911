"""Per-request plumbing: a request id on every response, an access log line, HTTP metrics,
the Host allow-list and the security headers (docs/design/access.md, "Admission and access",
"Hosts and headers").

A plain ASGI middleware rather than Starlette's BaseHTTPMiddleware, so that event streams
pass through unbuffered and their duration is measured to the end of the stream.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import time
import uuid
from http import HTTPStatus

import h11
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

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
    The header is parsed strictly (`parse_host`) and its host compared whole: a lenient
    split let `[::1].evil.com` and `127.0.0.1:8000@evil.com` pass as loopback names.
    """

    def __init__(self, app: ASGIApp, allowed: list[str]) -> None:
        self.app = app
        self.allowed = {"*"} if "*" in allowed else {normal_host(h) for h in allowed}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or "*" in self.allowed:
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).getlist("host")
        host = parse_host(given[0]) if len(given) == 1 else None
        if host is not None and host in self.allowed:
            await self.app(scope, receive, send)
            return
        response = JSONResponse(status_code=400, content={"detail": _host_refusal(given, host)})
        await response(scope, receive, send)


# RFC 3986 authority without userinfo, as RFC 9110 7.2 has it for Host: uri-host [":" port].
# A reg-name is held to DNS's letters, digits, hyphens and dots (no client sends its
# percent-escapes or sub-delims); an IPv4 address is such a name too, compared as written.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_REG_NAME = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})*")
_PORT = re.compile(r"[0-9]{1,5}")


def parse_host(header: str) -> str | None:
    """The host a Host header names, lower case, an IPv6 address in its compressed form
    without brackets (`[0::1]:8000` -> `::1`); None when the header is not `host[:port]`."""
    header = header.lower()
    if header.startswith("["):
        literal, bracket, rest = header[1:].partition("]")
        host = _ipv6(literal) if bracket else None
    else:
        host, colon, port = header.partition(":")
        host, rest = (host if _REG_NAME.fullmatch(host) else None), colon + port
    port_ok = not rest or (rest[0] == ":" and _PORT.fullmatch(rest[1:]) and int(rest[1:]) < 65536)
    return host if port_ok else None


def _ipv6(literal: str) -> str | None:
    """An IPv6 literal's compressed form; None for anything else (a zone id, IPvFuture)."""
    try:
        return ipaddress.IPv6Address(literal).compressed if "%" not in literal else None
    except ValueError:
        return None


def normal_host(entry: str) -> str:
    """An allow-list entry as `parse_host` writes hosts: `[::1]` and `0::1` are `::1`."""
    entry = entry.strip().lower().removeprefix("[").removesuffix("]")
    return _ipv6(entry) or entry


def _host_refusal(given: list[str], host: str | None) -> str:
    advice = (
        "set TRAINCTL_ALLOWED_HOSTS to serve it (it guards a loopback service against DNS "
        "rebinding)"
    )
    if host is not None:
        return f"host {host!r} is not one this service answers to; {advice}"
    if len(given) != 1:
        return f"the request has {len(given)} Host headers; send exactly one"
    shown = repr(given[0]) if given[0].isascii() and given[0].isprintable() else "(unprintable)"
    return (
        f"the Host header {shown[:200]} is not a host name or IP address with an optional "
        "port (RFC 9110, 7.2)"
    )


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


class H11WithHeaders(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, answering a request it cannot parse (a bad request line,
    a header too large) as the app answers every error: JSON, with the security headers.
    That 400 is written below the app, so no middleware of ours ever sees it."""

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"detail": f"{msg} (malformed HTTP/1.1)"}).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()


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
            413: body_too_large(max_body_bytes or 0),
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


def body_too_large(max_body_bytes: int) -> str:
    return (
        f"the request body is larger than the {max_body_bytes:,} bytes this service accepts "
        "(TRAINCTL_MAX_BODY_BYTES)"
    )


def _plain_error(start: Message) -> bool:
    content_type = Headers(raw=start.get("headers", [])).get("content-type", "")
    return int(start["status"]) >= 400 and content_type.startswith("text/plain")
