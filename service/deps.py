"""Dependencies the routes declare: settings, the stores, the checkpoint protection
policy, and who the caller is and what its token's scope allows (docs/design/access.md,
"Admission and access").

The settings and the stores live on `app.state` (`create_app` and the lifespan put them
there); tests replace any of these with `app.dependency_overrides`. Every dependency here is
`async def`: FastAPI runs a plain `def` dependency in the thread pool, and those hand-offs
were most of the cost of a cheap GET; none may block the event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.dependencies.models import Dependant
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trainctl.service.limits import Slots, StreamSlots
from trainctl.service.settings import Settings
from trainctl.service.sse import EventFeed
from trainctl.store.checkpoints.protection import ProtectionPolicy
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.bucket import DatasetStore
from trainctl.store.db.outages import StallWatch
from trainctl.store.db.records import is_whole_run_id
from trainctl.store.db.runs import RunStore
from trainctl.store.db.tokens import Principal, TokenStore
from trainctl.store.db.workers import WorkerStore
from trainctl.store.exceptions import Forbidden
from trainctl.store.vocabulary import SCOPES, SHORT_ID_LENGTH, Scope


async def get_app_settings(request: Request) -> Settings:
    # From app.state rather than a dependency override of get_settings: FastAPI re-inspects an
    # override's signature on every request, which cost about a quarter of a cheap GET.
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


async def get_runs(request: Request) -> RunStore:
    """The run store; a 503 at once while the database does not answer (`StallWatch`)."""
    check_database(request)
    runs: RunStore = request.app.state.runs
    return runs


def check_database(request: Request) -> None:
    watch: StallWatch | None = getattr(request.app.state, "database_watch", None)
    if watch is not None:
        watch.check()


async def get_checkpoints(request: Request) -> CheckpointStore:
    ckpts: CheckpointStore = request.app.state.checkpoints
    return ckpts


async def get_exports(request: Request) -> CheckpointStore:
    exports: CheckpointStore = request.app.state.exports
    return exports


async def get_datasets(request: Request) -> DatasetStore:
    """The prepared datasets: the data dir's, or the bucket's."""
    datasets: DatasetStore = request.app.state.datasets
    return datasets


RunsDep = Annotated[RunStore, Depends(get_runs)]


async def get_workers(runs: RunsDep) -> WorkerStore:
    """The worker registry, in the run database (`RunStore.workers`): an override of
    `get_runs` reaches it too."""
    return runs.workers


WorkersDep = Annotated[WorkerStore, Depends(get_workers)]
CheckpointsDep = Annotated[CheckpointStore, Depends(get_checkpoints)]
ExportsDep = Annotated[CheckpointStore, Depends(get_exports)]
DatasetsDep = Annotated[DatasetStore, Depends(get_datasets)]


async def get_protection(runs: RunsDep, ckpts: CheckpointsDep) -> ProtectionPolicy:
    return ProtectionPolicy(runs, ckpts)


ProtectionDep = Annotated[ProtectionPolicy, Depends(get_protection)]


async def resolve_run_id(
    run_id: Annotated[
        str,
        Path(
            description=f"The run's id, or its first {SHORT_ID_LENGTH} characters or more "
            "(its short id)."
        ),
    ],
    runs: RunsDep,
) -> str:
    """The `{run_id}` of a path as the run's whole id (RunStore.resolve_id), for every route
    of one run: a short id works wherever an id does."""
    if is_whole_run_id(run_id):
        return run_id  # it names no other run; the route's own read says whether it exists
    return await run_in_threadpool(runs.resolve_id, run_id)


RunId = Annotated[str, Depends(resolve_run_id)]


async def hold_store_slot(request: Request) -> AsyncIterator[None]:
    """A slot of the store's for the whole request, its download streamed to the end too
    (a dependency's exit runs after the response is sent): service/limits.py."""
    slots: Slots = request.app.state.store_slots
    await slots.take()
    try:
        yield
    finally:
        slots.give()


STORE_SLOT = Depends(hold_store_slot)
"""On every route that reads or writes the checkpoint or export store."""

# auto_error=False: we answer a missing token ourselves, with 401 and a message (FastAPI's own
# answer differs between versions); declaring the scheme still documents it in OpenAPI.
_bearer = HTTPBearer(auto_error=False, description="TRAINCTL_API_TOKEN, when the server sets one.")


async def get_tokens(request: Request) -> TokenStore:
    tokens: TokenStore = request.app.state.tokens
    return tokens


PRINCIPAL_KEY = "trainctl.principal"
"""Where `authenticate` keeps the request's principal, in the ASGI scope."""


async def identify(request: Request, token: str) -> Principal | None:
    """Who holds `token`: from the store's cache on the event loop, else by a query in a
    worker thread, so that no lookup of the run database ever blocks the loop."""
    tokens: TokenStore = request.app.state.tokens
    if (known := tokens.recall(token)) is not None:
        return known
    check_database(request)
    return await run_in_threadpool(tokens.identify, token)


async def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal | None:
    """Who sends the request; None when the service has no token (a loopback service: every
    request may do everything, and runs record no submitter). Asked once per request: the
    route asks first, before it reads the body (`authorize`), and keeps the answer."""
    settings: Settings = request.app.state.settings
    if settings.api_token is None:
        return None
    if (known := request.scope.get(PRINCIPAL_KEY)) is not None:
        principal: Principal = known
        return principal
    found = None
    if credentials is not None:
        found = await identify(request, credentials.credentials)
    if found is None:
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong API token: send 'Authorization: Bearer <token>' with "
            "TRAINCTL_API_TOKEN or a token made with `trainctl tokens create`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    request.scope[PRINCIPAL_KEY] = found
    return found


def check_scope(principal: Principal | None, scope: Scope) -> None:
    if principal is not None and not principal.allows(scope):
        raise Forbidden(
            f"token {principal.name!r} has scope {principal.scope!r}; this needs "
            f"{scope!r} (ask an admin: trainctl tokens create NAME --scope {scope})"
        )


def requires(scope: Scope) -> Any:
    """A dependency that lets through only tokens whose scope allows `scope`."""

    async def check(
        principal: Annotated[Principal | None, Depends(authenticate)],
    ) -> Principal | None:
        check_scope(principal, scope)
        return principal

    check.required_scope = scope  # type: ignore[attr-defined]  # read by required_scope
    return Depends(check)


def required_scope(dependant: Dependant) -> Scope | None:
    """The widest scope a route's dependencies require (None: the route is open), so that
    the route checks it before it reads anything of the request but its headers."""
    found: list[Scope] = []

    def walk(node: Dependant) -> None:
        if (needed := getattr(node.call, "required_scope", None)) is not None:
            found.append(needed)
        for sub in node.dependencies:
            walk(sub)

    walk(dependant)
    return max(found, key=SCOPES.index) if found else None


async def authorize(request: Request, scope: Scope) -> None:
    """401 or 403 unless the request's token allows `scope`: the first thing a route does
    (service/routing.py), before it reads the query or the body."""
    check_scope(await authenticate(request, await _bearer(request)), scope)


async def hold_stream_slot(
    request: Request,
    principal: Annotated[Principal | None, Depends(authenticate)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> AsyncIterator[str | None]:
    """A slot among the open event streams, of the token's share and of all, for as long
    as the stream lasts (429, 503 beyond: service/limits.py); gives the stream its token,
    which it checks again while it lasts (service/sse.py)."""
    slots: StreamSlots = request.app.state.stream_slots
    name = principal.name if principal is not None else None
    slots.take(name)
    try:
        yield credentials.credentials if principal is not None and credentials else None
    finally:
        slots.give(name)


StreamToken = Annotated[str | None, Depends(hold_stream_slot)]


async def get_event_feed(request: Request) -> EventFeed:
    feed: EventFeed = request.app.state.event_feed
    return feed


EventFeedDep = Annotated[EventFeed, Depends(get_event_feed)]

AUTH = requires("read")
"""Every route but /healthz: any valid token."""
Submitter = Annotated[Principal | None, requires("submit")]
Admin = Annotated[Principal | None, requires("admin")]
