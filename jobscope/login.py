"""`jobscope login` and `logout`: a token from the site's OpenID Connect provider through the
device authorization grant (RFC 8628), stored per API URL (jobscope/credentials.py) and
refreshed when it is about to expire.

The API names its provider (`GET /api/auth/oidc`: issuer, public client, audience) and the
provider its endpoints (`<issuer>/.well-known/openid-configuration`): the user gives nothing
but the API's address. The user opens the printed address in any browser, on any machine,
while the command polls the provider's token endpoint at the pace the provider asks.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Generator
from typing import Any

import httpx

from jobscope import credentials
from jobscope.credentials import Login
from jobscope.errors import ApiError

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
REFRESH_MARGIN_S = 30.0
"""A stored access token expiring within this is refreshed before it is sent."""
SLOW_DOWN_S = 5
"""RFC 8628 §3.5: each `slow_down` answer adds this to the polling interval."""
TIMEOUT_S = 30.0


def provider(api: str) -> dict[str, Any]:
    """The API's provider (issuer, client_id, audience) and the provider's endpoints."""
    site = _get(f"{credentials.key(api)}/api/auth/oidc", "the jobscope API")
    issuer = str(site["issuer"]).rstrip("/")
    found = _get(f"{issuer}/.well-known/openid-configuration", "the identity provider")
    if str(found.get("issuer", "")).rstrip("/") != issuer:
        raise ApiError(f"the provider at {issuer} calls itself {found.get('issuer')!r}")
    if "device_authorization_endpoint" not in found:
        raise ApiError(f"the provider at {issuer} offers no device authorization grant")
    return {**found, "issuer": issuer, "client_id": site["client_id"], "audience": site["audience"]}


def login(api: str, tell: Callable[[str], None]) -> Login:
    """Log in through the device grant, `tell` showing the user where to approve it; the
    login is stored for `api`, and returned."""
    site = provider(api)
    asked = _post(
        site["device_authorization_endpoint"], {"client_id": site["client_id"], "scope": "openid"}
    )
    if "verification_uri_complete" in asked:
        tell(f"To log in, open {asked['verification_uri_complete']}")
        tell(f"(or open {asked['verification_uri']} and enter the code {asked['user_code']})")
    else:
        tell(f"To log in, open {asked['verification_uri']} and enter the code {asked['user_code']}")
    tokens, asked_at = _await_approval(site, asked)
    stored = _login(site, tokens, asked_at)
    said = claims(stored.access_token)
    audience = said.get("aud", [])
    if said and site["audience"] not in (audience if isinstance(audience, list) else [audience]):
        raise ApiError(
            f"the provider's token is not meant for this API (audience {audience!r}, not "
            f"{site['audience']!r}): its admin must add the audience to client {site['client_id']}"
        )
    with credentials.edit() as logins:
        logins[credentials.key(api)] = stored
    return stored


def _await_approval(site: dict[str, Any], asked: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """Poll the token endpoint until the user approves (the tokens, and when they were asked
    for), denies, or the code expires."""
    interval = float(asked.get("interval", 5))
    deadline = time.monotonic() + float(asked.get("expires_in", 600))
    form = {
        "grant_type": DEVICE_GRANT,
        "device_code": asked["device_code"],
        "client_id": site["client_id"],
    }
    while time.monotonic() < deadline:
        time.sleep(interval)  # RFC 8628 §3.4: the provider sets the pace
        asked_at = time.time()
        answer = _token_request(site["token_endpoint"], form)
        error = answer.get("error")
        if error is None:
            return answer, asked_at
        if error == "slow_down":
            interval += SLOW_DOWN_S
        elif error == "access_denied":
            raise ApiError("the login was denied at the provider")
        elif error == "expired_token":
            break
        elif error != "authorization_pending":
            raise ApiError(f"the provider refused the login: {_describe(answer)}")
    raise ApiError("the login code expired before it was approved: run `jobscope login` again")


def token(api: str) -> str | None:
    """The access token stored for `api`, refreshed first if it expires within
    REFRESH_MARGIN_S; None when nobody logged in to it."""
    stored = credentials.lookup(api)
    if stored is None or stored.expires_at - time.time() > REFRESH_MARGIN_S:
        return stored.access_token if stored else None
    with credentials.edit() as logins:  # another command may have refreshed meanwhile
        stored = logins.get(credentials.key(api))
        if stored is None:
            return None
        if stored.expires_at - time.time() <= REFRESH_MARGIN_S:
            stored = logins[credentials.key(api)] = _refresh(api, stored)
        return stored.access_token


def _refresh(api: str, stored: Login) -> Login:
    if stored.refresh_expires_at and stored.refresh_expires_at <= time.time():
        raise ApiError(f"your login to {api} has expired: run `jobscope --api {api} login`")
    form = {
        "grant_type": "refresh_token",
        "refresh_token": stored.refresh_token,
        "client_id": stored.client_id,
    }
    now = time.time()
    answer = _token_request(stored.token_endpoint, form)
    if "error" in answer:
        raise ApiError(
            f"your login to {api} has ended ({_describe(answer)}): run `jobscope --api {api} login`"
        )
    site = {
        "issuer": stored.issuer,
        "client_id": stored.client_id,
        "token_endpoint": stored.token_endpoint,
        "revocation_endpoint": stored.revocation_endpoint,
    }
    return _login(site, {"refresh_token": stored.refresh_token, **answer}, now)


def logout(api: str) -> tuple[bool, str]:
    """Forget the login stored for `api`, then revoke its refresh token at the provider
    (best effort). Returns whether there was one, and why it could not be revoked ('' if
    it was, or if the provider has no revocation endpoint)."""
    with credentials.edit() as logins:
        stored = logins.pop(credentials.key(api), None)
    if stored is None:
        return False, ""
    if not stored.revocation_endpoint:
        return True, ""
    form = {
        "token": stored.refresh_token,
        "token_type_hint": "refresh_token",
        "client_id": stored.client_id,
    }
    try:
        response = httpx.post(stored.revocation_endpoint, data=form, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        return True, f"the provider could not be reached: {exc}"
    if response.status_code != 200:
        return True, f"the provider answered {response.status_code}"
    return True, ""


class StoredLogin(httpx.Auth):
    """httpx authentication by the token `jobscope login` stored for an API, if any,
    refreshed as needed before each request."""

    def __init__(self, api: str) -> None:
        self.api = api

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        access = token(self.api)
        if access:
            request.headers["Authorization"] = f"Bearer {access}"
        yield request


def _login(site: dict[str, Any], tokens: dict[str, Any], asked_at: float) -> Login:
    """A provider's token answer as a stored login (times counted from before the request)."""
    refresh_in = float(tokens.get("refresh_expires_in") or 0)
    return Login(
        access_token=tokens["access_token"],
        refresh_token=tokens.get("refresh_token", ""),
        expires_at=asked_at + float(tokens.get("expires_in", 0)),
        refresh_expires_at=asked_at + refresh_in if refresh_in else 0,
        issuer=site["issuer"],
        client_id=site["client_id"],
        token_endpoint=site["token_endpoint"],
        revocation_endpoint=site.get("revocation_endpoint", ""),
    )


def claims(access_token: str) -> dict[str, Any]:
    """An access token's claims read without checking its signature (the API does), to
    name the user and check the audience; {} for an opaque token."""
    try:
        payload = access_token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}


def _describe(answer: dict[str, Any]) -> str:
    return str(answer.get("error_description") or answer.get("error"))


def _get(url: str, what: str) -> dict[str, Any]:
    try:
        response = httpx.get(url, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise ApiError(f"cannot reach {what} at {url}: {exc}") from None
    body = _json(response, url)
    if response.status_code != 200:
        why = body.get("error", response.reason_phrase)
        raise ApiError(f"{what} answered {response.status_code} at {url}: {why}")
    return body


def _post(url: str, form: dict[str, str]) -> dict[str, Any]:
    answer = _token_request(url, form)
    if "error" in answer:
        raise ApiError(f"the provider refused the login: {_describe(answer)}")
    return answer


def _token_request(url: str, form: dict[str, str]) -> dict[str, Any]:
    """A form POST to the provider: its JSON answer, `error` included (RFC 6749 §5.2)."""
    try:
        response = httpx.post(url, data=form, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise ApiError(f"cannot reach the identity provider at {url}: {exc}") from None
    answer = _json(response, url)
    if response.status_code != 200 and "error" not in answer:
        raise ApiError(f"the identity provider answered {response.status_code} at {url}")
    return answer


def _json(response: httpx.Response, url: str) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ApiError(f"{url} answered {response.status_code} without a JSON object")
    return body
