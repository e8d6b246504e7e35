"""Fixtures (a plugin of tests/conftest.py): a real OpenID Connect provider (Keycloak,
stack/oidc_provider.py: no provider is mocked) with the demo realm, and an API that trusts
it under the `jobs` read policy, for tests/identity/ and tests/superset/ (one scheduling unit,
tests/scheduling.py: the provider starts once)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from stack import oidc_provider as oidc_stack
from stack import secrets, services
from stack.config import StackSettings
from tests import ports

KEYS_REFRESH_MIN_S = 1
"""The API under test reads the provider's keys again at most this often (10 s by default:
the test only waits less for the same rotation)."""
KEYS_CACHE_S = 8
"""... and whenever its copy is this old (300 s by default): a retired key is refused then."""
DEVICE_POLL_S = 1
"""`jobscope login` asks the provider this often whether the user approved (the realm's device
polling interval, which the provider sends: 5 s by default, which each login of the tests
waited in part after its approval; the client obeys whatever it is told)."""


@dataclass(frozen=True)
class Provider:
    settings: oidc_stack.OidcProviderSettings
    admin: oidc_stack.AdminApi
    password: str
    """the demo users' password"""
    service_secret: str
    api_url: str
    """an API trusting the provider, under JOBSCOPE_READ_POLICY=jobs"""

    @property
    def token_endpoint(self) -> str:
        return f"{self.settings.issuer}/protocol/openid-connect/token"

    def token(self, user: str, client: str = oidc_stack.CLI_CLIENT) -> str:
        """An access token of `user` (the password grant of the CLI's client)."""
        form = {
            "grant_type": "password",
            "client_id": client,
            "username": user,
            "password": self.password,
            "scope": "openid",
        }
        response = httpx.post(self.token_endpoint, data=form, timeout=30)
        assert response.status_code == 200, response.text
        return str(response.json()["access_token"])

    def service_token(self) -> str:
        """An access token of the service client (client credentials: a scheduler's hooks)."""
        form = {
            "grant_type": "client_credentials",
            "client_id": oidc_stack.SERVICE_CLIENT,
            "client_secret": self.service_secret,
        }
        response = httpx.post(self.token_endpoint, data=form, timeout=30)
        assert response.status_code == 200, response.text
        return str(response.json()["access_token"])


@pytest.fixture(scope="session")
def oidc_provider_settings() -> oidc_stack.OidcProviderSettings:
    return oidc_stack.OidcProviderSettings(
        port=ports.port("oidc", 0),
        # where Superset logging in through it returns (tests/superset/test_oidc_login.py)
        superset_url=f"http://127.0.0.1:{ports.port('superset-oidc')}",
    )


@pytest.fixture(scope="session")
def oidc_provider_process(
    stack_settings: StackSettings, oidc_provider_settings: oidc_stack.OidcProviderSettings
) -> Iterator[Future[None]]:
    """Keycloak, started in a thread of its own: its start (a JVM's, over a minute on a loaded
    two-core run) overlaps the starts of Kafka and ClickHouse, which the API trusting it
    waits for too. Started once `.result()` returns."""
    # made here, before the two starts run at once: both read them
    services.prepare_state_dir(stack_settings)
    secrets.load_or_create(stack_settings.state_dir)
    with ThreadPoolExecutor(1, thread_name_prefix="oidc-provider") as pool:
        started = pool.submit(oidc_stack.start, stack_settings, oidc_provider_settings)
        try:
            yield started
        finally:
            wait([started])
            oidc_stack.process(stack_settings).stop(timeout=30)


@pytest.fixture(scope="session")
def oidc_provider_api(
    oidc_provider_process: Future[None],
    clickhouse: StackSettings,
    oidc_provider_settings: oidc_stack.OidcProviderSettings,
) -> Iterator[str]:
    oidc_provider_process.result()
    port = ports.port("oidc", 1)
    env = {
        "JOBSCOPE_OIDC_ISSUER": oidc_provider_settings.issuer,
        "JOBSCOPE_READ_POLICY": "jobs",
        "JOBSCOPE_OIDC_JWKS_REFRESH_MIN_S": str(KEYS_REFRESH_MIN_S),
        "JOBSCOPE_OIDC_JWKS_CACHE_S": str(KEYS_CACHE_S),
        "JOBSCOPE_LIVE_JOB_CHECK_S": "0.5",
        "JOBSCOPE_OIDC_LEEWAY_S": "1",
        # the refusals tested here would soon be answered 429 (tests/api/test_tokens.py)
        "JOBSCOPE_AUTH_MAX_FAILURES": "1000",
    }
    yield services.start_api(clickhouse, name="api-oidc", port=port, env=env)
    services.process(clickhouse, "api-oidc").stop(timeout=30)


@pytest.fixture(scope="session")
def oidc_provider(
    stack_settings: StackSettings,
    oidc_provider_settings: oidc_stack.OidcProviderSettings,
    oidc_provider_api: str,
) -> Provider:
    values = secrets.load_or_create(stack_settings.state_dir)
    admin = oidc_stack.AdminApi(oidc_provider_settings, values["JOBSCOPE_OIDC_ADMIN_PASSWORD"])
    polling = {"oauth2DevicePollingInterval": DEVICE_POLL_S}
    admin.request("PUT", f"/{oidc_provider_settings.realm}", json=polling)
    return Provider(
        settings=oidc_provider_settings,
        admin=admin,
        password=values["JOBSCOPE_OIDC_DEMO_PASSWORD"],
        service_secret=values["JOBSCOPE_OIDC_SERVICE_SECRET"],
        api_url=oidc_provider_api,
    )


@pytest.fixture(scope="session")
def oidc_jobs(api_url: str, api_tokens: dict[str, str]) -> dict[str, str]:
    """A running job of alice in project p1 and one of bob in p2, by user (written by the
    scheduler)."""
    made = {}
    for user, project in (("alice", "p1"), ("bob", "p2")):
        job_id = f"oidc-{user}-{uuid.uuid4().hex[:8]}"
        job = {
            "job_id": job_id,
            "user": user,
            "project": project,
            "nodes": ["node-1"],
            "start": (datetime.now(UTC) - timedelta(hours=1)).isoformat(),
            "state": "running",
        }
        headers = {"Authorization": f"Bearer {api_tokens['scheduler']}"}
        response = httpx.post(f"{api_url}/api/jobs", json=job, headers=headers, timeout=30)
        assert response.status_code == 201, response.text
        made[user] = job_id
    return made
