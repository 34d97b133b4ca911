"""Event streams over real HTTP: a stream lasts no longer than its token (issue 23, class 8),
streams are bounded per token and in all, and an idle one costs no query of its own (class
10): one feed polls for every stream of the process (service/sse.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from pydantic import SecretStr
from sqlalchemy import event

from tests.service.serving import serve
from tests.support.polling import poll
from trainctl.service.app import create_app
from trainctl.service.settings import Settings

TOKEN = "event-streams-admin"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
QUEUED_TRAIN = {"experiment": "e", "steps": 10, "device": "cpu"}


class Stream:
    """A stream read in a thread, line by line, until it ends or is closed."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.status: int | None = None
        self.ended = threading.Event()
        self._client = httpx.Client(timeout=httpx.Timeout(60, read=None))
        self._request = self._client.build_request("GET", url, headers=headers)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            response = self._client.send(self._request, stream=True)
            self.status = response.status_code
            for line in response.iter_lines():
                self.lines.append(line)
        except httpx.HTTPError:
            pass
        finally:
            self.ended.set()

    def close(self) -> None:
        self._client.close()  # the server sees the disconnect
        self._thread.join(timeout=30)


@contextmanager
def streams() -> Iterator[list[Stream]]:
    opened: list[Stream] = []
    try:
        yield opened
    finally:
        for stream in opened:
            stream.close()


def guarded_app(tmp_path: Path, **settings: Any) -> FastAPI:
    return create_app(
        Settings(data_dir=tmp_path, workers=0, api_token=SecretStr(TOKEN), **settings)
    )


def queued_run(app: FastAPI, url: str, experiment: str = "e") -> str:
    """A queued run (no worker takes it) with one event, which its streams send first."""
    r = httpx.post(f"{url}/runs/train", json={**QUEUED_TRAIN, "experiment": experiment},
                   headers=ADMIN)  # fmt: skip
    assert r.status_code == 202, r.text
    run_id: str = r.json()["id"]
    app.state.runs.append_event(run_id, "log", {"level": "info", "message": "waiting"})
    return run_id


def has_sent_an_event(stream: Stream) -> bool:
    return "event: log" in stream.lines


def make_token(url: str, name: str) -> dict[str, str]:
    r = httpx.post(f"{url}/tokens", json={"name": name, "scope": "read"}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def test_a_stream_ends_within_seconds_of_its_token_being_revoked(tmp_path: Path) -> None:
    app = guarded_app(tmp_path)
    with serve(app) as url:
        run_id = queued_run(app, url)
        watcher = make_token(url, "watcher")
        with streams() as opened:
            opened.append(stream := Stream(f"{url}/runs/{run_id}/events", watcher))
            poll(lambda: has_sent_an_event(stream), timeout=30, what="the stream's event")

            assert httpx.delete(f"{url}/tokens/watcher", headers=ADMIN).status_code == 200
            ended = stream.ended.wait(timeout=30)
            again = httpx.get(f"{url}/runs/{run_id}/events", headers=watcher)

    assert ended, "the stream of a revoked token went on"
    assert stream.status == 200
    assert stream.lines[-2:] == [": the token of this stream was revoked", ""]
    assert "event: end" not in stream.lines  # the run did not end: the token did
    assert again.status_code == 401


def test_streams_beyond_a_tokens_share_are_429_and_beyond_all_are_503(tmp_path: Path) -> None:
    """The server sees a closed stream when it next writes to it, its keepalive: at 0.5 s
    rather than 15, the closed stream gives back its slot (and the rest end) at once."""
    app = guarded_app(
        tmp_path,
        max_event_streams=3,
        max_event_streams_per_token=2,
        event_stream_keepalive_seconds=0.5,
    )
    with serve(app) as url, streams() as opened:
        run_id = queued_run(app, url)
        events = f"{url}/runs/{run_id}/events"
        alice, bob = make_token(url, "alice"), make_token(url, "bob")
        opened += [Stream(events, alice), Stream(events, alice), Stream(events, bob)]
        poll(lambda: all(s.status == 200 for s in opened), timeout=30, what="three streams")

        alices_third = httpx.get(events, headers=alice)
        bobs_second = httpx.get(events, headers=bob)
        opened[0].close()
        poll(lambda: httpx.get(f"{url}/readyz", headers=ADMIN).status_code == 200
             and app.state.stream_slots.open["alice"] == 1, timeout=30,
             what="alice's closed stream to give back its slot")  # fmt: skip
        opened.append(Stream(events, alice))
        poll(lambda: opened[-1].status is not None, timeout=30, what="alice's new stream")

    assert alices_third.status_code == 429
    assert alices_third.headers["Retry-After"] == "1"
    assert "token 'alice' has 2 event streams open" in alices_third.json()["detail"]
    assert bobs_second.status_code == 503
    assert bobs_second.headers["Retry-After"] == "1"
    assert "3 event streams are open" in bobs_second.json()["detail"]
    assert opened[-1].status == 200


def test_idle_streams_make_no_query_of_their_own_only_the_feeds_one(tmp_path: Path) -> None:
    """Each of 12 idle streams reads its run once; after that, while the feed polls eight
    times, none queries again (before, each polled the database every 0.25 s)."""
    app = guarded_app(tmp_path, max_event_streams_per_token=100)
    with serve(app) as url, streams() as opened:
        run_ids = [queued_run(app, url, f"e{i}") for i in range(12)]
        statements: list[str] = []
        engine = app.state.runs.engine
        record = lambda *args: statements.append(str(args[2]))  # noqa: E731
        event.listen(engine, "before_cursor_execute", record)
        try:
            opened += [Stream(f"{url}/runs/{r}/events", ADMIN) for r in run_ids]
            poll(lambda: all(map(has_sent_an_event, opened)), timeout=60,
                 what="every stream's event")  # fmt: skip
            settled = len(statements)
            assert any(map(is_a_streams_read, statements[:settled]))  # each read its run
            poll(lambda: sum(is_feed_poll(s) for s in statements[settled:]) >= 8,
                 timeout=60, what="eight polls of the feed")  # fmt: skip
            window = statements[settled:]
        finally:
            event.remove(engine, "before_cursor_execute", record)
        # Finished runs end their streams now; left open, each would end at its next
        # keepalive, 15 s on, when the server first sees the client gone.
        for run_id in run_ids:
            app.state.runs.request_cancel(run_id)
        poll(lambda: all(s.ended.is_set() for s in opened), timeout=30, what="the streams' ends")

    assert [s for s in window if is_a_streams_read(s)] == []


def is_a_streams_read(statement: str) -> bool:
    """`RunStore.get` and `RunStore.events` of one run, what each stream used to poll."""
    return "WHERE runs.id = ?" in statement or "run_events.run_id = ?" in statement


def is_feed_poll(statement: str) -> bool:
    return "max(run_events.id)" in statement
