"""POST /api/tokens: signed tokens for users (admin token only)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request

from api.auth import Principal, Role, principal
from api.errors import ParameterError
from api.params import iso
from api.schemas import ErrorBody, TokenCreated, TokenRequest
from api.scope import now
from api.tokens import create_token

router = APIRouter(prefix="/api", tags=["tokens"])


@router.post(
    "/tokens",
    operation_id="create_token",
    status_code=201,
    response_model=TokenCreated,
    responses={
        400: {"model": ErrorBody},
        401: {"model": ErrorBody},
        403: {"model": ErrorBody},
        503: {"model": ErrorBody, "description": "JOBSCOPE_TOKEN_SECRET is not set"},
    },
    summary="Create a signed token for a user and role (admin token)",
)
def post_token(
    request: Request, _admin: Annotated[Principal, Depends(principal())], asked: TokenRequest
) -> TokenCreated:
    """E.g. `{"user": "alice", "role": "pusher", "ttl_days": 30}`. The token is not stored:
    it stays valid until it expires or the secret changes."""
    secret = request.app.state.settings.token_secret
    if secret is None:
        raise HTTPException(503, "JOBSCOPE_TOKEN_SECRET is not set: no signed tokens")
    try:
        role = Role(asked.role)
    except ValueError:
        roles = ", ".join(r.value for r in Role)
        raise ParameterError("role", f"{asked.role!r} is not one of {roles}") from None
    ttl = timedelta(days=asked.ttl_days)
    expires = now() + ttl
    token = create_token(secret.get_secret_value(), asked.user, role, ttl)
    return TokenCreated(token=token, user=asked.user, role=role.value, expires_at=iso(expires))
