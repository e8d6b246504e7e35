"""Bearer tokens and their roles. Writes need a token; reads follow the read policy
(JOBSCOPE_READ_POLICY: open by default, api/visibility.py).

Static tokens are configured (`JOBSCOPE_ADMIN_TOKEN`, `JOBSCOPE_SCHEDULER_TOKEN`; `make up`
generates both into state/secrets.env) and compared in constant time; any other token must
be a signed one (api/infra/tokens.py) carrying its user and role, not revoked
(api/infra/revocations.py). A client address with too many failed authentications is refused
for a while (429, api/infra/limits.py: FailedLogins). Writes are authenticated before their
body is read (api/infra/limits.py: BodyGuard); the role is checked by each route's dependency.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any

from anyio import to_thread
from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.infra.config import ApiSettings
from api.infra.oidc import OidcVerifier, ProviderUnavailable, issuer_of, shown
from api.infra.revocations import NotLoaded
from api.infra.tokens import InvalidToken, Principal, Role, decode

__all__ = ["Principal", "Role", "principal", "reads_guard"]

MISSING = "missing bearer token (Authorization: Bearer ...)"
OPEN_READS = ("/health", "/metrics", "/api/auth/oidc")
"""Read under every policy: the API's health, its Prometheus metrics (counts by route
template: nothing of anyone's, api/infra/monitoring.py), and where to get a token (`jobscope
login`)."""

_CHALLENGE = {"WWW-Authenticate": "Bearer"}
_bearer = HTTPBearer(auto_error=False, description="a jobscope token (docs/access.md)")


def _static_role(settings: ApiSettings, token: str) -> Role | None:
    """The role of a configured static token, compared in constant time."""
    configured = ((settings.admin_token, Role.ADMIN), (settings.scheduler_token, Role.SCHEDULER))
    for known, role in configured:
        if known and hmac.compare_digest(known.get_secret_value().encode(), token.encode()):
            return role
    return None


def authenticate(state: Any, token: str, client: str) -> Principal:
    """Who `token` acts for, `state` being the app's: a static token acts as the user named
    after its role, a signed one as its `sub`. HTTPException 401 for anything else (unknown,
    bad signature, expired, revoked), counted against `client` (an address); 429 while
    `client` has failed too often; 503 while the revocation list is not loaded."""
    retry_after = state.failed_logins.retry_after(client)
    if retry_after:
        raise HTTPException(429, state.failed_logins.refusal(retry_after), _retry(retry_after))
    try:
        return _identify(state, token)
    except HTTPException as exc:
        if exc.status_code == 401:
            state.failed_logins.failed(client)
        raise


def _identify(state: Any, token: str) -> Principal:
    settings: ApiSettings = state.settings
    role = _static_role(settings, token)
    if role is not None:
        return Principal(role.value, role)
    issuer = issuer_of(token)
    if issuer is not None:  # jobscope's own tokens name no issuer
        return _from_provider(state, token, issuer)
    if settings.token_secret is None:
        raise HTTPException(401, "unknown token", _CHALLENGE)
    max_ttl = timedelta(days=settings.token_max_ttl_days)
    try:
        who = decode(settings.token_secret.get_secret_value(), token, max_ttl)
    except InvalidToken as exc:
        raise HTTPException(401, str(exc), _CHALLENGE) from None
    try:
        revoked = state.revocations.is_revoked(who.jti)
    except NotLoaded as exc:
        raise HTTPException(503, f"{exc}: try again shortly", _retry(1)) from None
    if revoked:
        raise HTTPException(401, f"token revoked (jti {who.jti})", _CHALLENGE)
    return who


def _from_provider(state: Any, token: str, issuer: str) -> Principal:
    """An OpenID Connect access token of the site's provider (api/infra/oidc.py)."""
    verifier: OidcVerifier | None = state.oidc
    if verifier is None or issuer != state.settings.oidc_issuer:
        refusal = f"tokens of issuer {shown(issuer)} are not accepted here"
        raise HTTPException(401, refusal, _CHALLENGE)
    try:
        return verifier.principal(token)
    except InvalidToken as exc:
        raise HTTPException(401, str(exc), _CHALLENGE) from None
    except ProviderUnavailable as exc:
        raise HTTPException(503, f"{exc}: try again shortly", _retry(5)) from None


def _retry(seconds: int) -> dict[str, str]:
    return {"Retry-After": str(seconds)}


def client_address(request: Request) -> str:
    return request.client.host if request.client else ""


def principal(*roles: Role) -> Callable[..., Principal]:
    """A dependency admitting a token of one of `roles` (admin always), returning who it acts
    for: 401 without a valid token, 403 with a token of another role."""

    def check(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Principal:
        who: Principal | None = getattr(request.state, "principal", None)  # from BodyGuard
        if who is None:
            if credentials is None:
                raise HTTPException(401, MISSING, _CHALLENGE)
            who = authenticate(request.app.state, credentials.credentials, client_address(request))
        if who.role is not Role.ADMIN and who.role not in roles:
            wanted = " or ".join(r.value for r in (*roles, Role.ADMIN))
            role = who.role.value
            raise HTTPException(403, f"a token with role {wanted} is required, not {role}")
        return who

    return check


async def reads_guard(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """An app-wide dependency, the entry of the read policy (api/visibility.py): under
    `authenticated` and `jobs` (JOBSCOPE_READ_POLICY), a read (GET) needs a valid token (401
    otherwise), whose principal is kept on `request.state` for the route (which filters what
    it answers by it); under `open` tokens are not looked at. OPEN_READS stay open. Writes
    check their own roles."""
    settings: ApiSettings = request.app.state.settings
    if settings.effective_read_policy == "open" or request.method not in ("GET", "HEAD"):
        return
    if request.url.path in OPEN_READS:
        return
    if credentials is None:
        raise HTTPException(401, "reads need a token here (Authorization: Bearer ...)", _CHALLENGE)
    # in a worker thread: a provider's keys may have to be read (api/infra/oidc.py)
    request.state.principal = await to_thread.run_sync(
        authenticate, request.app.state, credentials.credentials, client_address(request)
    )
