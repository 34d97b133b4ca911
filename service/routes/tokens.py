"""API tokens: create, list, revoke (admin only; store/db/tokens.py says who may do what;
docs/design/access.md, "Admission and access", "Access")."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, status

from trainctl.service.deps import Admin, get_tokens, requires
from trainctl.service.errors import error_responses
from trainctl.service.routing import ApiRoute, name_in_path
from trainctl.service.schemas import TokenCreate, TokenCreated, TokenPublic, TokensPublic
from trainctl.store.db.tokens import TokenStore

router = APIRouter(
    route_class=ApiRoute,
    prefix="/tokens",
    tags=["tokens"],
    dependencies=[requires("admin")],
    responses=error_responses(403, 422, 503),
)
TokensDep = Annotated[TokenStore, Depends(get_tokens)]
TokenName = Annotated[str, name_in_path("The token's name")]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=TokenCreated,
    responses=error_responses(400, 409, 413),  # 400, 413: a body unreadable or too large
)
def create_token(body: TokenCreate, tokens: TokensDep, admin: Admin) -> TokenCreated:
    """Create a token; the answer holds the token itself, shown this once."""
    token, record = tokens.create(body.name, body.scope, admin.name if admin else None)
    return TokenCreated(**vars(record), token=token)


@router.get("", response_model=TokensPublic)
def list_tokens(tokens: TokensDep) -> TokensPublic:
    """List the tokens an admin created (never the tokens themselves)."""
    return TokensPublic(items=[TokenPublic.model_validate(t) for t in tokens.list_tokens()])


@router.delete("/{name}", response_model=TokenPublic, responses=error_responses(404))
def revoke_token(name: TokenName, tokens: TokensDep) -> TokenPublic:
    """Revoke a token: requests with it are refused from now on."""
    return TokenPublic.model_validate(tokens.revoke(name))
