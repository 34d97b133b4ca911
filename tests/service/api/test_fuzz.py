"""Fuzzing: schemathesis runs every check it has (the CLI's `--checks all`) against the live
service, with requests generated from the committed schema (openapi/openapi.json).

Each endpoint is fuzzed against a real uvicorn server on a free port, serving a fresh app on a
temporary data dir: a real SQLite store, no worker processes, a few fabricated checkpoints and
runs, so that paths naming real runs, checkpoints and files are exercised as well as random
ones. It runs three ways: no token configured; a token configured and sent; a token
configured and not sent, where schemathesis also generates wrong and missing tokens (every
endpoint but /healthz must then refuse, with its documented 401). Then schemathesis's
stateful phase chains calls (submit, then read the run) against one more server.

Generation is deterministic and bounded (MAX_EXAMPLES). Where a check is left out or
narrowed, EXCLUDED and `semantic_refusals_only` say why. `pytest -s` prints how many requests
were checked in each mode.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import CHECKS, CheckContext, load_all_checks

from tests.service.fakes import finish, save_checkpoint
from tests.service.serving import serve
from tests.support.soak import SOAK
from tests.support.stores import dataset_store, posix_store
from trainctl.service.app import create_app
from trainctl.service.openapi import OPENAPI_FILE
from trainctl.service.routes.runs import CURSOR_FORMAT
from trainctl.service.settings import Settings
from trainctl.service.submit import submit_run
from trainctl.store.checkpoints.manifests import (
    MANIFEST_FILE,
    METADATA_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
)
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import Conflict, NotFound
from trainctl.store.kinds.benchmark import BenchmarkRequest
from trainctl.store.kinds.registry import RUN_KINDS
from trainctl.store.kinds.train import TrainRequest
from trainctl.store.kinds.validate import ValidateRequest
from trainctl.store.vocabulary import SWEEP_NAME, RunState

# Four fuzzers of a few hundred requests each, a server each: minutes, not the edit loop's.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
# make test's budget (20 minutes on 2 cores) holds 10 per endpoint and mode (about 130 s of the
# fuzzer's 270 at 25); `make soak` generates ten times as many.
MAX_EXAMPLES = 100 if SOAK else 10
"""Generated requests per endpoint and mode, on top of schemathesis's boundary-value cases."""

TOKEN = "fuzz-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
# Every route that resolves run requests: one per kind, and the sweep of forks.
SUBMITS = {f"/runs/{kind}" for kind in RUN_KINDS.names()} | {f"/runs/{SWEEP_NAME}"}

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
    runs.workers.register("fuzz-worker", host="fuzz", pid=1, device="cpu", info={"cores": 2})
    exports = posix_store(settings.layout.exports)
    datasets = dataset_store(settings.data_dir)
    ctx: dict[str, Any] = {"settings": settings, "runs": runs, "ckpts": ckpts, "exports": exports,
                           "datasets": datasets}  # fmt: skip

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


# --- what schemathesis generates -------------------------------------------------------------


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


def cursor(created_at: datetime, seq: int) -> str:
    """A page cursor as the server writes one (store.db.runs): the last run's position."""
    raw = json.dumps([created_at.isoformat(), seq]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# The schema names the cursor's format rather than spelling it out (no pattern can say "only
# what the server wrote"); this is that format, so that valid cursors are generated too.
schemathesis.openapi.format(
    CURSOR_FORMAT,
    st.builds(
        cursor,
        st.datetimes(datetime(2000, 1, 1), datetime(2100, 1, 1), timezones=st.just(UTC)),
        st.integers(0, 2**63 - 1),
    ),
)


def build_schema(*, with_auth: bool) -> schemathesis.BaseSchema:
    """The committed schema (test_openapi checks that it is the app's); requests go to each
    test's server. `with_auth`: generate `Authorization` headers, right-looking and missing;
    the test sends no token of its own over them."""
    schema = schemathesis.openapi.from_path(REPO / OPENAPI_FILE)
    schema.config.generation.update(
        max_examples=MAX_EXAMPLES, deterministic=True, with_security_parameters=with_auth
    )
    # A safety net only: every stream the fuzzer can open ends (see `real_path_parameters`).
    schema.config.update(request_timeout=10)
    schema.hook(before_generate_path_parameters)
    schema.hook(before_generate_body)
    return schema


OPEN = build_schema(with_auth=False)
GUESSING = build_schema(with_auth=True)

# --- the checks ------------------------------------------------------------------------------

load_all_checks()
ALL_CHECKS: dict[str, Callable[..., Any]] = {check.__name__: check for check in CHECKS.get_all()}


def semantic_refusals_only(ctx: CheckContext, response: Any, case: schemathesis.Case) -> None:
    """`positive_data_acceptance`, less the refusals that JSON Schema cannot state.

    - A run request valid by the schema is still refused (422) when it breaks a rule across
      fields (warmup_frac + stable_frac above 1, a seq_len above the model's, paths with the
      stdlib source) or one that depends on the server (nnodes > 1 on SQLite, more GPUs per
      node than TRAINCTL_MAX_GPUS_PER_NODE, no checkpoint yet to validate or resume, a preset
      or model field the registry does not know). Such refusals
      come from a validator (pydantic type `value_error`) or from the plan (no `errors`). A
      rule the schema states (a type, a bound, a pattern, a required or unknown field) must
      never refuse a request the schema allows.
    - A webhook URL naming an address the server's policy refuses (link-local, reserved,
      a cloud metadata service's: service/webhooks/targets.py) is a 422 that names
      TRAINCTL_WEBHOOK_ALLOWED_HOSTS, the setting that could allow it.
    - A list cursor is only one the server wrote: the schema names its format
      (`trainctl-cursor`), which the fuzzing phase generates (see `cursor`), but schemathesis's
      boundary values (`?cursor=0`) follow its pattern alone.
    """
    positive = case.meta is not None and case.meta.generation.mode.is_positive
    if response.status_code == 422 and positive:
        detail = response.json()["detail"]
        if case.operation.path == "/runs" and detail.startswith("invalid cursor "):
            return
        if case.operation.path == "/webhooks" and "TRAINCTL_WEBHOOK_ALLOWED_HOSTS" in detail:
            return
        if case.operation.path in SUBMITS:
            stated = [e for e in response.json().get("errors", []) if e["type"] != "value_error"]
            assert not stated, f"a schema-valid {case.operation.label} was refused: {stated}"
            return
    ALL_CHECKS["positive_data_acceptance"](ctx, response, case)


EXCLUDED = {
    # Replaced by `semantic_refusals_only`: the same check, less the refusals it names.
    "positive_data_acceptance": "see semantic_refusals_only",
}
EXCLUDED_WITHOUT_A_TOKEN = {
    **EXCLUDED,
    # The schema states what a server with TRAINCTL_API_TOKEN requires; a server without one
    # is open by design (docs/api.md), so every endpoint answering without a token is right.
    "ignored_auth": "the server has no token to enforce",
}


def checks_for(excluded: dict[str, str]) -> list[Callable[..., Any]]:
    kept = [check for name, check in ALL_CHECKS.items() if name not in excluded]
    return [*kept, semantic_refusals_only]


# --- fixtures and the tests ------------------------------------------------------------------

SENT: Counter[str] = Counter()
"""Requests checked, by mode; schemathesis's probes (ignored_auth's and others) not counted."""


@pytest.fixture(scope="module", autouse=True)
def report_requests_sent() -> Iterator[None]:
    yield
    print(f"\nschemathesis: requests checked, by mode: {dict(SENT)}")


@dataclass
class LiveService:
    url: str
    run_ids: dict[str, str]
    runs: RunStore
    """The server's run database, opened by the test too."""

    def send(
        self, case: schemathesis.Case, mode: str, headers: dict[str, str], excluded: dict[str, str]
    ) -> schemathesis.Response:
        """Swap the real run id in for a placeholder, send the case, check the answer."""
        ref = (case.path_parameters or {}).get("run_id")
        for state, run_id in self.run_ids.items():
            if ref == RUN_REF.format(state):
                case.path_parameters["run_id"] = run_id
        SENT[mode] += 1
        # A new connection per request: a kept-alive one to a server thread of this process
        # waits about 40 ms per request (delayed ACKs), which made the module take minutes.
        return case.call_and_validate(
            base_url=self.url, headers=headers, checks=checks_for(excluded)
        )


@pytest.fixture
def token() -> str | None:
    """The server's TRAINCTL_API_TOKEN; a test parametrizes it to fuzz an open server too."""
    return TOKEN


@contextmanager
def live_service(data_dir: Path, token: str | None) -> Iterator[LiveService]:
    """The data is stored first, as by an earlier service process; then uvicorn serves it."""
    settings = Settings(data_dir=data_dir, workers=0, api_token=token)
    with RunStore(settings.db_url) as runs:
        runs.create_all()
        run_ids = seed(settings, runs, posix_store(settings.checkpoint_dir))
    with serve(create_app(settings)) as url, RunStore(settings.db_url) as runs:
        yield LiveService(url, run_ids, runs)


@pytest.fixture
def service(tmp_path: Path, token: str | None) -> Iterator[LiveService]:
    with live_service(tmp_path, token) as live:
        yield live


# One server per endpoint and mode, shared by that endpoint's generated requests.
SHARED_SERVER = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("token", [None], ids=["no-token-configured"])
@SHARED_SERVER
@OPEN.parametrize()
def test_an_open_server_gives_documented_answers(
    case: schemathesis.Case, service: LiveService, token: None
) -> None:
    service.send(case, "no token configured", {}, EXCLUDED_WITHOUT_A_TOKEN)


@SHARED_SERVER
@OPEN.parametrize()
def test_requests_with_the_token_get_documented_answers(
    case: schemathesis.Case, service: LiveService
) -> None:
    service.send(case, "token sent", BEARER, EXCLUDED)


@SHARED_SERVER
@GUESSING.parametrize()
def test_requests_without_the_token_are_refused_with_a_documented_401(
    case: schemathesis.Case, service: LiveService
) -> None:
    response = service.send(case, "token not sent", {}, EXCLUDED)

    if case.operation.path != "/healthz":
        # 401, or an answer given before authentication: no route (404), an unreadable body.
        assert response.status_code >= 400, f"{case.operation.label} answered without the token"


def test_sequences_of_calls_get_documented_answers(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Schemathesis's stateful phase: calls chained by the links it infers from the schema
    (submit, then read, cancel or follow the run; list checkpoints, then read or delete one).

    Each sequence gets a server of its own, freshly seeded: which calls a sequence can make
    depends on what earlier ones left (a deleted checkpoint, an active train run), and
    Hypothesis needs a sequence it replays to meet the same state.
    """
    schema = schemathesis.openapi.from_path(REPO / OPENAPI_FILE)
    schema.config.update(request_timeout=10)
    schema.config.generation.update(deterministic=True)

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]  # made at run time
        def setup(self) -> None:
            self.serving = live_service(tmp_path_factory.mktemp("sequence"), TOKEN)
            self.service = self.serving.__enter__()

        def teardown(self) -> None:
            self.serving.__exit__(None, None, None)

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"base_url": self.service.url, "headers": BEARER}

        def before_call(self, case: schemathesis.Case) -> None:
            # A run's event stream ends when the run does, and no worker runs the runs this
            # test submits: cancel a queued one first, as a user would, so that it ends.
            run_id = (case.path_parameters or {}).get("run_id")
            if case.operation.path.endswith("/events") and isinstance(run_id, str):
                with suppress(NotFound, Conflict):
                    self.service.runs.request_cancel(run_id)

        def validate_response(
            self, response: Any, case: schemathesis.Case, *args: Any, **kwargs: Any
        ) -> None:
            SENT["stateful, token sent"] += 1
            case.validate_response(
                response, checks=checks_for(EXCLUDED), headers=BEARER, transport_kwargs=kwargs
            )

    Workflow.run(
        settings=settings(
            max_examples=MAX_EXAMPLES, stateful_step_count=6, derandomize=True, deadline=None
        )
    )
