"""Signed bearer tokens: HS256 JWTs with the claims `sub` (the user), `role`, `iat`, `exp`
and `jti` (the token's id, by which it is revoked: api/revocations.py).

The key is `JOBSCOPE_TOKEN_SECRET` (`make up` generates it into state/secrets.env); anyone
holding it can mint tokens, so it stays with the API. `create_token` is what the admin
endpoint `POST /api/tokens` and the `jobscope token create` CLI call. A token living longer
than `max_ttl` (JOBSCOPE_TOKEN_MAX_TTL_DAYS) is refused, whenever it was signed: so a
revocation kept that long outlives the token it revokes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum

import jwt

ALGORITHM = "HS256"
_CLAIMS = ["sub", "role", "exp", "iat", "jti"]


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
    jti: str = field(default="", compare=False)
    """The signed token's id ('' for a static token)."""


class InvalidToken(ValueError):
    """A token that is not ours, tampered with, malformed or expired; the message says which."""


def create_token(secret: str, user: str, role: Role | str, ttl: timedelta) -> str:
    """A token for `user` with `role`, valid for `ttl` from now, with a new random `jti`."""
    if not user:
        raise ValueError("a token needs a user")
    if ttl <= timedelta(0):
        raise ValueError("a token's lifetime must be positive")
    now = datetime.now(UTC)
    claims = {
        "sub": user,
        "role": Role(role).value,
        "iat": now,
        "exp": now + ttl,
        "jti": uuid.uuid4().hex,
    }
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def decode(secret: str, token: str, max_ttl: timedelta | None = None) -> Principal:
    """The user, role and id of a valid token (living at most `max_ttl`); InvalidToken
    otherwise."""
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
    if max_ttl is not None and claims["exp"] - claims["iat"] > max_ttl.total_seconds():
        days = max_ttl.total_seconds() / 86400
        raise InvalidToken(f"token lives longer than {days:g} days (JOBSCOPE_TOKEN_MAX_TTL_DAYS)")
    try:
        return Principal(str(claims["sub"]), Role(claims["role"]), str(claims["jti"]))
    except ValueError as exc:
        raise InvalidToken(f"invalid token (unknown role {claims['role']!r})") from exc
