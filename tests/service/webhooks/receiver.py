"""A real webhook receiver: a threading HTTP server on loopback that records every POST, and
the signature check docs/operations.md "Notifications" gives receivers, run as written there."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.ports import free_port


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    path: str

    @property
    def payload(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


def documented_verify() -> Callable[[str, bytes, str], bool]:
    """The signature check docs/operations.md "Notifications" gives receivers, run as it is
    written there."""
    page = (Path(__file__).resolve().parents[3] / "docs" / "operations.md").read_text("utf-8")
    section = page.split("\n## Notifications\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, 'docs/operations.md "Notifications" has no Python block'
    namespace: dict[str, Any] = {}
    exec(found.group(1), namespace)
    verify: Callable[[str, bytes, str], bool] = namespace["verify"]
    return verify


DOCUMENTED_VERIFY = documented_verify()


def signature_is_valid(secret: str, header: str, body: bytes) -> bool:
    return DOCUMENTED_VERIFY(secret, body, header)


@dataclass
class Receiver:
    """Answers each POST with the next of `statuses` (then 200); while `hold` is clear, a
    request waits for it (a slow receiver), setting `holding` meanwhile."""

    statuses: list[int] = field(default_factory=list)
    hold: threading.Event = field(default_factory=threading.Event)
    holding: threading.Event = field(default_factory=threading.Event)
    received: list[Received] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def __post_init__(self) -> None:
        self.hold.set()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_port}/hook"

    def handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append(Received(dict(self.headers), body, self.path))
                if not receiver.hold.is_set():
                    receiver.holding.set()
                    receiver.hold.wait(timeout=30)
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the service gave up waiting and closed the connection

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def __enter__(self) -> Receiver:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.hold.set()
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()


def dead_url() -> str:
    """A loopback port nothing listens on: connections are refused."""
    return f"http://127.0.0.1:{free_port()}/hook"
