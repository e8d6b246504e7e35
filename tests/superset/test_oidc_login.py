"""Superset behind the site's OpenID Connect provider (a real Keycloak, tests/oidc_provider.py):
users log in through the provider's own login page in a real browser (Debian's Chromium), get
their roles from its access token, and see on the Job dashboard only the jobs the `jobs` read
policy lets them read (superset/jobscope_access.py: Superset's row-level security).

A second Superset process serves the metadata the session's Superset initialised and imported
(same home, same roles and row-level security), with the provider's login instead of
Superset's own form: only a gunicorn start more."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from api.routes.dashboard import job_dashboard_path
from stack import superset
from tests import ports
from tests.oidc_provider import Provider
from tests.superset.conftest import COLUMNS, SupersetUnderTest, browse, by_title, post_job

pytestmark = pytest.mark.slow

NAME = "superset-oidc"
JOB_DASHBOARD = job_dashboard_path(None)


@dataclass(frozen=True)
class OidcSuperset:
    app: SupersetUnderTest
    provider: Provider


@pytest.fixture(scope="module")
def oidc_superset(
    superset_app: SupersetUnderTest, oidc_provider: Provider
) -> Iterator[OidcSuperset]:
    stack = superset_app.stack
    settings = superset.SupersetSettings(
        host="127.0.0.1",
        port=ports.port("superset-oidc"),
        database_url="",
        oidc_issuer=oidc_provider.settings.issuer,
    )
    superset.stop(stack, NAME)  # a crashed run's
    superset.serve(stack, settings, name=NAME)
    yield OidcSuperset(SupersetUnderTest(stack, settings), oidc_provider)
    superset.stop(stack, NAME)


@dataclass(frozen=True)
class Jobs:
    alice: str
    """alice's job, of project p1"""
    bob: str
    """bob's job, of project p2"""


@pytest.fixture(scope="module")
def jobs(admin_client: Client, api_url: str, api_tokens: dict[str, str]) -> Jobs:
    """A job of alice (p1) and one of bob (p2), each on a node of its own with a minute of
    power readings, the newest jobs of the test stack."""
    tag = uuid.uuid4().hex[:6]
    start = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(minutes=3)
    end = start + timedelta(seconds=60)
    ids = {}
    for user, project in (("alice", "p1"), ("bob", "p2")):
        node = f"oidc{tag}-{user}"
        rows = [
            [start + timedelta(seconds=i), node, "bmc_power_watt", 100.0, {}] for i in range(61)
        ]
        admin_client.insert("metrics", rows, column_names=COLUMNS)
        ids[user] = f"oidc{tag}-{user}"
        post_job(api_url, api_tokens, ids[user], [node], start, end, user=user, project=project)
    return Jobs(ids["alice"], ids["bob"])


def browse_as(oidc: OidcSuperset, user: str, path: str) -> dict[str, dict[str, Any]]:
    """The charts of the dashboard at `path` by title, as `user` sees them once logged in
    through the provider's login page."""
    screenshot = superset.home(oidc.app.stack) / f"oidc-{user}.png"
    login = (user, oidc.provider.password, "oidc")
    return by_title(browse(oidc.app, path, screenshot, login))


def listed_jobs(charts: dict[str, dict[str, Any]]) -> set[str]:
    """The job ids the Job table shows."""
    return {row[0] for row in charts["Job"]["rows"] if row}


def test_a_user_lists_only_their_jobs(
    oidc_superset: OidcSuperset, jobs: Jobs, chromium: None
) -> None:
    """The Job table of the unfiltered Job dashboard (all jobs, newest first) lists bob's job
    and not alice's to bob (alice's side: the next tests)."""
    bob = listed_jobs(browse_as(oidc_superset, "bob", JOB_DASHBOARD))
    assert jobs.bob in bob
    assert jobs.alice not in bob


def test_project_manager_and_support(
    oidc_superset: OidcSuperset, jobs: Jobs, chromium: None
) -> None:
    """pia manages p1: alice's job (p1), not bob's (p2); sam (support) sees both."""
    pia = listed_jobs(browse_as(oidc_superset, "pia", JOB_DASHBOARD))
    assert jobs.alice in pia
    assert jobs.bob not in pia
    sam = listed_jobs(browse_as(oidc_superset, "sam", JOB_DASHBOARD))
    assert {jobs.alice, jobs.bob} <= sam


def test_another_users_job_shows_nothing(
    oidc_superset: OidcSuperset, jobs: Jobs, chromium: None
) -> None:
    """alice setting the job filter to bob's job (its id in the URL) gets no row of it in any
    chart: neither the job nor its readings; on her own job, hers alone, drawn."""
    charts = browse_as(oidc_superset, "alice", job_dashboard_path(jobs.bob))
    assert all(not chart["rows"] for chart in charts.values()), charts
    assert all(chart["state"] in ("empty", "error") for chart in charts.values()), [
        (c["title"], c["state"]) for c in charts.values()
    ]
    mine = browse_as(oidc_superset, "alice", job_dashboard_path(jobs.alice))
    assert listed_jobs(mine) == {jobs.alice}
    assert mine["Power per node (W)"]["state"] == "rendered"
