"""OpenID Connect access tokens of the site's provider (JOBSCOPE_OIDC_ISSUER), checked
without calling the provider per request: the signature against its published keys (JWKS,
cached; re-read when a token names a key not seen yet, at most every
JOBSCOPE_OIDC_JWKS_REFRESH_MIN_S, and whenever older than JOBSCOPE_OIDC_JWKS_CACHE_S, so a
rotation is picked up without restart and a retired key stops working), the issuer, the
audience, the expiry with a bounded clock skew. Its claims become a `Principal` as the
settings map them: the user, the projects (groups), the role (docs/access.md).

Refusals say why (expired, wrong audience, unknown key...) and never repeat the token.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx
import jwt

from api.infra.config import ApiSettings
from api.infra.tokens import InvalidToken, Principal, Role

log = logging.getLogger("jobscope.api")

STRONGEST_FIRST = (
    Role.ADMIN,
    Role.SUPPORT,
    Role.SCHEDULER,
    Role.PROJECT,
    Role.PUSHER,
    Role.AGENT,
    Role.USER,
)
"""A user with several roles at the provider acts with the first of these it has."""
_REQUIRED = ["exp", "iat", "iss", "aud"]
_MOST_CLAIM_CHARS = 64


class ProviderUnavailable(RuntimeError):
    """The provider's keys could not be read (and none are cached recently enough)."""


def issuer_of(token: str) -> str | None:
    """The `iss` claim of a JWT, unverified (only to choose who verifies it); None when the
    token is not a JWT or names no issuer (jobscope's own signed tokens have none)."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError:
        return None
    issuer = claims.get("iss")
    return issuer if isinstance(issuer, str) else None


def shown(value: str) -> str:
    """A claim from an unverified token, quoted and cut short: safe to put in a refusal."""
    return repr(value if len(value) <= _MOST_CLAIM_CHARS else value[:_MOST_CLAIM_CHARS] + "...")


class OidcVerifier:
    """The provider's keys, and the check of one access token against them."""

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._keys: dict[str, jwt.PyJWK] = {}
        self._read_at = float("-inf")
        self._tried_at = float("-inf")
        self._jwks_url = settings.oidc_jwks_url

    def principal(self, token: str) -> Principal:
        """Who the token acts for; InvalidToken saying why it is refused, ProviderUnavailable
        when the provider's keys cannot be read."""
        s = self.settings
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise InvalidToken("unknown token") from exc
        algorithm = header.get("alg")
        if algorithm not in s.oidc_algorithms:
            raise InvalidToken(
                f"token signed with algorithm {shown(str(algorithm))}, not one of "
                f"{', '.join(s.oidc_algorithms)} (JOBSCOPE_OIDC_ALGORITHMS)"
            )
        key = self._key(str(header.get("kid", "")))
        if key.algorithm_name != algorithm:
            raise InvalidToken(
                f"token signed with {algorithm}, its key is for {key.algorithm_name}"
            )
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=s.oidc_audience,
                issuer=s.oidc_issuer,
                leeway=s.oidc_leeway_s,
                options={"require": _REQUIRED},
            )
        except jwt.ExpiredSignatureError as exc:
            raise InvalidToken("token expired") from exc
        except jwt.InvalidAudienceError as exc:
            raise InvalidToken(f"token not for audience {s.oidc_audience!r}") from exc
        except jwt.MissingRequiredClaimError as exc:
            if exc.claim == "aud":
                raise InvalidToken(f"token not for audience {s.oidc_audience!r}") from exc
            raise InvalidToken(f"invalid token ({exc})") from exc
        except jwt.InvalidSignatureError as exc:
            raise InvalidToken(
                "invalid token (signature does not match the provider's key)"
            ) from exc
        except jwt.InvalidTokenError as exc:
            raise InvalidToken(f"invalid token ({exc})") from exc
        return self._mapped(claims)

    def _mapped(self, claims: dict[str, Any]) -> Principal:
        s = self.settings
        user = claims.get(s.oidc_user_claim)
        if not isinstance(user, str) or not user:
            raise InvalidToken(f"token has no user claim {s.oidc_user_claim!r}")
        groups = _strings(_claim(claims, s.oidc_projects_claim))
        projects = frozenset(g.removeprefix("/") for g in groups)
        theirs = _strings(_claim(claims, s.oidc_roles_claim))
        named = {s.oidc_role_map.get(r, r) for r in theirs}
        role = next((r for r in STRONGEST_FIRST if r.value in named), Role.USER)
        return Principal(user, role, str(claims.get("jti", "")), projects=projects)

    def _key(self, kid: str) -> jwt.PyJWK:
        """The key of this id: from the cache, or read again when the cache is old, or when
        the id is unknown and the keys were not read in the last refresh_min_s."""
        s = self.settings
        with self._lock:
            age = time.monotonic() - self._read_at
            if age > s.oidc_jwks_cache_s:
                self._keys = {}  # never a key past its cache time: refused, not trusted
                self._read_keys()
            elif kid not in self._keys and age > s.oidc_jwks_refresh_min_s:
                self._read_keys()
            if kid not in self._keys:
                raise InvalidToken(f"token signed by an unknown key (kid {shown(kid)})")
            return self._keys[kid]

    def _read_keys(self) -> None:
        """Read the keys; a provider that failed is asked again after refresh_min_s only."""
        s = self.settings
        since_tried = time.monotonic() - self._tried_at
        if since_tried < s.oidc_jwks_refresh_min_s and not self._keys:
            raise ProviderUnavailable("the provider's keys could not be read: try again shortly")
        self._tried_at = time.monotonic()
        try:
            if not self._jwks_url:
                discovery = _get_json(f"{s.oidc_issuer}/.well-known/openid-configuration", s)
                if discovery.get("issuer") != s.oidc_issuer:
                    raise ProviderUnavailable(
                        f"the discovery document names issuer {discovery.get('issuer')!r}, "
                        f"not {s.oidc_issuer!r}"
                    )
                self._jwks_url = str(discovery["jwks_uri"])
            document = _get_json(self._jwks_url, s)
            keys = jwt.PyJWKSet.from_dict(document).keys
        except (httpx.HTTPError, ValueError, KeyError, jwt.PyJWKSetError) as exc:
            raise ProviderUnavailable(f"the provider's keys could not be read: {exc}") from exc
        self._keys = {k.key_id: k for k in keys if k.key_id and k.public_key_use in (None, "sig")}
        self._read_at = time.monotonic()
        log.info("OIDC keys read from %s: %s", self._jwks_url, ", ".join(self._keys))


def _get_json(url: str, settings: ApiSettings) -> dict[str, Any]:
    response = httpx.get(url, timeout=settings.oidc_timeout_s)
    response.raise_for_status()
    document = response.json()
    if not isinstance(document, dict):
        raise ValueError(f"{url}: not a JSON object")
    return document


def _claim(claims: dict[str, Any], path: str) -> object:
    """A claim by its dotted path (`realm_access.roles`); None when absent."""
    value: object = claims
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
