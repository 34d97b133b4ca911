"""Dependencies the routes declare: settings, the two stores, the checkpoint protection
policy, and the bearer-token check.

The settings and the stores live on `app.state` (`create_app` and the lifespan put them
there); tests replace any of these with `app.dependency_overrides`. Every dependency here is
`async def` although none awaits: FastAPI runs a plain `def` dependency in the thread pool,
and those hand-offs were most of the cost of a cheap GET.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trainctl.service.settings import Settings
from trainctl.store.checkpoints import CheckpointStore
from trainctl.store.protection import ProtectionPolicy
from trainctl.store.runs import RunStore


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


RunsDep = Annotated[RunStore, Depends(get_runs)]
CheckpointsDep = Annotated[CheckpointStore, Depends(get_checkpoints)]


async def get_protection(runs: RunsDep, ckpts: CheckpointsDep) -> ProtectionPolicy:
    return ProtectionPolicy(runs, ckpts)


ProtectionDep = Annotated[ProtectionPolicy, Depends(get_protection)]

# auto_error=False: we answer a missing token ourselves, with 401 and a message (FastAPI's own
# answer differs between versions); declaring the scheme still documents it in OpenAPI.
_bearer = HTTPBearer(auto_error=False, description="TRAINCTL_API_TOKEN, when the server sets one.")


async def require_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Let the request through if no token is configured or it carries the right one."""
    if settings.api_token is None:
        return
    expected = settings.api_token.get_secret_value().encode()
    given = credentials.credentials.encode() if credentials is not None else b""
    # compare_digest: the time taken must not reveal how much of the token was right.
    if credentials is None or not hmac.compare_digest(given, expected):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong API token: send 'Authorization: Bearer <TRAINCTL_API_TOKEN>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


AUTH = Depends(require_token)
