"""One attempt at a delivery: a signed POST with a hard deadline, to an allowed address only
(docs/design/webhooks.md, "Webhooks", "Attempts", "Where deliveries may go").

The attempt never raises: a status code or a one-line error goes to the delivery log. Each
attempt opens its own connection, follows no redirect and ignores the environment's proxy
settings, so it is checked where it connects and nothing leads past the address check.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import httpx

from trainctl.service.webhooks.signing import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    sign,
)
from trainctl.service.webhooks.targets import HostPolicy, url_host
from trainctl.store.db.webhooks import Attempt, Outgoing


class AddressRefused(Exception):
    """The connection reached an address the host policy does not allow."""


def user_agent() -> str:
    try:
        return f"trainctl-webhooks/{version('trainctl')}"
    except PackageNotFoundError:
        return "trainctl-webhooks"


def build_http(timeout: float) -> httpx.AsyncClient:
    """The dispatcher's client: no pooled connections, no redirects, no proxies from the
    environment (see the module docstring)."""
    return httpx.AsyncClient(
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
        limits=httpx.Limits(max_keepalive_connections=0),
        headers={"User-Agent": user_agent()},
    )


async def send(
    http: httpx.AsyncClient, outgoing: Outgoing, policy: HostPolicy, timeout: float
) -> Attempt:
    """POST the delivery once, within `timeout` seconds all told (name resolution included).
    Whatever goes wrong, the attempt is returned with the error, to be logged: a URL httpx
    cannot send (one stored before the rules of `targets.check_url`), a refused address, a
    fault of ours."""
    started, clock = datetime.now(UTC), time.monotonic()
    status: int | None = None
    error: str | None = None
    try:
        # httpx's timeout is per read or write; this one bounds the whole attempt, so that a
        # receiver trickling its answer byte by byte cannot hold a slot for longer.
        async with asyncio.timeout(timeout):
            request = signed_request(http, outgoing)
            request.extensions["trace"] = address_check(policy, url_host(outgoing.url))
            response = await http.send(request, stream=True)
            status = response.status_code
            await response.aclose()  # the receiver's body is not read: nothing keeps it
    except TimeoutError:
        error = f"no answer within {timeout:g} s"
    except AddressRefused as exc:
        error = f"refused: {exc}"
    except Exception as exc:  # any other: logged as this attempt's error, never raised
        error = describe(exc)
    duration_ms = (time.monotonic() - clock) * 1000
    return Attempt(outgoing.attempt, started, round(duration_ms, 1), status, error)


def signed_request(http: httpx.AsyncClient, outgoing: Outgoing) -> httpx.Request:
    body = outgoing.body.encode()
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign(outgoing.secret, body),
        DELIVERY_HEADER: outgoing.id,
        EVENT_HEADER: outgoing.event,
    }
    return http.build_request("POST", outgoing.url, content=body, headers=headers)


def address_check(
    policy: HostPolicy, host: str
) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """An httpcore trace hook that closes a connection to a refused address before a byte of
    the request is written to it (docs/design/webhooks.md, "Webhooks")."""

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event != "connection.connect_tcp.complete":
            return
        stream = info["return_value"]
        peer = stream.get_extra_info("server_addr")
        reason = (
            "the connection's peer address is unknown"
            if not peer
            else policy.check_address(host, ipaddress.ip_address(peer[0]))
        )
        if reason is not None:
            await stream.aclose()
            raise AddressRefused(reason)

    return trace


def describe(exc: Exception) -> str:
    """'ConnectError: [Errno 111] Connection refused', in one line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
