"""Dependencies the routes declare: settings, the two stores, the checkpoint protection
policy, and who the caller is and what its token's scope allows (store/db/tokens.py).

The settings and the stores live on `app.state` (`create_app` and the lifespan put them
there); tests replace any of these with `app.dependency_overrides`. Every dependency here is
`async def` although none awaits: FastAPI runs a plain `def` dependency in the thread pool,
and those hand-offs were most of the cost of a cheap GET.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trainctl.service.settings import Settings
from trainctl.store.checkpoints.protection import ProtectionPolicy
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import RunStore
from trainctl.store.db.tokens import Principal, TokenStore
from trainctl.store.exceptions import Forbidden
from trainctl.store.vocabulary import Scope


async def get_app_settings(request: Request) -> Settings:
    # From app.state rather than a dependency override of get_settings: FastAPI re-inspects an
    # override's signature on every request, which cost about a quarter of a cheap GET.
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


async def get_runs(request: Request) -> RunStore:
    runs: RunStore = request.app.state.runs
    return runs


async def get_checkpoints(request: Request) -> CheckpointStore:
    ckpts: CheckpointStore = request.app.state.checkpoints
    return ckpts


async def get_exports(request: Request) -> CheckpointStore:
    exports: CheckpointStore = request.app.state.exports
    return exports


RunsDep = Annotated[RunStore, Depends(get_runs)]
CheckpointsDep = Annotated[CheckpointStore, Depends(get_checkpoints)]
ExportsDep = Annotated[CheckpointStore, Depends(get_exports)]


async def get_protection(runs: RunsDep, ckpts: CheckpointsDep) -> ProtectionPolicy:
    return ProtectionPolicy(runs, ckpts)


ProtectionDep = Annotated[ProtectionPolicy, Depends(get_protection)]

# auto_error=False: we answer a missing token ourselves, with 401 and a message (FastAPI's own
# answer differs between versions); declaring the scheme still documents it in OpenAPI.
_bearer = HTTPBearer(auto_error=False, description="TRAINCTL_API_TOKEN, when the server sets one.")


async def get_tokens(request: Request) -> TokenStore:
    tokens: TokenStore = request.app.state.tokens
    return tokens


async def authenticate(
    settings: SettingsDep,
    tokens: Annotated[TokenStore, Depends(get_tokens)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal | None:
    """Who sends the request; None when the service has no token (a loopback service: every
    request may do everything, and runs record no submitter)."""
    if settings.api_token is None:
        return None
    principal = tokens.identify(credentials.credentials) if credentials is not None else None
    if principal is None:
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong API token: send 'Authorization: Bearer <token>' with "
            "TRAINCTL_API_TOKEN or a token made with `trainctl tokens create`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


def requires(scope: Scope) -> Any:
    """A dependency that lets through only tokens whose scope allows `scope`."""

    async def check(
        principal: Annotated[Principal | None, Depends(authenticate)],
    ) -> Principal | None:
        if principal is not None and not principal.allows(scope):
            raise Forbidden(
                f"token {principal.name!r} has scope {principal.scope!r}; this needs "
                f"{scope!r} (ask an admin: trainctl tokens create NAME --scope {scope})"
            )
        return principal

    return Depends(check)


AUTH = requires("read")
"""Every route but /healthz: any valid token."""
Submitter = Annotated[Principal | None, requires("submit")]
Admin = Annotated[Principal | None, requires("admin")]
