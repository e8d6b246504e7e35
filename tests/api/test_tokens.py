"""Signed tokens: created by an admin, checked by the API (signature, expiry, role, lifetime,
revocation shared by every API process); static tokens and the key long enough; failed
authentications throttled per client address."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import jwt
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from pydantic import ValidationError

from api.infra.config import ApiSettings
from api.infra.limits import FailedLogins
from api.infra.tokens import InvalidToken, Principal, Role, create_token, decode
from api.main import create_app
from jobscope.cli import cli
from jobscope.client import token_id
from stack import secrets, services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import free_port, wait_until

from .test_limits import extra_api

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
        {
            "sub": "alice",
            "role": "pusher",
            "iat": past,
            "exp": past + timedelta(hours=1),
            "jti": "j",
        },
        SECRET,
        algorithm="HS256",
    )
    with pytest.raises(InvalidToken, match="expired"):
        decode(SECRET, expired)
    unknown_role = jwt.encode(
        {"sub": "alice", "role": "root", "iat": past, "exp": past + timedelta(days=1), "jti": "j"},
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
        {
            "sub": "hook",
            "role": "scheduler",
            "iat": past,
            "exp": past + timedelta(hours=1),
            "jti": "j",
        },
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


def _signed(secret: str, lifetime: timedelta, **claims: object) -> str:
    """A token signed with `secret`, as an older release or another minter made it."""
    now = datetime.now(UTC)
    base = {"sub": "old", "role": "admin", "iat": now, "exp": now + lifetime}
    return jwt.encode({**base, **claims}, secret, algorithm="HS256")


def test_lifetime_is_bounded(api_url: str, api_tokens: dict[str, str], token_secret: str) -> None:
    """JOBSCOPE_TOKEN_MAX_TTL_DAYS (365 by default): a longer token is not issued (400 naming
    ttl_days), and one signed longer (or without a jti, as before revocations) is refused."""
    url = f"{api_url}/api/tokens"
    admin = _auth(api_tokens["admin"])
    refused = httpx.post(url, json={"user": "a", "role": "reader", "ttl_days": 366}, headers=admin)
    assert refused.status_code == 400, refused.text
    assert refused.json()["parameter"] == "ttl_days"
    assert "JOBSCOPE_TOKEN_MAX_TTL_DAYS" in refused.json()["error"]
    created = httpx.post(url, json={"user": "a", "role": "reader", "ttl_days": 365}, headers=admin)
    assert created.status_code == 201, created.text
    assert len(decode(token_secret, created.json()["token"]).jti) == 32
    for token, says in (
        (_signed(token_secret, timedelta(days=3650), jti="x"), "longer than 365 days"),
        (_signed(token_secret, timedelta(days=1)), "jti"),
    ):
        response = httpx.post(url, json={"user": "a", "role": "reader"}, headers=_auth(token))
        assert response.status_code == 401 and says in response.json()["error"], response.text


def test_a_revoked_token_is_refused_by_every_api_process(
    clickhouse: StackSettings, api_url: str, api_tokens: dict[str, str], token_secret: str
) -> None:
    """Revoked through the session's API, a token is refused by that API at once, by a second
    API process within seconds, and by a third started afterwards (the list is shared through
    Kafka, not held by one process). `jobscope token revoke` takes a whole token."""
    admin = _auth(api_tokens["admin"])
    asked = {"user": "mallory", "role": "pusher", "ttl_days": 1}

    def status(url: str, token: str) -> int:
        # a pusher may not mint tokens: 403 while the token is valid, 401 once revoked
        return httpx.post(f"{url}/api/tokens", json=asked, headers=_auth(token)).status_code

    with extra_api(clickhouse, "api-second", {}) as second:
        token = httpx.post(f"{api_url}/api/tokens", json=asked, headers=admin).json()["token"]
        assert status(api_url, token) == 403 and status(second, token) == 403
        jti = decode(token_secret, token).jti
        revoked = httpx.delete(f"{api_url}/api/tokens/{jti}", headers=admin, timeout=30)
        assert revoked.status_code == 200 and revoked.json()["jti"] == jti, revoked.text
        began = time.monotonic()
        assert status(api_url, token) == 401
        wait_until(lambda: status(second, token) == 401, 10, "the second API to refuse it")
        print(f"revocation seen by the second API process after {time.monotonic() - began:.2f} s")
        refused = httpx.post(f"{second}/api/tokens", json=asked, headers=_auth(token))
        assert f"token revoked (jti {jti})" in refused.json()["error"]
        # only an admin revokes
        other = httpx.post(f"{api_url}/api/tokens", json=asked, headers=admin).json()["token"]
        pusher = httpx.delete(f"{second}/api/tokens/{jti}", headers=_auth(other))
        assert pusher.status_code == 403, pusher.text
        # the CLI, given the whole token, through the second API
        done = CliRunner().invoke(
            cli, ["--api", second, "--token", api_tokens["admin"], "token", "revoke", other]
        )
        assert done.exit_code == 0 and token_id(other) in done.output, done.output
        assert status(second, other) == 401
    with extra_api(clickhouse, "api-third", {}) as third:
        assert status(third, token) == 401 and status(third, other) == 401
        fresh = httpx.post(f"{third}/api/tokens", json=asked, headers=admin).json()["token"]
        assert status(third, fresh) == 403


def test_short_static_tokens_and_key_are_refused_at_start(clickhouse: StackSettings) -> None:
    """A static token under 16 characters or a signing key under 32: `python -m api` stops
    at once (exit 2) naming the variable; empty means unset."""
    env = {**services.component_env(clickhouse), "JOBSCOPE_API_PORT": "1"}
    for name, value, least in (
        ("JOBSCOPE_ADMIN_TOKEN", "admin", 16),
        ("JOBSCOPE_SCHEDULER_TOKEN", "x" * 15, 16),
        ("JOBSCOPE_TOKEN_SECRET", "s" * 31, 32),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "api"],
            env={**env, name: value},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert f"{name} has {len(value)} characters, at least {least}" in done.stderr
    password = services.component_env(clickhouse)["JOBSCOPE_CLICKHOUSE_API_PASSWORD"]
    settings = ApiSettings(clickhouse_api_password=password, admin_token="", token_secret=None)
    assert settings.admin_token is None
    with pytest.raises(ValidationError, match="JOBSCOPE_TOKEN_SECRET"):
        ApiSettings(clickhouse_api_password=password, token_secret="short")


def test_failed_authentications_are_throttled_per_client(
    clickhouse: StackSettings, api_tokens: dict[str, str]
) -> None:
    """JOBSCOPE_AUTH_MAX_FAILURES (3 here) bad tokens from one address within
    JOBSCOPE_AUTH_FAILURE_WINDOW_S (4 s here): further attempts get 429 with Retry-After,
    even with a good token, until the window ends; open reads are not affected."""
    env = {"JOBSCOPE_AUTH_MAX_FAILURES": "3", "JOBSCOPE_AUTH_FAILURE_WINDOW_S": "4"}
    with extra_api(clickhouse, "api-throttle", env) as url:
        asked = {"user": "a", "role": "reader"}
        good = _auth(api_tokens["admin"])
        for _ in range(3):
            bad = httpx.post(f"{url}/api/tokens", json=asked, headers=_auth("guess-" + "x" * 20))
            assert bad.status_code == 401, bad.text
        began = time.monotonic()
        for headers in (_auth("guess-" + "y" * 20), good):
            throttled = httpx.post(f"{url}/api/tokens", json=asked, headers=headers)
            assert throttled.status_code == 429, throttled.text
            assert 1 <= int(throttled.headers["retry-after"]) <= 4
            assert "JOBSCOPE_AUTH_MAX_FAILURES" in throttled.json()["error"]
        assert httpx.get(f"{url}/api/jobs", params={"limit": 1}, timeout=30).status_code == 200
        wait_until(
            lambda: httpx.post(f"{url}/api/tokens", json=asked, headers=good).status_code == 201,
            10,
            "the admin token to be accepted again after the window",
        )
        assert time.monotonic() - began > 2, "the block ended long before its window"


def test_failed_logins_memory_is_bounded() -> None:
    """However many addresses fail, at most `tracked` are remembered."""
    logins = FailedLogins(limit=2, window_s=60, tracked=100)
    for i in range(10_000):
        logins.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(logins._windows) == 100
    logins.failed("10.0.39.15")  # the newest, remembered: one more failure blocks it
    assert logins.retry_after("10.0.39.15") > 0
    assert logins.retry_after("10.0.0.0") == 0  # forgotten


def test_revocations_are_followed_once_kafka_answers(
    clickhouse: StackSettings, token_secret: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An API started while Kafka is unreachable keeps trying to read the revocation list
    (signed tokens are refused meanwhile): the thread that follows it never gives up."""
    settings = ApiSettings(
        clickhouse_port=clickhouse.clickhouse_port,
        clickhouse_api_password=secrets.load_or_create(clickhouse.state_dir)[
            "JOBSCOPE_CLICKHOUSE_API_PASSWORD"
        ],
        kafka_bootstrap=f"127.0.0.1:{free_port()}",  # nothing listens there
        token_secret=token_secret,
        revocations_load_timeout_s=0.5,
    )
    caplog.set_level(logging.WARNING, logger="jobscope.api")
    with TestClient(create_app(settings)) as client:
        revocations = client.app.state.revocations  # type: ignore[attr-defined]

        def retried() -> bool:
            return sum("Kafka unreachable" in r.getMessage() for r in caplog.records) >= 2

        wait_until(retried, 30, "two attempts to read the revocation list")
        assert revocations._thread.is_alive()
        pusher = create_token(token_secret, "alice", Role.PUSHER, timedelta(hours=1))
        refused = client.post("/api/metrics", json=[], headers=_auth(pusher))
        assert refused.status_code == 503, refused.text
