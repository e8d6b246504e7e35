"""Signed tokens for users (admin token only): `POST /api/tokens` creates one,
`DELETE /api/tokens/{jti}` revokes one for every API replica (api/infra/revocations.py)."""

from __future__ import annotations

import time
from datetime import UTC, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Request

from api.infra import revocations
from api.infra.auth import Principal, Role, principal
from api.infra.errors import ParameterError
from api.infra.params import iso
from api.infra.tokens import create_token, names
from api.schemas import ErrorBody, TokenCreated, TokenRequest, TokenRevoked
from api.scope import now

router = APIRouter(prefix="/api", tags=["tokens"])

Admin = Annotated[Principal, Depends(principal())]


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
def post_token(request: Request, _admin: Admin, asked: TokenRequest) -> TokenCreated:
    """E.g. `{"user": "alice", "role": "pusher", "ttl_days": 30}`; `projects` (a `project`
    token's) and `nodes` (an `agent` token's) are optional lists. The token is not stored:
    it stays valid until it expires, is revoked (its `jti`), or the secret changes. A
    lifetime over JOBSCOPE_TOKEN_MAX_TTL_DAYS is refused (400)."""
    settings = request.app.state.settings
    secret = settings.token_secret
    if secret is None:
        raise HTTPException(503, "JOBSCOPE_TOKEN_SECRET is not set: no signed tokens")
    try:
        role = Role(asked.role)
    except ValueError:
        roles = ", ".join(r.value for r in Role)
        raise ParameterError("role", f"{asked.role!r} is not one of {roles}") from None
    if asked.ttl_days > settings.token_max_ttl_days:
        raise ParameterError(
            "ttl_days",
            f"{asked.ttl_days:g} days is over the longest lifetime, "
            f"{settings.token_max_ttl_days:g} days (JOBSCOPE_TOKEN_MAX_TTL_DAYS)",
        )
    ttl = timedelta(days=asked.ttl_days)
    expires = now() + ttl
    for claim, listed in (("projects", asked.projects), ("nodes", asked.nodes)):
        try:
            names(claim, listed)
        except ValueError as exc:
            raise ParameterError(claim, str(exc)) from None
    token = create_token(
        secret.get_secret_value(), asked.user, role, ttl, asked.projects, asked.nodes
    )
    return TokenCreated(token=token, user=asked.user, role=role.value, expires_at=iso(expires))


@router.delete(
    "/tokens/{jti}",
    operation_id="revoke_token",
    response_model=TokenRevoked,
    responses={
        401: {"model": ErrorBody},
        403: {"model": ErrorBody},
        503: {"model": ErrorBody, "description": "Kafka did not take the revocation"},
    },
    summary="Revoke a signed token by its id, on every API replica (admin token)",
)
def revoke_token(
    request: Request,
    admin: Admin,
    jti: Annotated[str, Path(min_length=1, max_length=128, description="the token's `jti`")],
) -> TokenRevoked:
    """Every replica refuses the token within about a second (this one at once). The
    revocation is kept for JOBSCOPE_TOKEN_MAX_TTL_DAYS, longer than any token can live.
    Revoking an id twice is harmless."""
    app = request.app.state
    settings = app.settings
    revoked_at = now()
    kept_until = revoked_at + timedelta(days=settings.token_max_ttl_days)
    expires_at = kept_until.replace(tzinfo=UTC).timestamp()
    value = revocations.message(jti, expires_at, time.time(), admin.user)
    app.kafka.publish(settings.revocations_topic, jti, value)
    app.revocations.add(jti, expires_at)
    return TokenRevoked(jti=jti, revoked_by=admin.user, kept_until=iso(kept_until))
