"""Signed tokens: created by an admin, checked by the API (signature, expiry, role)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import jwt
import pytest
from fastapi.testclient import TestClient

from api.config import ApiSettings
from api.main import create_app
from api.tokens import InvalidToken, Principal, Role, create_token, decode
from stack import secrets
from stack.config import StackSettings

SECRET = "a test key of 32 bytes or more, for HS256"


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="session")
def token_secret(stack_settings: StackSettings) -> str:
    return secrets.load_or_create(stack_settings.state_dir)["JOBSCOPE_TOKEN_SECRET"]


def test_token_round_trip_and_refusals() -> None:
    token = create_token(SECRET, "alice", "pusher", timedelta(days=1))
    assert decode(SECRET, token) == Principal("alice", Role.PUSHER)
    with pytest.raises(InvalidToken, match="Signature"):
        decode("another secret of 32 bytes or more", token)
    header, claims, signature = token.split(".")
    with pytest.raises(InvalidToken):
        decode(SECRET, f"{header}.{claims}.{signature[::-1]}")
    past = datetime.now(UTC) - timedelta(hours=2)
    expired = jwt.encode(
        {"sub": "alice", "role": "pusher", "iat": past, "exp": past + timedelta(hours=1)},
        SECRET,
        algorithm="HS256",
    )
    with pytest.raises(InvalidToken, match="expired"):
        decode(SECRET, expired)
    unknown_role = jwt.encode(
        {"sub": "alice", "role": "root", "iat": past, "exp": past + timedelta(days=1)},
        SECRET,
        algorithm="HS256",
    )
    with pytest.raises(InvalidToken, match="role"):
        decode(SECRET, unknown_role)
    with pytest.raises(ValueError):
        create_token(SECRET, "alice", "root", timedelta(days=1))


def test_admin_creates_tokens(api_url: str, api_tokens: dict[str, str], token_secret: str) -> None:
    asked = {"user": "alice", "role": "pusher", "ttl_days": 30}
    response = httpx.post(
        f"{api_url}/api/tokens", json=asked, headers=_auth(api_tokens["admin"]), timeout=10
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert decode(token_secret, created["token"]) == Principal("alice", Role.PUSHER)
    expires = datetime.fromisoformat(created["expires_at"])
    assert abs(expires - (datetime.now(UTC) + timedelta(days=30))) < timedelta(minutes=1)
    for headers, status in (
        ({}, 401),
        (_auth(api_tokens["scheduler"]), 403),
        (_auth(created["token"]), 403),  # a pusher cannot mint tokens
    ):
        refused = httpx.post(f"{api_url}/api/tokens", json=asked, headers=headers, timeout=10)
        assert refused.status_code == status, refused.text
    bad_role = httpx.post(
        f"{api_url}/api/tokens",
        json={**asked, "role": "root"},
        headers=_auth(api_tokens["admin"]),
        timeout=10,
    )
    assert bad_role.status_code == 400 and bad_role.json()["parameter"] == "role", bad_role.text


def test_signed_tokens_have_their_role_only(api_url: str, token_secret: str) -> None:
    """A signed scheduler token writes jobs; a pusher's, an expired or a forged one does not."""
    job = {"job_id": f"tok-{uuid.uuid4().hex[:8]}", "nodes": ["n-1"], "state": "running"}
    url = f"{api_url}/api/jobs"
    past = datetime.now(UTC) - timedelta(hours=2)
    expired = jwt.encode(
        {"sub": "hook", "role": "scheduler", "iat": past, "exp": past + timedelta(hours=1)},
        token_secret,
        algorithm="HS256",
    )
    forged = create_token(SECRET, "hook", Role.SCHEDULER, timedelta(days=1))
    pusher = create_token(token_secret, "alice", Role.PUSHER, timedelta(days=1))
    for token, status, says in (
        (expired, 401, "expired"),
        (forged, 401, "invalid token"),
        (pusher, 403, "scheduler or admin"),
    ):
        response = httpx.post(url, json=job, headers=_auth(token), timeout=10)
        assert response.status_code == status, response.text
        assert says in response.json()["error"]
    scheduler = create_token(token_secret, "hook", Role.SCHEDULER, timedelta(days=1))
    response = httpx.post(url, json=job, headers=_auth(scheduler), timeout=30)
    assert response.status_code in (201, 202), response.text


def test_reads_can_need_a_token(
    clickhouse: StackSettings, api_tokens: dict[str, str], token_secret: str
) -> None:
    """The real app with JOBSCOPE_READS_NEED_TOKEN: reads without a valid token are 401, a
    reader token reads; the health check stays open."""
    settings = ApiSettings(
        clickhouse_port=clickhouse.clickhouse_port,
        clickhouse_api_password=secrets.load_or_create(clickhouse.state_dir)[
            "JOBSCOPE_CLICKHOUSE_API_PASSWORD"
        ],
        kafka_bootstrap=clickhouse.kafka_bootstrap,
        token_secret=token_secret,
        reads_need_token=True,
    )
    reader = create_token(token_secret, "carol", Role.READER, timedelta(hours=1))
    with TestClient(create_app(settings)) as client:
        assert client.get("/api/devices").status_code == 401
        assert client.get("/api/devices", headers=_auth("x.y.z")).status_code == 401
        response = client.get("/api/devices", headers=_auth(reader))
        assert response.status_code == 200, response.text
        assert client.get("/health").status_code == 200
        # a reader token writes nothing
        job = {"job_id": "never", "nodes": ["n-1"]}
        assert client.post("/api/jobs", json=job, headers=_auth(reader)).status_code == 403
