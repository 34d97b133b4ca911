"""A `Proxy` (threads and sockets) between a client and the uvicorn server that misbehaves on
cue: it cuts a stream after so many bytes, loses an answer after the server acted on the
request, or answers in the server's place (a 503, a stream without its end frame)."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from dataclasses import dataclass, field

import httpx


@dataclass(frozen=True)
class Seen:
    """One request as the proxy received it; header names in lower case."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    def to_server(self) -> bytes:
        """The request again, asking the server to close the connection after its answer."""
        headers = {k: v for k, v in self.headers.items() if k != "connection"}
        lines = [f"{self.method} {self.target} HTTP/1.1"]
        lines += [f"{name}: {value}" for name, value in {**headers, "connection": "close"}.items()]
        return "\r\n".join([*lines, "", ""]).encode("latin-1") + self.body


@dataclass(frozen=True)
class Forward:
    """Pass the request on and the answer back; with `cut`, only the answer's head and `cut`
    bytes of its body, and then the connection is dropped (by a TCP reset if `reset`)."""

    cut: int | None = None
    reset: bool = False


@dataclass(frozen=True)
class Lose:
    """Pass the request on, wait until the server answers, and hang up without the answer."""


@dataclass(frozen=True)
class Answer:
    """Answer in the server's place with these bytes, and hang up."""

    raw: bytes


Action = Forward | Lose | Answer


def answer(status: int, body: bytes, content_type: str, **headers: str) -> Answer:
    lines = [f"HTTP/1.1 {status} Whatever", f"content-type: {content_type}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    lines += [f"content-length: {len(body)}", "connection: close", "", ""]
    return Answer("\r\n".join(lines).encode("latin-1") + body)


def error_answer(status: int, detail: str, **headers: str) -> Answer:
    return answer(status, json.dumps({"detail": detail}).encode(), "application/json", **headers)


@dataclass
class Proxy:
    """A TCP proxy to `upstream` (a URL) that does the next action of `script` with each
    request, and `then` once the script is done.

    Each connection carries one request: the proxy asks the server to close it after the
    answer, so a client never sends a second request on it.
    """

    upstream: str
    script: list[Action] = field(default_factory=list)
    then: Action = field(default_factory=Forward)
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.threads = [threading.Thread(target=self.accept, daemon=True)]

    def __enter__(self) -> Proxy:
        self.threads[0].start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() below
        self.listener.close()
        for thread in list(self.threads):
            thread.join(timeout=30)

    def seen_at(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.target.split("?")[0] == path]

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # the listener was shut down: the test is over
                return
            thread = threading.Thread(target=self.handle, args=(client,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def handle(self, client: socket.socket) -> None:
        with client:
            request = receive_request(client)
            if request is None:
                return
            with self.lock:
                self.seen.append(request)
                action = self.script.pop(0) if self.script else self.then
            # A client that hung up first needs nothing more passed on.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                perform(action, request, client, self.upstream)


def receive_request(sock: socket.socket) -> Seen | None:
    data = b""
    while b"\r\n\r\n" not in data:
        if not (chunk := sock.recv(65536)):
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, target, _ = request_line.split(" ", 2)
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    while len(body) < int(headers.get("content-length", 0)):
        body += sock.recv(65536)
    return Seen(method, target, headers, body)


def perform(action: Action, request: Seen, client: socket.socket, upstream: str) -> None:
    if isinstance(action, Answer):
        client.sendall(action.raw)
        return hang_up(client, reset=False)
    host, port = httpx.URL(upstream).host, httpx.URL(upstream).port
    assert port is not None
    with socket.create_connection((host, port)) as server:
        server.sendall(request.to_server())
        response = server.recv(65536)  # the server has acted on the request once it answers
        if isinstance(action, Lose):
            return hang_up(client, reset=False)
        while b"\r\n\r\n" not in response and (more := server.recv(65536)):
            response += more
        head = response.index(b"\r\n\r\n") + 4
        limit = None if action.cut is None else head + action.cut
        forwarded = 0
        while response:
            part = response if limit is None else response[: limit - forwarded]
            client.sendall(part)
            forwarded += len(part)
            if limit is not None and forwarded >= limit:
                return hang_up(client, action.reset)
            response = server.recv(65536)
    return None


def hang_up(sock: socket.socket, reset: bool) -> None:
    """End the connection now: a FIN after what was sent, or a TCP reset (closed unlingered)."""
    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    else:
        sock.shutdown(socket.SHUT_RDWR)
