"""The app served for real: uvicorn in a thread on 127.0.0.1 and a free port."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from tests.support.polling import poll


@contextmanager
def serve(app: FastAPI, stop_timeout: float = 30) -> Iterator[str]:
    """Serve `app` (its lifespan included) until the block ends; yields its URL."""
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP, and
    # without it every response after a connection's first waited 40 ms for a delayed ACK
    # (uvicorn.run's own sockets say it; so `make serve` never had the wait).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    poll(lambda: server.started or not thread.is_alive(), timeout=30, what="uvicorn to start")
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=stop_timeout)
        sock.close()
