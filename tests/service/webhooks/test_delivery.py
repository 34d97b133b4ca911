"""Sending webhooks (service/webhooks/sending.py, dispatcher.py): whatever a send runs into
is an attempt in the delivery log, never an escape; and receivers that never answer do not
hold up a healthy one, shown by the order of events against 40 real silent receivers."""

from __future__ import annotations

import asyncio
import selectors
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.serving import serve
from tests.support.polling import poll
from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.service.webhooks.dispatcher import Slots
from trainctl.service.webhooks.sending import build_http, send
from trainctl.service.webhooks.targets import HostPolicy
from trainctl.store.db.runs import RunStore
from trainctl.store.db.webhooks import NewDelivery, Outgoing, WebhookStore

# --- receivers --------------------------------------------------------------------------------


@contextmanager
def healthy_receiver() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server answering every POST with 200; yields its URL and the delivery ids."""
    received: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            received.append(self.headers["X-Trainctl-Delivery"])
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook", received
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def silent_receivers(count: int) -> Iterator[tuple[list[str], list[int]]]:
    """`count` listening sockets that accept connections and never answer; yields their
    URLs and how many connections each has accepted."""
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
    accepted = [0] * count
    held: list[socket.socket] = []
    selector, stop = selectors.DefaultSelector(), threading.Event()
    for index, sock in enumerate(listeners):
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, index)

    def accept() -> None:
        while not stop.is_set():
            for key, _ in selector.select(timeout=0.1):
                conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
                held.append(conn)  # kept open, never read from nor written to
                accepted[key.data] += 1

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield [f"http://127.0.0.1:{s.getsockname()[1]}/hook" for s in listeners], accepted
    finally:
        stop.set()
        thread.join(timeout=10)
        for sock in [*held, *listeners]:
            sock.close()
        selector.close()


# --- a service --------------------------------------------------------------------------------


@contextmanager
def service(data_dir: Path, **overrides: Any) -> Iterator[tuple[str, RunStore]]:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "workers": 0,
        "webhook_poll_seconds": 0.05,
        "webhook_retry_seconds": 0.1,
        "webhook_retry_max_seconds": 0.2,
        "webhook_max_attempts": 3,
    }
    settings = Settings(**(values | overrides))
    with serve(create_app(settings)) as url, RunStore(settings.db_url) as runs:
        yield url, runs


def add_webhook(url: str, target: str) -> int:
    answer = httpx.post(f"{url}/webhooks", json={"url": target}, timeout=30)
    assert answer.status_code == 201, answer.text
    webhook_id: int = answer.json()["id"]
    return webhook_id


def deliveries(url: str, webhook_id: int) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/webhooks/{webhook_id}/deliveries", timeout=30)
    assert answer.status_code == 200, answer.text
    items: list[dict[str, Any]] = answer.json()["items"]
    return items


def finish_a_run(runs: RunStore, worker: str = "test-worker") -> None:
    """A run claimed and finished as a worker would."""
    run = runs.enqueue("benchmark", "hooks", {"steps": 1})
    claimed = runs.claim(worker, lease_seconds=60)
    assert claimed is not None and claimed.id == run.id
    runs.finish(run.id, worker, 1, "succeeded", result={"tokens_per_sec": 1.0})


# --- every failure is an attempt --------------------------------------------------------------


def outgoing(url: str) -> Outgoing:
    return Outgoing(uuid.uuid4().hex, url, "whsec_x", "succeeded", "{}", 1, 1)


@pytest.mark.parametrize(
    ("url", "transport", "error"),
    [
        ("http://0177.0.0.1/hook", None, "InvalidURL"),  # stored before the URL rules
        ("http://hooks.example/", RuntimeError("a fault of ours"), "RuntimeError: a fault"),
        ("http://hooks.example/", ValueError("odd"), "ValueError: odd"),
    ],
)
def test_a_send_that_raises_anything_is_an_attempt_with_its_error(
    url: str, transport: Exception | None, error: str
) -> None:
    async def attempt() -> Any:
        http = build_http(5.0)
        if transport is not None:

            def fail(request: httpx.Request) -> httpx.Response:
                raise transport

            http = httpx.AsyncClient(transport=httpx.MockTransport(fail))
        async with http:
            return await send(http, outgoing(url), HostPolicy.parse([]), 5.0)

    result = asyncio.run(attempt())

    assert result.status_code is None and result.error.startswith(error), result.error


def test_a_stored_url_httpx_cannot_send_has_every_attempt_logged(tmp_path: Path) -> None:
    """A webhook registered before the URL rules, with an octal host: each attempt is in
    the log with its error, and the delivery is given up after the last."""
    with service(tmp_path) as (url, runs):
        webhook = WebhookStore(runs.engine).create("http://0177.0.0.1/hook", ["succeeded"], None)
        finish_a_run(runs)
        (delivery,) = poll(
            lambda: (d := deliveries(url, webhook.id)) and d[0]["state"] == "failed" and d,
            timeout=60,
            what="the delivery to be given up",
        )

    assert len(delivery["attempts"]) == 3
    assert all(a["error"].startswith("InvalidURL") for a in delivery["attempts"])


# --- one slow receiver does not hold up another -----------------------------------------------


def test_forty_receivers_that_never_answer_do_not_hold_up_a_healthy_one(tmp_path: Path) -> None:
    """The silent receivers' deliveries are the older ones: 40 of a first run, 40 more of a
    second run with the healthy one's. The healthy delivery is answered and logged while
    every silent receiver holds a connection and none of their attempts has ended."""
    with (
        silent_receivers(40) as (silent, accepted),
        healthy_receiver() as (healthy, received),
        service(tmp_path, webhook_timeout_seconds=120, webhook_max_attempts=1) as (url, runs),
    ):
        slow = [add_webhook(url, target) for target in silent]
        finish_a_run(runs)
        poll(lambda: any(accepted), timeout=60, what="a first silent receiver to be reached")
        fine = add_webhook(url, healthy)
        finish_a_run(runs)

        (done,) = poll(
            lambda: (d := deliveries(url, fine)) and d[0]["state"] == "succeeded" and d,
            timeout=90,
            what=f"the healthy delivery; silent receivers reached: {sum(map(bool, accepted))}",
        )
        slow_attempts = [a for hook in slow for d in deliveries(url, hook) for a in d["attempts"]]
        reached = poll(lambda: all(accepted) and list(accepted), what="every silent receiver")

    assert received == [done["id"]] and done["attempts"][0]["status_code"] == 200
    assert slow_attempts == []  # none has ended: they wait out their 120 s
    assert min(reached) >= 1


def test_each_webhook_has_its_slots_and_failing_ones_share_half_of_all() -> None:
    slots = Slots(per_webhook=2, total=8)
    for webhook in range(10, 20):
        slots.done(outgoing_of(webhook), ok=False)  # their last attempts failed
    for n, webhook in enumerate([1, 1, 10, 11, 12, 13]):
        slots.take(outgoing_of(webhook, f"d{n}"))

    claims = slots.claims()

    assert claims.free == 2
    assert claims.healthy[1] == 0 and all(claims.healthy[w] == 0 for w in range(10, 20))
    assert claims.per_webhook == 2  # any other healthy webhook: two at once
    assert claims.failing_free == 0  # four of the eight slots: the failing ones' half
    assert claims.failing[14] == 1 and claims.failing[10] == 0
    slots.done(outgoing_of(10, "d2"), ok=True)  # an answer: webhook 10 is healthy again
    assert slots.claims().healthy.get(10, 2) == 2 and 10 not in slots.claims().failing


def outgoing_of(webhook: int, delivery: str = "x") -> Outgoing:
    return Outgoing(delivery, "http://hooks.example/", "whsec_x", "failed", "{}", 1, webhook)


def test_a_claim_takes_of_each_webhook_its_quota_of_its_oldest(database_url: str) -> None:
    with RunStore(database_url) as runs:
        runs.create_all()
        store = WebhookStore(runs.engine)
        hooks = [store.create(f"http://h{i}.example/", ["succeeded"], None).id for i in range(3)]
        assert store.take_lease("test", 60)
        new = [
            NewDelivery(uuid.uuid4().hex, hook, event, "run", "succeeded", "{}")
            for event in range(1, 11)
            for hook in hooks
        ]
        assert store.record("test", new, 10)

        first = store.claim_due(5, 60, quotas={hooks[0]: 1, hooks[1]: 0}, default_quota=3)
        rest = store.claim_due(100, 60, quotas={hooks[0]: 0}, default_quota=100)

    assert sorted(o.webhook_id for o in first) == [hooks[0], hooks[2], hooks[2], hooks[2]]
    assert len(rest) == 10 + 7 and hooks[0] not in {o.webhook_id for o in rest}
    assert not {o.id for o in first} & {o.id for o in rest}
