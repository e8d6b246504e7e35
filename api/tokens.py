"""Signed bearer tokens: HS256 JWTs with the claims `sub` (the user), `role`, `iat`, `exp`.

The key is `JOBSCOPE_TOKEN_SECRET` (`make up` generates it into state/secrets.env); anyone
holding it can mint tokens, so it stays with the API. `create_token` is what the admin
endpoint `POST /api/tokens` and the `jobscope token create` CLI call.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

import jwt

ALGORITHM = "HS256"
_CLAIMS = ["sub", "role", "exp", "iat"]


class Role(StrEnum):
    ADMIN = "admin"
    """Everything, including creating tokens and pushing for any device."""
    SCHEDULER = "scheduler"
    """Writes jobs (the scheduler hooks)."""
    PUSHER = "pusher"
    """Pushes readings for the nodes of the user's own running jobs."""
    READER = "reader"
    """Reads, where reads need a token (`JOBSCOPE_READS_NEED_TOKEN`)."""


@dataclass(frozen=True)
class Principal:
    """Who a request acts for: a token's user and role."""

    user: str
    role: Role


class InvalidToken(ValueError):
    """A token that is not ours, tampered with, malformed or expired; the message says which."""


def create_token(secret: str, user: str, role: Role | str, ttl: timedelta) -> str:
    """A token for `user` with `role`, valid for `ttl` from now."""
    if not user:
        raise ValueError("a token needs a user")
    if ttl <= timedelta(0):
        raise ValueError("a token's lifetime must be positive")
    now = datetime.now(UTC)
    claims = {"sub": user, "role": Role(role).value, "iat": now, "exp": now + ttl}
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def decode(secret: str, token: str) -> Principal:
    """The user and role of a valid token; InvalidToken otherwise."""
    try:
        claims = jwt.decode(token, secret, algorithms=[ALGORITHM], options={"require": _CLAIMS})
    except jwt.ExpiredSignatureError as exc:
        raise InvalidToken("token expired") from exc
    except jwt.InvalidSignatureError as exc:
        raise InvalidToken(f"invalid token ({exc})") from exc
    except jwt.DecodeError as exc:  # not a signed token at all: neither static nor ours
        raise InvalidToken("unknown token") from exc
    except jwt.InvalidTokenError as exc:
        raise InvalidToken(f"invalid token ({exc})") from exc
    try:
        return Principal(str(claims["sub"]), Role(claims["role"]))
    except ValueError as exc:
        raise InvalidToken(f"invalid token (unknown role {claims['role']!r})") from exc
