"""Superset, started once per session in front of the test stack's ClickHouse and API, with
the dashboards bundle imported (stack/superset.py, as `make superset` does), and a job with
known readings to look at."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from clickhouse_connect.driver.client import Client

from stack import superset
from stack.config import StackSettings
from stack.processes import wait_until
from tests import ports

COLUMNS = ["timestamp", "device_id", "metric_id", "value", "labels"]
SECONDS = 120


@dataclass(frozen=True)
class SupersetUnderTest:
    stack: StackSettings
    settings: superset.SupersetSettings

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def password(self) -> str:
        return superset.admin_password(self.stack)


@pytest.fixture(scope="session")
def superset_app(clickhouse: StackSettings) -> Iterator[SupersetUnderTest]:
    """Superset on its port of the table (tests/ports.py), initialised and imported."""
    settings = superset.SupersetSettings(
        host="127.0.0.1", port=ports.port("superset"), database_url=""
    )
    if not settings.bin("superset").exists():
        pytest.fail(
            f"Superset is not installed in {settings.venv}: `make test` installs it "
            "(`make superset-venv`)"
        )
    superset.stop(clickhouse)  # a crashed run's Superset
    superset.start(clickhouse, settings)
    yield SupersetUnderTest(clickhouse, settings)
    superset.stop(clickhouse)


@pytest.fixture(scope="session")
def chromium() -> None:
    """Debian's Chromium and its driver (stack/install-system-deps.sh installs both)."""
    missing = [p for p in ("chromium", "chromedriver") if shutil.which(p) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: `make test` installs Debian's chromium and "
            "chromium-driver (stack/install-system-deps.sh)"
        )


@dataclass(frozen=True)
class Scene:
    job_id: str
    nodes: tuple[str, ...]
    decoy_job_id: str
    start: datetime


def power(i: int, k: int) -> float:
    """Node k's BMC power at second i: alternating, so the trapezoids are not all equal."""
    return 100.0 + 10 * k + (i % 3)


@pytest.fixture(scope="session")
def scene(admin_client: Client, api_url: str, api_tokens: dict[str, str]) -> Scene:
    """A terminated job on two nodes with 2 minutes of readings every second (BMC power and
    temperature, a network counter, a PDU outlet aliased to each node), then a newer decoy job
    on another node, so that a dashboard showing the newest job would show the wrong one.
    Collection health has something to show too: an ingest error and a producer's own
    readings, as the Kafka engine and a producer write them."""
    tag = uuid.uuid4().hex[:6]
    nodes = (f"ss{tag}-1", f"ss{tag}-2")
    decoy = f"ss{tag}-3"
    start = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(minutes=5)
    rows: list[list[Any]] = []
    for i in range(SECONDS + 1):
        t = start + timedelta(seconds=i)
        for k, node in enumerate((*nodes, decoy)):
            rows += [
                [t, node, "bmc_power_watt", power(i, k), {}],
                [t, node, "bmc_cpu_temp_celsius", 40.0 + k + i / 60, {}],
                [t, node, "network_ifacein_bytes_total", 1000.0 * i * (k + 1), {"port": "eth0"}],
                [
                    t,
                    f"pdu{tag}",
                    "pdu_outlet_power_watt",
                    50.0 + k,
                    {"outlet": str(k + 1), "_device_alias": node},
                ],
            ]
        if i % 10 == 0:
            rows.append([t, f"jobscope-producer-{tag}", "jobscope_producer_polls_failing", 0.0, {}])
    admin_client.insert("metrics", rows, column_names=COLUMNS)
    admin_client.insert(
        "ingest_errors",
        [[start, "readings", 0, 1, "node-x", "garbage", "Cannot parse input: test message"]],
        column_names=["received_at", "topic", "partition", "offset", "key", "raw_message", "error"],
    )
    end = start + timedelta(seconds=SECONDS)
    post_job(api_url, api_tokens, f"ss{tag}", list(nodes), start, end)
    post_job(api_url, api_tokens, f"ss{tag}-decoy", [decoy], start + timedelta(seconds=30), end)
    return Scene(f"ss{tag}", nodes, f"ss{tag}-decoy", start)


def post_job(
    api_url: str,
    api_tokens: dict[str, str],
    job_id: str,
    nodes: list[str],
    start: datetime,
    end: datetime,
    user: str = "superset-test",
    project: str | None = None,
) -> None:
    """A terminated job, written through the API; returns once it is queryable."""
    job = {
        "job_id": job_id,
        "user": user,
        "project": project,
        "nodes": nodes,
        "start": start.isoformat() + "Z",
        "end": end.isoformat() + "Z",
        "state": "terminated",
    }
    headers = {"Authorization": f"Bearer {api_tokens['scheduler']}"}
    response = httpx.post(f"{api_url}/api/jobs", json=job, headers=headers, timeout=30)
    assert response.status_code in (201, 202), response.text
    wait_until(
        lambda: httpx.get(f"{api_url}/api/jobs/{job_id}").status_code == 200,
        20,
        f"job {job_id} to be queryable",
    )


def summary(api_url: str, job_id: str) -> dict[str, Any]:
    response = httpx.get(f"{api_url}/api/jobs/{job_id}/summary", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


@contextmanager
def superset_api(app: SupersetUnderTest) -> Iterator[httpx.Client]:
    """An HTTP client of Superset's REST API, logged in as admin."""
    with httpx.Client(base_url=app.url, timeout=60) as client:
        login = client.post(
            "/api/v1/security/login",
            json={"username": "admin", "password": app.password, "provider": "db"},
        )
        assert login.status_code == 200, login.text
        client.headers["Authorization"] = f"Bearer {login.json()['access_token']}"
        client.headers["X-CSRFToken"] = client.get("/api/v1/security/csrf_token/").json()["result"]
        client.headers["Referer"] = app.url
        yield client


def sqllab(app: SupersetUnderTest, sql: str) -> httpx.Response:
    """Run `sql` in SQL Lab (synchronously) on the jobscope database."""
    with superset_api(app) as client:
        databases = client.get("/api/v1/database/").json()["result"]
        (database,) = [d for d in databases if d["database_name"] == "jobscope"]
        return client.post(
            "/api/v1/sqllab/execute/",
            json={
                "database_id": database["id"],
                "sql": sql,
                "runAsync": False,
                "client_id": f"t{time.monotonic_ns() % 10**9}",
                "queryLimit": 100,
                "tab": "test",
                "expand_data": True,
            },
        )


def dataset_query(
    app: SupersetUnderTest, dataset: str, job_id: str, columns: list[str], metrics: list[str]
) -> list[dict[str, Any]]:
    """Rows of a dataset for a job, as a chart of the Job dashboard filtered on it asks them
    (the chart data API, the job filter as a filter on job_id)."""
    with superset_api(app) as client:
        found = client.get(
            "/api/v1/dataset/",
            params={"q": f"(filters:!((col:table_name,opr:eq,value:{dataset})))"},
        ).json()["result"]
        (dataset_id,) = [d["id"] for d in found]
        response = client.post(
            "/api/v1/chart/data",
            json={
                "datasource": {"id": dataset_id, "type": "table"},
                "force": True,
                "queries": [
                    {
                        "columns": columns,
                        "metrics": metrics,
                        "filters": [{"col": "job_id", "op": "IN", "val": [job_id]}],
                        "orderby": [[c, True] for c in columns],
                        "row_limit": 10000,
                    }
                ],
                "result_format": "json",
                "result_type": "full",
            },
        )
        assert response.status_code == 200, response.text
        return response.json()["result"][0]["data"]


BROWSER = Path(__file__).with_name("dashboard_browser.py")


def browse(
    app: SupersetUnderTest,
    path: str,
    screenshot: Path,
    login: tuple[str, str, str] | None = None,
) -> dict[str, Any]:
    """What every chart of the dashboard at `path` shows once finished (dashboard_browser.py,
    run by Superset's Python, which has Selenium), logged in as Superset's admin, or as
    `login` (user, password, "oidc": at the provider's page)."""
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    screenshot.unlink(missing_ok=True)
    who = login or (app.settings.admin_user, app.password, "form")
    result = subprocess.run(
        [
            str(app.settings.bin("python")),
            str(BROWSER),
            app.url,
            who[0],
            who[1],
            path,
            str(screenshot),
            "90",
            who[2],
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout)
    assert seen["finished"], f"charts still loading after 90 s: {seen['charts']}"
    assert screenshot.stat().st_size > 0
    return seen


def by_title(seen: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {chart["title"]: chart for chart in seen["charts"]}
