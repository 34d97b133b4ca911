"""The mlflow sink: each train run mirrored to an MLflow tracking server (TRAINCTL_MLFLOW_URI;
docs/design/sinks.md, "Metrics sinks", "MLflow").

It speaks the tracking server's REST API (`/api/2.0/mlflow/...`) with httpx, which the service
has already, rather than importing the mlflow package (databricks-sdk, opentelemetry,
gitpython, ... in the API process), whose client retries a dead server for minutes inside one
call, where the mirror wants one short try and its own backoff.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

from trainctl.service.sinks.base import SinkRefused, SinkUnavailable, scalars
from trainctl.store.checkpoints.manifests import MANIFEST_FILE
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.records import Event, Run
from trainctl.store.exceptions import NotFound
from trainctl.store.specs import MLFLOW_SETTING

API = "/api/2.0/mlflow"
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"
PROXIED_ARTIFACTS = "mlflow-artifacts"
"""The scheme of an artifact URI the tracking server stores artifacts for itself."""
# The tracking server's limits (mlflow.utils.validation).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
RUN_ID_TAG = "trainctl.run_id"


class MlflowSink:
    name = "mlflow"

    def __init__(self, uri: str | None, checkpoints: CheckpointStore, timeout: float) -> None:
        """`uri` None: this service has no server; runs that name mlflow wait for one."""
        self.uri, self.checkpoints = uri, checkpoints
        self.where = _without_password(uri) if uri else "(none)"
        self._client = httpx.Client(
            base_url=uri or "http://invalid", timeout=httpx.Timeout(timeout, connect=timeout / 2)
        )
        self._experiments: dict[str, str] = {}

    def write(self, run: Run, events: Sequence[Event], memo: dict[str, Any]) -> None:
        metrics = [
            {"key": key, "value": _number(value), "timestamp": _ms(e.created_at), "step": step}
            for e in events
            if e.type == "metrics" and isinstance(step := e.data.get("step"), int)
            for key, value in scalars(e.data)
        ]
        if not metrics:
            return
        mlflow_run = self._ensure_run(run, memo)
        for chunk in _chunks(metrics, MAX_METRICS_PER_BATCH):
            self._post("runs/log-batch", {"run_id": mlflow_run, "metrics": chunk})

    def finish(self, run: Run, memo: dict[str, Any]) -> None:
        mlflow_run = self._ensure_run(run, memo)
        if not memo.get("checkpoint_logged"):
            self._log_checkpoint(run, mlflow_run, memo)
            memo["checkpoint_logged"] = True
        if run.error:
            self._post("runs/set-tag", _tag(mlflow_run, "trainctl.error", run.error))
        end = run.finished_at or run.created_at
        status = STATUS.get(run.state, "FAILED")
        self._post("runs/update", {"run_id": mlflow_run, "status": status, "end_time": _ms(end)})

    def close(self) -> None:
        self._client.close()

    # ---- the MLflow run ----------------------------------------------------------------------

    def _ensure_run(self, run: Run, memo: dict[str, Any]) -> str:
        """The MLflow run mirroring `run`, made (with its params) the first time."""
        if "run_id" not in memo:
            experiment = self._experiment(run.experiment)
            found = self._post(
                "runs/search",
                {
                    "experiment_ids": [experiment],
                    "filter": f"tags.`{RUN_ID_TAG}` = '{run.id}'",
                    "max_results": 1,
                },
            ).get("runs", [])
            info = found[0]["info"] if found else self._create_run(run, experiment)
            memo.update(run_id=info["run_id"], artifact_uri=info.get("artifact_uri", ""))
        mlflow_run: str = memo["run_id"]
        if not memo.get("params_logged"):
            params = [{"key": k, "value": v} for k, v in _params(run.spec)]
            for chunk in _chunks(params, MAX_PARAMS_PER_BATCH):
                self._post("runs/log-batch", {"run_id": mlflow_run, "params": chunk})
            memo["params_logged"] = True
        return mlflow_run

    def _create_run(self, run: Run, experiment: str) -> dict[str, Any]:
        started = run.started_at or run.created_at
        tags = {RUN_ID_TAG: run.id, "trainctl.experiment": run.experiment}
        body = {
            "experiment_id": experiment,
            "run_name": run.id,
            "start_time": _ms(started),
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
        }
        info: dict[str, Any] = self._post("runs/create", body)["run"]["info"]
        return info

    def _experiment(self, name: str) -> str:
        if name not in self._experiments:
            found = self._get("experiments/get-by-name", {"experiment_name": name})
            if found is None:
                # Refused when another client made it first: read it below either way.
                with contextlib.suppress(SinkRefused):
                    self._post("experiments/create", {"name": name})
                found = self._get("experiments/get-by-name", {"experiment_name": name})
            if found is None:
                raise SinkRefused(f"{self.where} has no experiment {name!r} and made none")
            self._experiments[name] = found["experiment"]["experiment_id"]
        return self._experiments[name]

    def _log_checkpoint(self, run: Run, mlflow_run: str, memo: dict[str, Any]) -> None:
        """The final checkpoint's name and manifest; nothing for a run that saved none."""
        result = run.result or {}
        experiment, tag = result.get("experiment"), result.get("checkpoint")
        if not (isinstance(experiment, str) and isinstance(tag, str)):
            return
        self._post("runs/set-tag", _tag(mlflow_run, "trainctl.checkpoint", f"{experiment}/{tag}"))
        try:
            _, reader = self.checkpoints.open_file(experiment, tag, MANIFEST_FILE)
        except NotFound:
            return  # deleted or pruned since; its name above is all there is to say
        with reader:
            manifest = reader.read()
        artifacts = urlsplit(memo.get("artifact_uri", ""))
        if artifacts.scheme == PROXIED_ARTIFACTS:
            path = f"{artifacts.path.strip('/')}/checkpoint/{MANIFEST_FILE}"
            self._send("PUT", f"{ARTIFACTS}/{path}", content=manifest)
        elif len(manifest) <= MAX_TAG_VALUE:
            text = manifest.decode()
            self._post("runs/set-tag", _tag(mlflow_run, "trainctl.checkpoint.manifest", text))

    # ---- HTTP --------------------------------------------------------------------------------

    def _get(self, path: str, params: dict[str, str]) -> dict[str, Any] | None:
        """A read; None when the server says there is no such thing (404)."""
        return self._send("GET", f"{API}/{path}", params=params, missing_ok=True)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self._send("POST", f"{API}/{path}", json=body)
        assert answer is not None
        return answer

    def _send(
        self, method: str, path: str, *, missing_ok: bool = False, **kwargs: Any
    ) -> dict[str, Any] | None:
        if self.uri is None:
            raise SinkUnavailable(f"this service has no MLflow server: set {MLFLOW_SETTING}")
        try:
            answer = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise SinkUnavailable(f"cannot reach {self.where}: {_describe(exc)}") from exc
        if answer.status_code == 404 and missing_ok:
            return None
        if answer.status_code >= 500 or answer.status_code in (408, 429):
            raise SinkUnavailable(f"{self.where} answered {answer.status_code} to {path}")
        if answer.status_code >= 400:
            raise SinkRefused(
                f"{self.where} refused {path} ({answer.status_code}): {answer.text[:300]}"
            )
        try:
            body: dict[str, Any] = answer.json() if answer.content else {}
        except ValueError as exc:  # a proxy's page in front of a server that is down
            raise SinkUnavailable(f"{self.where} answered {path} with no JSON") from exc
        return body


def _params(spec: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """The plan as MLflow params: nested fields joined with dots, values as text, cut to
    what the server accepts (a long list of data paths would not fit)."""
    for key, value in _flatten(spec, ""):
        text = value if isinstance(value, str) else json.dumps(value)
        if len(text) > MAX_PARAM_VALUE:
            text = text[: MAX_PARAM_VALUE - 20] + f"... ({len(text):,} chars)"
        yield key[:MAX_KEY], text


def _flatten(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _flatten(item, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


def _chunks(items: list[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _number(value: float) -> float | str:
    # JSON has no NaN or infinities; the server's protobuf parser reads these strings.
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _tag(mlflow_run: str, key: str, value: str) -> dict[str, str]:
    return {"run_id": mlflow_run, "key": key, "value": value[:MAX_TAG_VALUE]}


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _without_password(uri: str) -> str:
    """The server as logs may show it: no user or password."""
    parts = urlsplit(uri)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _describe(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    if isinstance(exc, httpx.ConnectError):
        return "connection refused or unreachable"
    if isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError):
        # The server went away in the middle of an answer (it was stopped or crashed).
        return "connection reset or closed mid-request"
    return str(exc) or type(exc).__name__
