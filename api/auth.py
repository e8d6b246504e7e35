"""Bearer tokens and their roles. Writes need a token; reads are open.

The tokens are configured (`JOBSCOPE_ADMIN_TOKEN`, `JOBSCOPE_SCHEDULER_TOKEN`; `make up`
generates both into state/secrets.env) and compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.config import ApiSettings


class Role(StrEnum):
    ADMIN = "admin"
    SCHEDULER = "scheduler"


_bearer = HTTPBearer(auto_error=False, description="a jobscope token (see the README)")


def token_roles(settings: ApiSettings) -> list[tuple[str, Role]]:
    configured = ((settings.admin_token, Role.ADMIN), (settings.scheduler_token, Role.SCHEDULER))
    return [(token.get_secret_value(), role) for token, role in configured if token]


def role_of(settings: ApiSettings, token: str) -> Role | None:
    for known, role in token_roles(settings):
        if hmac.compare_digest(known.encode(), token.encode()):
            return role
    return None


def require(*roles: Role) -> Callable[..., Role]:
    """A dependency admitting a token of one of `roles` (admin always): 401 without a known
    token, 403 with a token of another role."""

    def check(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Role:
        challenge = {"WWW-Authenticate": "Bearer"}
        if credentials is None:
            raise HTTPException(401, "missing bearer token (Authorization: Bearer ...)", challenge)
        role = role_of(request.app.state.settings, credentials.credentials)
        if role is None:
            raise HTTPException(401, "unknown token", challenge)
        if role is not Role.ADMIN and role not in roles:
            wanted = " or ".join(r.value for r in (*roles, Role.ADMIN))
            raise HTTPException(403, f"a token with role {wanted} is required, not {role.value}")
        return role

    return check
