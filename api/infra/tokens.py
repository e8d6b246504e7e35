"""Signed bearer tokens: HS256 JWTs with the claims `sub` (the user), `role`, `iat`, `exp`
and `jti` (the token's id, by which it is revoked: api/infra/revocations.py), and optionally
`projects` (the projects whose jobs a `project` token reads: api/visibility.py) and `nodes`
(the nodes an `agent` token pushes for: api/push.py).

The key is `JOBSCOPE_TOKEN_SECRET` (`make up` generates it into state/secrets.env); anyone
holding it can mint tokens, so it stays with the API. `create_token` is what the admin
endpoint `POST /api/tokens` and the `jobscope token create` CLI call. A token living longer
than `max_ttl` (JOBSCOPE_TOKEN_MAX_TTL_DAYS) is refused, whenever it was signed: so a
revocation kept that long outlives the token it revokes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum

import jwt

ALGORITHM = "HS256"
_CLAIMS = ["sub", "role", "exp", "iat", "jti"]
MAX_LISTED = 1000
"""Most projects or nodes a token may carry."""
MAX_NAME_CHARS = 256
"""Longest project or node name in a token."""


class Role(StrEnum):
    ADMIN = "admin"
    """Everything, including creating tokens and pushing for any device."""
    SCHEDULER = "scheduler"
    """Writes jobs (the scheduler hooks)."""
    PUSHER = "pusher"
    """Pushes readings for the nodes of the user's own running jobs."""
    READER = "reader"
    """Reads (kept for older tokens): under the `jobs` read policy, its user's own jobs."""
    USER = "user"
    """Reads its user's own jobs (api/visibility.py)."""
    PROJECT = "project"
    """A PI or manager: reads its own jobs and those of its `projects`."""
    SUPPORT = "support"
    """Reads everything, writes nothing."""
    AGENT = "agent"
    """Pushes readings for the `nodes` of its token; reads nothing under the jobs policy."""


@dataclass(frozen=True)
class Principal:
    """Who a request acts for: a token's user and role, and the projects and nodes it names."""

    user: str
    role: Role
    jti: str = field(default="", compare=False)
    """The signed token's id ('' for a static token)."""
    projects: frozenset[str] = frozenset()
    """The projects (groups) the user belongs to or manages."""
    nodes: tuple[str, ...] = ()
    """An agent's nodes: the devices it pushes for."""


class InvalidToken(ValueError):
    """A token that is not ours, tampered with, malformed or expired; the message says which."""


def names(claim: str, value: object) -> tuple[str, ...]:
    """A token's list of project or node names: at most MAX_LISTED non-empty strings of at
    most MAX_NAME_CHARS each, in order, without repeats; ValueError naming `claim` otherwise."""
    if not isinstance(value, list | tuple) or len(value) > MAX_LISTED:
        raise ValueError(f"{claim} must be a list of at most {MAX_LISTED} names")
    for name in value:
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
            raise ValueError(
                f"{claim} must hold non-empty strings of at most {MAX_NAME_CHARS} characters"
            )
    return tuple(dict.fromkeys(value))


def create_token(
    secret: str,
    user: str,
    role: Role | str,
    ttl: timedelta,
    projects: Iterable[str] = (),
    nodes: Iterable[str] = (),
) -> str:
    """A token for `user` with `role`, valid for `ttl` from now, with a new random `jti`, and
    the `projects` and `nodes` claims when given."""
    if not user:
        raise ValueError("a token needs a user")
    if ttl <= timedelta(0):
        raise ValueError("a token's lifetime must be positive")
    now = datetime.now(UTC)
    claims: dict[str, object] = {
        "sub": user,
        "role": Role(role).value,
        "iat": now,
        "exp": now + ttl,
        "jti": uuid.uuid4().hex,
    }
    for claim, given in (("projects", list(projects)), ("nodes", list(nodes))):
        if given:
            claims[claim] = list(names(claim, given))
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def decode(secret: str, token: str, max_ttl: timedelta | None = None) -> Principal:
    """The user, role, id, projects and nodes of a valid token (living at most `max_ttl`);
    InvalidToken otherwise."""
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
        role = Role(claims["role"])
    except ValueError as exc:
        raise InvalidToken(f"invalid token (unknown role {claims['role']!r})") from exc
    try:
        projects = names("projects", claims.get("projects", []))
        nodes = names("nodes", claims.get("nodes", []))
    except ValueError as exc:
        raise InvalidToken(f"invalid token ({exc})") from exc
    return Principal(str(claims["sub"]), role, str(claims["jti"]), frozenset(projects), nodes)
