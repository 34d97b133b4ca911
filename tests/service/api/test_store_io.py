"""Issue 23, class 1: a read of the store that never returns (a FIFO, a hung mount) holds up
no other request. No route reads the store on the event loop, and the store's routes hold
one of `store_concurrency` slots each: a stuck one keeps a thread of the pool, never all of
them, and one more waits for a slot and then gets a 503 (service/limits.py)."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.service.fakes import save_checkpoint
from tests.service.serving import serve
from tests.support.polling import poll
from tests.support.stores import folder
from trainctl.service.app import create_app
from trainctl.service.deps import get_checkpoints
from trainctl.service.settings import Settings
from trainctl.store.checkpoints.memory import MemoryStorage
from trainctl.store.checkpoints.storage import Reader
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.names import step_tag


class StuckStorage:
    """A storage in memory whose opens wait until `release` is set: a file that never
    answers, whatever the backend does about FIFOs."""

    def __init__(self) -> None:
        self.inner = MemoryStorage()
        self.stuck = False
        self.release = threading.Event()
        self.waiting = 0

    def open(self, experiment: str, tag: str, name: str) -> Reader:
        if self.stuck:
            self.waiting += 1
            self.release.wait(timeout=120)
        return self.inner.open(experiment, tag, name)

    @contextmanager
    def reading(self, experiment: str) -> Iterator[None]:
        yield  # the memory storage's one lock for all would queue the stuck reads on it

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def get_in_thread(url: str, results: list[int]) -> threading.Thread:
    def get() -> None:
        try:
            results.append(httpx.get(url, timeout=120).status_code)
        except httpx.HTTPError:
            results.append(-1)

    thread = threading.Thread(target=get, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def stuck(tmp_path: Path) -> Iterator[tuple[FastAPI, StuckStorage]]:
    storage = StuckStorage()
    store = CheckpointStore(storage)  # a Storage by its methods
    for experiment in ("e", "f", "g"):
        save_checkpoint(store, experiment, step=10)
    settings = Settings(data_dir=tmp_path, workers=0, store_concurrency=2, store_wait_seconds=1)
    app = create_app(settings)
    app.dependency_overrides[get_checkpoints] = lambda: store
    try:
        yield app, storage
    finally:
        storage.release.set()


def test_store_reads_that_never_return_hold_up_nothing_else_and_the_next_is_a_503(
    stuck: tuple[FastAPI, StuckStorage],
) -> None:
    app, storage = stuck
    storage.stuck = True
    with serve(app) as url:
        checkpoint = f"{url}/checkpoints/{{}}/{step_tag(10)}"
        results: list[int] = []
        threads = [get_in_thread(checkpoint.format(e), results) for e in ("e", "f")]
        poll(lambda: storage.waiting == 2, timeout=30, what="two reads stuck in the store")

        health = httpx.get(f"{url}/healthz", timeout=30)
        runs = httpx.get(f"{url}/runs", timeout=30)
        busy = httpx.get(checkpoint.format("g") + "/files/model.safetensors", timeout=30)
        reached_the_store = storage.waiting
        storage.stuck = False
        storage.release.set()
        for thread in threads:
            thread.join(timeout=60)
        after = httpx.get(checkpoint.format("g"), timeout=30)

    assert health.status_code == 200
    assert runs.status_code == 200  # the database's routes still have threads
    assert busy.status_code == 503
    assert busy.headers["Retry-After"] == "1"
    assert "all 2 slots for store requests are taken" in busy.json()["detail"]
    assert "X-Frame-Options" in busy.headers
    assert reached_the_store == 2  # the third waited for a slot, not in the store
    assert results == [200, 200]
    assert after.status_code == 200


def test_a_fifo_in_a_checkpoint_freezes_no_other_request(tmp_path: Path) -> None:
    """The issue's example, on the real POSIX store: metadata.json is a FIFO. Its reader
    either waits in a thread (until the test opens the FIFO's other end) or is refused at
    once (a store that opens only regular files); either way the API answers meanwhile."""
    app = create_app(Settings(data_dir=tmp_path, workers=0))
    with serve(app) as url:
        ckpts: CheckpointStore = app.state.checkpoints
        save_checkpoint(ckpts, "e", step=10)
        fifo = folder(ckpts, "e", step_tag(10)) / "metadata.json"
        fifo.unlink()
        os.mkfifo(fifo)
        results: list[int] = []
        thread = get_in_thread(f"{url}/checkpoints/e/{step_tag(10)}", results)
        try:
            health = httpx.get(f"{url}/healthz", timeout=30)
            runs = httpx.get(f"{url}/runs", timeout=30)
        finally:
            poll(lambda: results or release_fifo_reader(fifo), timeout=60, what="the reader")
            thread.join(timeout=60)

    assert health.status_code == 200
    assert runs.status_code == 200
    assert results and 400 <= results[0] < 500, results


def release_fifo_reader(fifo: Path) -> bool:
    """Open the FIFO's write end and close it (the reader then sees end of file); False
    while nobody reads it yet."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return False
        raise
    return True
