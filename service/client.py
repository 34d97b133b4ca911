"""A small synchronous client for the trainctl API (httpx).

    with TrainctlClient("http://127.0.0.1:8000", token=...) as api:
        run = api.submit_train(experiment="demo", steps=200)
        for event in api.events(run["id"]):
            print(event["type"], event["data"])
        api.download_file("demo", "best", "model.safetensors", Path("weights/"))

Every non-2xx answer raises `ApiError` carrying the server's `detail`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from store.exceptions import TrainctlError

CHUNK = 1 << 20


class ApiError(TrainctlError):
    """The server answered with an error status; `detail` is its explanation."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"HTTP {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class DownloadError(TrainctlError):
    """A downloaded file does not match its manifest entry."""


class TrainctlClient:
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        token: str | None = None,
        timeout: float = 30.0,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=base_url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TrainctlClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- runs ---

    def submit(self, kind: str, spec: dict[str, Any], idempotency_key: str | None = None) -> Any:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._json("POST", f"/runs/{kind}", json=spec, headers=headers)

    def submit_train(self, **spec: Any) -> Any:
        return self.submit("train", spec)

    def submit_validate(self, **spec: Any) -> Any:
        return self.submit("validate", spec)

    def submit_benchmark(self, **spec: Any) -> Any:
        return self.submit("benchmark", spec)

    def get_run(self, run_id: str) -> Any:
        return self._json("GET", f"/runs/{run_id}")

    def list_runs(self, **filters: Any) -> Any:
        """One page: `{items, next_cursor}`. Filters: kind, state, experiment, limit, cursor."""
        params = {k: v for k, v in filters.items() if v is not None}
        return self._json("GET", "/runs", params=params)

    def iter_runs(self, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every matching run, newest first, following the cursors."""
        cursor = filters.pop("cursor", None)
        while True:
            page = self.list_runs(**filters, cursor=cursor)
            yield from page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def cancel_run(self, run_id: str) -> Any:
        return self._json("POST", f"/runs/{run_id}/cancel")

    def wait(self, run_id: str, timeout: float | None = None, poll: float = 0.2) -> Any:
        """Poll until the run is finished and return it; TimeoutError after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.get_run(run_id)
            if run["state"] in ("succeeded", "failed", "cancelled"):
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} is still {run['state']} after {timeout} s")
            time.sleep(poll)

    def events(self, run_id: str, last_event_id: int | None = None) -> Iterator[dict[str, Any]]:
        """The run's events as they happen (SSE), ending when the run has finished."""
        headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
        with self._http.stream("GET", f"/runs/{run_id}/events", headers=headers) as response:
            _raise_for_status(response)
            for event_type, data in _parse_sse(response.iter_lines()):
                if event_type == "end":
                    return
                yield json.loads(data)

    def metrics(self, run_id: str, kind: str | None = None) -> Any:
        params = {"kind": kind} if kind else {}
        return self._json("GET", f"/runs/{run_id}/metrics", params=params)["items"]

    def logs(self, run_id: str) -> Any:
        return self._json("GET", f"/runs/{run_id}/logs")["items"]

    # --- checkpoints ---

    def list_checkpoints(self, experiment: str | None = None) -> Any:
        return self._json("GET", "/checkpoints", params=_only(experiment=experiment))["items"]

    def latest_checkpoint(self, experiment: str | None = None) -> Any:
        return self._json("GET", "/checkpoints/latest", params=_only(experiment=experiment))

    def best_checkpoint(self, experiment: str | None = None) -> Any:
        return self._json("GET", "/checkpoints/best", params=_only(experiment=experiment))

    def get_checkpoint(self, experiment: str, tag: str) -> Any:
        return self._json("GET", f"/checkpoints/{experiment}/{tag}")

    def download_file(self, experiment: str, tag: str, name: str, dest: Path) -> Path:
        """Stream one file to `dest` (a file path, or a folder to put it in); check its sha256.

        The bytes land in a temporary file beside `dest` first, so a failed or corrupt
        download never leaves a file that looks complete.
        """
        entry = next(
            (f for f in self.get_checkpoint(experiment, tag)["files"] if f["name"] == name), None
        )
        target = Path(dest) / name if Path(dest).is_dir() else Path(dest)
        digest = self._stream_to(f"/checkpoints/{experiment}/{tag}/files/{name}", target)
        if entry is not None and digest != entry["sha256"]:
            target.unlink()
            raise DownloadError(
                f"{experiment}/{tag}/{name}: sha256 {digest} does not match the manifest's "
                f"{entry['sha256']}; the file was removed, download it again"
            )
        return target

    def download_archive(self, experiment: str, tag: str, dest: Path) -> Path:
        """Stream the checkpoint's tar to `dest` (a file path, or a folder to put it in)."""
        target = Path(dest) / f"{experiment}-{tag}.tar" if Path(dest).is_dir() else Path(dest)
        self._stream_to(f"/checkpoints/{experiment}/{tag}/archive", target)
        return target

    def delete_checkpoint(self, experiment: str, tag: str) -> Any:
        return self._json("DELETE", f"/checkpoints/{experiment}/{tag}")

    def prune(
        self, experiment: str, keep_last: int, keep_best: bool = True, dry_run: bool = False
    ) -> Any:
        body = {"experiment": experiment, "keep_last": keep_last}
        return self._json("POST", "/checkpoints/prune", json=body | {
            "keep_best": keep_best, "dry_run": dry_run
        })  # fmt: skip

    # --- system ---

    def workers(self) -> Any:
        return self._json("GET", "/workers")["items"]

    def health(self) -> Any:
        return self._json("GET", "/healthz")

    # --- plumbing ---

    def _json(self, method: str, url: str, **kwargs: Any) -> Any:
        response = self._http.request(method, url, **kwargs)
        _raise_for_status(response)
        return response.json()

    def _stream_to(self, url: str, target: Path) -> str:
        """Download `url` into `target` atomically; return the bytes' sha256."""
        digest = hashlib.sha256()
        partial = target.with_name(f".{target.name}.part")
        try:
            with self._http.stream("GET", url) as response, open(partial, "wb") as out:
                _raise_for_status(response)
                for chunk in response.iter_bytes(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        return digest.hexdigest()


def _only(**params: Any) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


def _raise_for_status(response: httpx.Response) -> None:
    if response.is_success:
        return
    response.read()
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    detail = detail if detail is not None else response.text
    raise ApiError(response.status_code, str(detail or response.reason_phrase))


def _parse_sse(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event type, data) for each SSE frame; comments (keepalives) and ids are skipped."""
    event_type, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield event_type, "\n".join(data)
            event_type, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event_type = value
            elif field == "data":
                data.append(value)
