"""Python SDK for the trainctl API (httpx): `TrainctlClient` here, `AsyncTrainctlClient` in
`service.async_client`.

    with TrainctlClient() as api:                 # TRAINCTL_URL, TRAINCTL_API_TOKEN
        run = api.submit_train(experiment="demo", steps=200)
        for event in api.events(run.id):          # EventPublic, until the run ends
            print(event.type, event.data)
        api.download_file("demo", "best", "model.safetensors", Path("weights/"))

Answers are the API's own response models (`service.schemas`: RunPublic, CheckpointPublic,
...), so a field typo is a type error, not a KeyError at runtime. Every non-2xx answer raises
`ApiError` carrying the server's `detail`.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from service.schemas import (
    CheckpointPublic,
    CheckpointsPublic,
    EventPublic,
    HealthPublic,
    LogPublic,
    LogsPublic,
    MetricPublic,
    MetricsPublic,
    PruneResult,
    ReadinessPublic,
    RunPublic,
    RunsPublic,
    WorkerPublic,
    WorkersPublic,
)
from store.exceptions import TrainctlError
from store.vocabulary import TERMINAL_STATES

CHUNK = 1 << 20
DEFAULT_URL = "http://127.0.0.1:8000"
M = TypeVar("M", bound=BaseModel)
Progress = Callable[[int, int | None], None]
"""Download progress: (bytes on disk, total bytes or None)."""


class ApiError(TrainctlError):
    """The server answered with an error status; `detail` is its explanation."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"HTTP {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class DownloadError(TrainctlError):
    """A downloaded file does not match its manifest entry."""


def client_kwargs(base_url: str | None, token: str | None, timeout: float) -> dict[str, Any]:
    """Explicit arguments win; otherwise TRAINCTL_URL and TRAINCTL_API_TOKEN, like the CLI."""
    token = token if token is not None else os.environ.get("TRAINCTL_API_TOKEN")
    return {
        "base_url": base_url or os.environ.get("TRAINCTL_URL") or DEFAULT_URL,
        "headers": {"Authorization": f"Bearer {token}"} if token else {},
        # Reads may wait long on an idle event stream (keepalives come every 15 s); connecting
        # should fail fast when the service is not there.
        "timeout": httpx.Timeout(timeout, connect=min(timeout, 10.0)),
    }


class TrainctlClient:
    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(transport=transport, **client_kwargs(base_url, token, timeout))

    @property
    def base_url(self) -> str:
        return str(self._http.base_url)

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

    def submit(
        self, kind: str, spec: dict[str, Any] | BaseModel, idempotency_key: str | None = None
    ) -> RunPublic:
        """Queue a run of `kind` (train, validate, benchmark) with a spec (dict or spec model)."""
        body, headers = submission(spec, idempotency_key)
        return self._call(RunPublic, "POST", f"/runs/{kind}", json=body, headers=headers)

    def submit_train(self, **spec: Any) -> RunPublic:
        return self.submit("train", spec)

    def submit_validate(self, **spec: Any) -> RunPublic:
        return self.submit("validate", spec)

    def submit_benchmark(self, **spec: Any) -> RunPublic:
        return self.submit("benchmark", spec)

    def get_run(self, run_id: str) -> RunPublic:
        return self._call(RunPublic, "GET", f"/runs/{run_id}")

    def list_runs(self, **filters: Any) -> RunsPublic:
        """One page. Filters: kind, state, experiment, limit, cursor."""
        return self._call(RunsPublic, "GET", "/runs", params=only(**filters))

    def iter_runs(self, **filters: Any) -> Iterator[RunPublic]:
        """Every matching run, newest first, following the cursors page by page."""
        cursor = filters.pop("cursor", None)
        while True:
            page = self.list_runs(**filters, cursor=cursor)
            yield from page.items
            if (cursor := page.next_cursor) is None:
                return

    def cancel_run(self, run_id: str) -> RunPublic:
        return self._call(RunPublic, "POST", f"/runs/{run_id}/cancel")

    def wait(self, run_id: str, timeout: float | None = None, poll: float = 0.2) -> RunPublic:
        """Poll until the run is finished and return it; TimeoutError after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (run := self.get_run(run_id)).state not in TERMINAL_STATES:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} is still {run.state} after {timeout} s")
            time.sleep(poll)
        return run

    def events(self, run_id: str, last_event_id: int | None = None) -> Iterator[EventPublic]:
        """The run's events as they happen (SSE), ending when the run has finished."""
        headers = resume_headers(last_event_id)
        with self._http.stream("GET", f"/runs/{run_id}/events", headers=headers) as response:
            raise_for_status(response, response.read)
            for event_type, data in _parse_sse(response.iter_lines()):
                if event_type == "end":
                    return
                yield EventPublic.model_validate_json(data)

    def metrics(self, run_id: str, kind: str | None = None) -> list[MetricPublic]:
        """The run's metrics history; each row has the worker's numbers as extra fields."""
        url = f"/runs/{run_id}/metrics"
        return self._call(MetricsPublic, "GET", url, params=only(kind=kind)).items

    def logs(self, run_id: str) -> list[LogPublic]:
        return self._call(LogsPublic, "GET", f"/runs/{run_id}/logs").items

    # --- checkpoints ---

    def list_checkpoints(self, experiment: str | None = None) -> list[CheckpointPublic]:
        params = only(experiment=experiment)
        return self._call(CheckpointsPublic, "GET", "/checkpoints", params=params).items

    def latest_checkpoint(self, experiment: str | None = None) -> CheckpointPublic:
        params = only(experiment=experiment)
        return self._call(CheckpointPublic, "GET", "/checkpoints/latest", params=params)

    def best_checkpoint(self, experiment: str | None = None) -> CheckpointPublic:
        params = only(experiment=experiment)
        return self._call(CheckpointPublic, "GET", "/checkpoints/best", params=params)

    def get_checkpoint(self, experiment: str, tag: str) -> CheckpointPublic:
        return self._call(CheckpointPublic, "GET", f"/checkpoints/{experiment}/{tag}")

    def download_file(
        self,
        experiment: str,
        tag: str,
        name: str,
        dest: Path,
        *,
        on_progress: Progress | None = None,
    ) -> Path:
        """Download one file to `dest` (a file, or a folder to put it in), sha256-checked.

        The bytes go to `<dest>.part` first and are renamed only once verified. An interrupted
        download leaves the `.part` file, and the next call resumes it with a Range request
        (If-Range: the ETag, so a file that changed meanwhile is fetched whole again).
        """
        download = _Download(self.get_checkpoint(experiment, tag), name, dest, on_progress)
        url = f"/checkpoints/{experiment}/{tag}/files/{name}"
        with self._http.stream("GET", url, headers=download.request_headers()) as response:
            raise_for_status(response, response.read)
            with download.open(response) as out:
                for chunk in response.iter_bytes(CHUNK):
                    download.write(out, chunk)
        return download.finish()

    def download_archive(self, experiment: str, tag: str, dest: Path) -> Path:
        """Stream the checkpoint's tar to `dest` (a file path, or a folder to put it in)."""
        target = Path(dest) / f"{experiment}-{tag}.tar" if Path(dest).is_dir() else Path(dest)
        partial = target.with_name(f"{target.name}.part")
        url = f"/checkpoints/{experiment}/{tag}/archive"
        with self._http.stream("GET", url) as response, open(partial, "wb") as out:
            raise_for_status(response, response.read)
            for chunk in response.iter_bytes(CHUNK):
                out.write(chunk)
        os.replace(partial, target)
        return target

    def delete_checkpoint(self, experiment: str, tag: str) -> CheckpointPublic:
        return self._call(CheckpointPublic, "DELETE", f"/checkpoints/{experiment}/{tag}")

    def prune(
        self, experiment: str, keep_last: int, keep_best: bool = True, dry_run: bool = False
    ) -> PruneResult:
        body = prune_body(experiment, keep_last, keep_best, dry_run)
        return self._call(PruneResult, "POST", "/checkpoints/prune", json=body)

    # --- system ---

    def workers(self) -> list[WorkerPublic]:
        return self._call(WorkersPublic, "GET", "/workers").items

    def health(self) -> HealthPublic:
        return self._call(HealthPublic, "GET", "/healthz")

    def readiness(self) -> ReadinessPublic:
        return self._call(ReadinessPublic, "GET", "/readyz")

    # --- plumbing ---

    def _call(self, model: type[M], method: str, url: str, **kwargs: Any) -> M:
        response = self._http.request(method, url, **kwargs)
        raise_for_status(response)
        return model.model_validate_json(response.content)


# --- shared by both clients ---------------------------------------------------------------


class _Download:
    """One file download into `<target>.part`, resumable, verified against the manifest."""

    def __init__(
        self, checkpoint: CheckpointPublic, name: str, dest: Path, on_progress: Progress | None
    ) -> None:
        entry = next((f for f in checkpoint.files if f.name == name), None)
        self.label = f"{checkpoint.experiment}/{checkpoint.tag}/{name}"
        self.sha256 = entry.sha256 if entry else None  # the manifest does not list itself
        self.total = entry.size if entry else None
        self.target = Path(dest) / name if Path(dest).is_dir() else Path(dest)
        self.part = self.target.with_name(f"{self.target.name}.part")
        self.on_progress = on_progress or (lambda done, total: None)
        self.digest = hashlib.sha256()
        self.done = 0

    def request_headers(self) -> dict[str, str]:
        have = self.part.stat().st_size if self.part.exists() else 0
        if not have or self.sha256 is None or (self.total is not None and have > self.total):
            return {}
        return {"Range": f"bytes={have}-", "If-Range": f'"{self.sha256}"'}

    def open(self, response: httpx.Response) -> Any:
        """The .part file to write to: appended to on a 206, started afresh otherwise."""
        if response.status_code == 206:
            with open(self.part, "rb") as f:
                while chunk := f.read(CHUNK):
                    self.digest.update(chunk)
                    self.done += len(chunk)
            self.on_progress(self.done, self.total)
            return open(self.part, "ab")
        return open(self.part, "wb")

    def write(self, out: Any, chunk: bytes) -> None:
        out.write(chunk)
        self.digest.update(chunk)
        self.done += len(chunk)
        self.on_progress(self.done, self.total)

    def finish(self) -> Path:
        digest = self.digest.hexdigest()
        if self.sha256 is not None and digest != self.sha256:
            self.part.unlink()  # a resume would only extend the wrong bytes
            raise DownloadError(
                f"{self.label}: sha256 {digest} does not match the manifest's {self.sha256}; "
                "the partial file was removed, download it again"
            )
        os.replace(self.part, self.target)
        return self.target


def submission(
    spec: dict[str, Any] | BaseModel, idempotency_key: str | None
) -> tuple[dict[str, Any], dict[str, str]]:
    if isinstance(spec, BaseModel):
        spec = spec.model_dump(mode="json", exclude_unset=True)
    return spec, ({"Idempotency-Key": idempotency_key} if idempotency_key else {})


def prune_body(experiment: str, keep_last: int, keep_best: bool, dry_run: bool) -> dict[str, Any]:
    return {
        "experiment": experiment,
        "keep_last": keep_last,
        "keep_best": keep_best,
        "dry_run": dry_run,
    }


def resume_headers(last_event_id: int | None) -> dict[str, str]:
    return {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}


def only(**params: Any) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


def raise_for_status(response: httpx.Response, read: Callable[[], Any] | None = None) -> None:
    if response.is_success:
        return
    if read is not None:
        read()  # a streamed response: its body (the error) is not loaded yet
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    detail = detail if detail is not None else response.text
    raise ApiError(response.status_code, str(detail or response.reason_phrase))


class SseFrames:
    """Assembles SSE lines into (event type, data) frames; comments and ids are skipped."""

    def __init__(self) -> None:
        self.event_type, self.data = "message", list[str]()

    def feed(self, line: str) -> tuple[str, str] | None:
        if not line:
            frame = (self.event_type, "\n".join(self.data)) if self.data else None
            self.event_type, self.data = "message", []
            return frame
        if not line.startswith(":"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                self.event_type = value
            elif field == "data":
                self.data.append(value)
        return None


def _parse_sse(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    frames = SseFrames()
    for line in lines:
        if (frame := frames.feed(line)) is not None:
            yield frame
