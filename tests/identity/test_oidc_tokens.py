"""The site's provider's access tokens at the API (api/infra/oidc.py), from a real Keycloak: each
role reads what the `jobs` policy allows it; forged, foreign, expired and mis-addressed
tokens are refused saying why, never repeating the token; a key rotation at the provider is
followed without restart, and a retired key stops working."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from stack.processes import wait_until
from tests.oidc_provider import KEYS_CACHE_S, Provider


def _get(provider: Provider, token: str, path: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.get(f"{provider.api_url}{path}", headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("user", "sees"),
    [("alice", {"alice"}), ("bob", {"bob"}), ("pia", {"alice"}), ("sam", {"alice", "bob"})],
)
def test_each_user_reads_what_the_policy_allows(
    oidc_provider: Provider, oidc_jobs: dict[str, str], user: str, sees: set[str]
) -> None:
    """alice and bob their own jobs, pia (project p1's manager) p1's, sam (support) all:
    another's job is a 404 as an unknown one, and missing from the list."""
    token = oidc_provider.token(user)
    for owner, job_id in oidc_jobs.items():
        response = _get(oidc_provider, token, f"/api/jobs/{job_id}")
        assert response.status_code == (200 if owner in sees else 404), (owner, response.text)
    listed = {j["job_id"] for j in _get(oidc_provider, token, "/api/jobs?limit=100000").json()}
    assert {owner for owner, job_id in oidc_jobs.items() if job_id in listed} == sees


def test_a_service_writes_jobs_with_client_credentials(
    oidc_provider: Provider, oidc_jobs: dict[str, str]
) -> None:
    """The service client's token (role scheduler at the provider) ends alice's job; a
    user's token may not."""
    end = {"end": datetime.now(UTC).isoformat(), "state": "terminated"}
    url = f"{oidc_provider.api_url}/api/jobs/{oidc_jobs['alice']}"
    refused = httpx.patch(url, json=end, headers=_bearer(oidc_provider.token("alice")))
    assert refused.status_code == 403, refused.text
    written = httpx.patch(url, json=end, headers=_bearer(oidc_provider.service_token()))
    assert written.status_code in (200, 202), written.text


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _claims(provider: Provider, **changes: Any) -> dict[str, Any]:
    now = int(time.time())
    claims = {
        "iss": provider.settings.issuer,
        "aud": provider.settings.audience,
        "preferred_username": "sam",
        "realm_access": {"roles": ["support"]},
        "iat": now,
        "exp": now + 300,
    }
    return {**claims, **changes}


def _refused(provider: Provider, token: str, why: str) -> None:
    response = _get(provider, token, "/api/jobs")
    assert response.status_code == 401, response.text
    assert why in response.json()["error"], response.text
    longest = max(token.split("."), key=len)
    assert longest[-24:] not in response.text, "the refusal repeats the token"


def _hmac_signed(claims: dict[str, Any], kid: str, key: bytes) -> str:
    """An HS256 token keyed with public material (PyJWT itself refuses to make one)."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = part(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    signed = f"{header}.{part(json.dumps(claims).encode())}"
    return f"{signed}.{part(hmac.new(key, signed.encode(), hashlib.sha256).digest())}"


def test_forged_tokens_are_refused(oidc_provider: Provider) -> None:
    """Claims of a support user, as an attacker would write them: unsigned, signed by a key
    of its own under the provider's key id, or HMAC-signed with the provider's public key."""
    real = oidc_provider.token("alice")
    kid = jwt.get_unverified_header(real)["kid"]
    claims = _claims(oidc_provider)
    unsigned = jwt.encode(claims, None, algorithm="none")
    _refused(oidc_provider, unsigned, "algorithm 'none'")
    own_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other = jwt.encode(claims, own_key, algorithm="RS256", headers={"kid": kid})
    _refused(oidc_provider, other, "does not match the provider's key")
    jwks = httpx.get(f"{oidc_provider.settings.issuer}/protocol/openid-connect/certs").text
    confused = _hmac_signed(claims, kid, jwks.encode())
    _refused(oidc_provider, confused, "algorithm 'HS256'")
    assert _get(oidc_provider, real, "/api/jobs").status_code == 200


def test_tokens_of_another_issuer_or_audience_are_refused(oidc_provider: Provider) -> None:
    """Real tokens of the same provider: from another realm (another issuer), and from a
    client whose tokens are not for jobscope's audience."""
    admin, realm = oidc_provider.admin, f"elsewhere-{uuid.uuid4().hex[:6]}"
    user = {
        "username": "alice",
        "enabled": True,
        "email": "alice@example.org",
        "firstName": "Alice",
        "lastName": "Elsewhere",
        "credentials": [{"type": "password", "value": oidc_provider.password}],
    }
    client = {"clientId": "jobscope-cli", "publicClient": True, "directAccessGrantsEnabled": True}
    admin.request(
        "POST", "", json={"realm": realm, "enabled": True, "users": [user], "clients": [client]}
    )
    form = {
        "grant_type": "password",
        "client_id": "jobscope-cli",
        "username": "alice",
        "password": oidc_provider.password,
    }
    token_url = f"{oidc_provider.settings.url}/realms/{realm}/protocol/openid-connect/token"
    foreign = httpx.post(token_url, data=form, timeout=30).json()["access_token"]
    _refused(oidc_provider, foreign, "are not accepted here")

    realm = oidc_provider.settings.realm
    client = {"clientId": "another-app", "publicClient": True, "directAccessGrantsEnabled": True}
    admin.request("POST", f"/{realm}/clients", json=client)
    elsewhere = oidc_provider.token("alice", client="another-app")
    _refused(oidc_provider, elsewhere, "not for audience 'jobscope'")


def test_an_expired_token_is_refused(oidc_provider: Provider) -> None:
    """A client whose tokens live 2 s: accepted, then refused as expired (the API under test
    allows 1 s of clock skew)."""
    realm = oidc_provider.settings.realm
    client = {
        "clientId": "short-lived",
        "publicClient": True,
        "directAccessGrantsEnabled": True,
        "attributes": {"access.token.lifespan": "2"},
        "protocolMappers": [
            {
                "name": "audience",
                "protocol": "openid-connect",
                "protocolMapper": "oidc-audience-mapper",
                "config": {"included.custom.audience": "jobscope", "access.token.claim": "true"},
            }
        ],
    }
    oidc_provider.admin.request("POST", f"/{realm}/clients", json=client)
    token = oidc_provider.token("alice", client="short-lived")
    assert _get(oidc_provider, token, "/api/jobs").status_code == 200
    wait_until(
        lambda: _get(oidc_provider, token, "/api/jobs").status_code == 401,
        30,
        "the 2 s token to expire",
    )
    _refused(oidc_provider, token, "token expired")


def test_a_key_rotation_is_followed_and_a_retired_key_refused(oidc_provider: Provider) -> None:
    """The provider signs with a new key: its tokens are accepted without restarting the
    API. The old key is then deleted at the provider: a token it signed is refused once the
    API's copy of the keys is older than its cache time."""
    realm = oidc_provider.settings.realm
    admin = oidc_provider.admin
    old_token = oidc_provider.token("alice")
    (old_key,) = admin.signing_keys(realm)[:1]
    admin.rotate_key(
        realm, f"rotated-{uuid.uuid4().hex[:6]}", int(old_key["providerPriority"]) + 100
    )
    new_token = oidc_provider.token("alice")
    new_kid = jwt.get_unverified_header(new_token)["kid"]
    assert new_kid != old_key["kid"], "the provider did not sign with the new key"
    wait_until(
        lambda: _get(oidc_provider, new_token, "/api/jobs").status_code == 200,
        15,
        "a token of the new key to be accepted",
    )
    assert _get(oidc_provider, old_token, "/api/jobs").status_code == 200

    admin.retire_key(realm, old_key["providerId"])
    wait_until(
        lambda: _get(oidc_provider, old_token, "/api/jobs").status_code == 401,
        KEYS_CACHE_S + 20,
        "the retired key's token to be refused",
    )
    _refused(oidc_provider, old_token, "unknown key")
    assert _get(oidc_provider, new_token, "/api/jobs").status_code == 200
