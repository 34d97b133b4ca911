"""Fuzzing: schemathesis sends requests generated from the OpenAPI schema to every endpoint
and checks each answer against that schema.

Each endpoint is fuzzed in-process (ASGI) against a fresh app on a temporary data dir: a real
SQLite store, no worker processes, a few fabricated checkpoints and runs, so that paths
naming real runs, checkpoints and files are exercised as well as random ones. It runs three
ways: no token configured; a token configured and sent; a token configured and not sent
(every endpoint but /healthz must then refuse, with its documented 401).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis import checks

from tests.service.conftest import finish, save_checkpoint
from trainctl.service.app import create_app
from trainctl.service.openapi import build_openapi
from trainctl.service.settings import Settings
from trainctl.service.submit import submit_run
from trainctl.store.checkpoints import (
    MANIFEST_FILE,
    METADATA_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    CheckpointStore,
)
from trainctl.store.runs import RunStore
from trainctl.store.specs import BenchmarkRequest, TrainRequest, ValidateRequest
from trainctl.store.vocabulary import RunState

MAX_EXAMPLES = 50
"""Generated requests per endpoint and mode, on top of schemathesis's boundary-value cases."""

TOKEN = "fuzz-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}

# Not `positive_data_acceptance`: a spec valid by the schema is still refused (422) when,
# say, its preset is unknown.
# Not `ignored_auth`: its probes need the app on the schema, which is shared by the tests;
# the test without a token checks the same thing (no protected endpoint answers 2xx).
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
    checks.unsupported_method,
]
# Data the schema forbids gets a 4xx: run specs, model overrides and prune requests refuse
# JSON values of the wrong type, and a query parameter a route does not take (or one given
# twice) is a 422 (service/routing.py). Not for a case whose headers schemathesis broke on
# purpose while the test sends the right token over them (see `header_is_negative`).
AS_GENERATED = [*CHECKS, checks.negative_data_rejection]

# --- what the app holds ----------------------------------------------------------------------

CHECKPOINTS = [("fuzz", "step_10"), ("fuzz", "step_20"), ("fuzz", "best"), ("other", "step_5")]
FILES = [MODEL_FILE, OPTIMIZER_FILE, METADATA_FILE, MANIFEST_FILE]
RUN_STATES: list[RunState] = ["succeeded", "failed", "cancelled", "queued"]
RUN_REF = "seeded-{}"
"""Run ids are random, known only once a test's app has them: the generated path carries this
placeholder (one per run state), and the test swaps in the real id before sending."""


def seed(settings: Settings, runs: RunStore, ckpts: CheckpointStore) -> dict[str, str]:
    """Checkpoints and one run per state; returns the run id of each state."""
    for step, best_loss in [(10, 4.0), (20, 3.0)]:
        save_checkpoint(ckpts, "fuzz", step=step, best_loss=best_loss)
    save_checkpoint(ckpts, "fuzz", "best", step=20, best_loss=3.0)
    save_checkpoint(ckpts, "other", step=5, best_loss=9.0)
    runs.register_worker("fuzz-worker", host="fuzz", pid=1, device="cpu", info={"cores": 2})
    ctx: dict[str, Any] = {"settings": settings, "runs": runs, "ckpts": ckpts}

    trained = submit_run("train", TrainRequest(experiment="fuzz", steps=20, device="cpu"), **ctx)
    claimed = runs.claim("fuzz-worker", lease_seconds=60)
    assert claimed is not None and claimed.id == trained.id
    for step in (10, 20):
        runs.append_event(trained.id, "metrics", {"kind": "train", "step": step, "loss": 3.5})
        runs.append_event(trained.id, "log", {"level": "info", "message": f"step {step}"})
    runs.append_event(trained.id, "metrics", {"kind": "val", "step": 20, "val_loss": 3.0})
    runs.finish(trained.id, "fuzz-worker", claimed.attempt, "succeeded", result={"loss": 3.0})

    benchmark = submit_run("benchmark", BenchmarkRequest(steps=5, device="cpu"), **ctx)
    failed = finish(runs, benchmark.id, "failed")
    cancelled = submit_run("train", TrainRequest(experiment="other", steps=5, device="cpu"), **ctx)
    runs.request_cancel(cancelled.id)  # a queued run is cancelled at once
    # Stays queued (there are no workers), so fuzz/step_20 is protected: deleting it is a 409.
    queued = submit_run("validate", ValidateRequest(checkpoint="fuzz/step_20", device="cpu"), **ctx)
    ids = {
        "succeeded": trained.id,
        "failed": failed.id,
        "cancelled": cancelled.id,
        "queued": queued.id,
    }
    assert [runs.get(ids[state]).state for state in RUN_STATES] == RUN_STATES
    return ids


def real_path_parameters(path: str) -> st.SearchStrategy[dict[str, str]] | None:
    """Path parameters naming what `seed` stored, for the operation at `path`."""
    if "{run_id}" in path:
        # A queued run's event stream only ends when the run does, and no worker runs it.
        states = RUN_STATES[:-1] if path.endswith("/events") else RUN_STATES
        return st.sampled_from(states).map(lambda state: {"run_id": RUN_REF.format(state)})
    if "{experiment}" in path:
        named = st.sampled_from(CHECKPOINTS).map(lambda c: {"experiment": c[0], "tag": c[1]})
        if "{name}" in path:
            return st.tuples(named, st.sampled_from(FILES)).map(lambda p: p[0] | {"name": p[1]})
        return named
    return None


def before_generate_path_parameters(context: Any, strategy: Any) -> Any:
    real = real_path_parameters(context.operation.path)
    return strategy if real is None else st.one_of(real, strategy)


def before_generate_body(context: Any, strategy: Any) -> Any:
    if context.operation.path != "/checkpoints/prune":
        return strategy
    # Random experiment names only ever get a 404: prune the seeded experiments too.
    real = st.fixed_dictionaries(
        {"experiment": st.sampled_from(["fuzz", "other"]), "keep_last": st.integers(0, 3)},
        optional={"keep_best": st.booleans(), "dry_run": st.booleans()},
    )
    return st.one_of(real, strategy)


def build_schema(*, with_auth: bool) -> schemathesis.BaseSchema:
    """The schema the drift test pins (openapi/openapi.json); requests go to each test's app.

    `with_auth`: generate `Authorization` headers (the test then sends the right token),
    including cases that leave the header out and must get a 401.
    """
    schema = schemathesis.openapi.from_dict(build_openapi())
    schema.config.generation.update(max_examples=MAX_EXAMPLES, with_security_parameters=with_auth)
    # A safety net only: every stream the fuzzer can open ends (see `real_path_parameters`).
    schema.config.update(request_timeout=10)
    schema.hook(before_generate_path_parameters)
    schema.hook(before_generate_body)
    return schema


ANONYMOUS = build_schema(with_auth=False)
AUTHENTICATED = build_schema(with_auth=True)


# --- fixtures and the test -------------------------------------------------------------------


@dataclass
class FuzzTarget:
    app: FastAPI
    run_ids: dict[str, str]

    def send(self, case: schemathesis.Case, headers: dict[str, str]) -> schemathesis.Response:
        """Swap the real run id in for a placeholder, send the case, check the answer."""
        ref = (case.path_parameters or {}).get("run_id")
        for state, run_id in self.run_ids.items():
            if ref == RUN_REF.format(state):
                case.path_parameters["run_id"] = run_id
        checks = CHECKS if headers and header_is_negative(case) else AS_GENERATED
        return case.call_and_validate(app=self.app, headers=headers, checks=checks)


def header_is_negative(case: schemathesis.Case) -> bool:
    """Whether schemathesis broke the headers of this case on purpose (a missing or malformed
    Authorization): the token the test sends over them would make it look accepted."""
    components = case.meta.components if case.meta is not None else {}
    return any(
        location.value == "header" and info.mode.value == "negative"
        for location, info in components.items()
    )


@pytest.fixture
def token() -> str | None:
    """The server's TRAINCTL_API_TOKEN; a test parametrizes it to fuzz an open server too."""
    return TOKEN


@pytest.fixture
def target(tmp_path: Path, token: str | None) -> FuzzTarget:
    """The data is stored first, as by an earlier service process; the app's lifespan starts
    with schemathesis's first request and ends (schemathesis's pytest plugin) with the test."""
    settings = Settings(data_dir=tmp_path, workers=0, api_token=token)
    with RunStore(settings.db_url) as runs:
        runs.create_all()
        run_ids = seed(settings, runs, CheckpointStore(settings.checkpoint_dir))
    return FuzzTarget(create_app(settings), run_ids)


# One app per endpoint and mode, shared by that endpoint's generated requests.
SHARED_APP = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("token", [None, TOKEN], ids=["no-token-configured", "token-configured"])
@SHARED_APP
@ANONYMOUS.parametrize()
def test_requests_without_a_token_get_documented_answers_and_no_server_error(
    case: schemathesis.Case, target: FuzzTarget, token: str | None
) -> None:
    response = target.send(case, headers={})

    if token is not None and case.operation.path != "/healthz":
        # 401, or an answer given before authentication: no route (404), an unreadable body.
        assert response.status_code >= 400, f"{case.operation.label} answered without the token"


@SHARED_APP
@AUTHENTICATED.parametrize()
def test_requests_with_the_token_get_documented_answers_and_no_server_error(
    case: schemathesis.Case, target: FuzzTarget
) -> None:
    target.send(case, headers=BEARER)
