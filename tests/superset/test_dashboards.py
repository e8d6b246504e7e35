"""The dashboards as code, in a real Superset against the test stack, seen by a real browser
(Debian's headless Chromium driven by Selenium)."""

from __future__ import annotations

import sqlite3
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import clickhouse_connect
import httpx
import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from api.routes.dashboard import job_dashboard_path
from stack import services, superset
from stack.config import REPO_ROOT
from stack.processes import wait_until
from tests.conftest import wait_for_rollups
from tests.superset.conftest import (
    COLUMNS,
    SECONDS,
    Scene,
    SupersetUnderTest,
    browse,
    by_title,
    dataset_query,
    post_job,
    sqllab,
    summary,
)

# Superset starts in a minute or two and needs its own venv: not in `make test-fast`.
pytestmark = pytest.mark.slow

JOB_CHARTS = {
    "Job",
    "Power per node (W)",
    "Energy per node (J)",
    "BMC temperatures (°C)",
    "Network traffic (per second)",
    "Metrics of the job",
}


def not_drawn(seen: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (c["title"], c["state"], c["text"][:300])
        for c in seen["charts"]
        if c["state"] != "rendered"
    ]


def test_job_dashboard_draws_the_job_and_its_energy_equals_the_api(
    superset_app: SupersetUnderTest, scene: Scene, api_url: str, chromium: None
) -> None:
    """Opened filtered on the job (the path GET /api/metrics/dashboard redirects to), every
    chart draws data, none shows an error or "No results", the job shown is that job (not the
    newer decoy) and the energy per node is the API summary's."""
    screenshot = superset_app.stack.state_dir / "superset" / "job-dashboard.png"
    seen = browse(superset_app, job_dashboard_path(scene.job_id), screenshot)
    charts = by_title(seen)
    assert set(charts) == JOB_CHARTS
    assert not not_drawn(seen), not_drawn(seen)
    assert [row[0] for row in charts["Job"]["rows"]] == [scene.job_id]

    expected = {
        (e["node"], e["metric_id"]): e["joules"] for e in summary(api_url, scene.job_id)["energy"]
    }
    assert {node for node, _ in expected} == set(scene.nodes)
    shown = {
        (row[0], row[1]): float(row[2].replace(",", ""))
        for row in charts["Energy per node (J)"]["rows"]
    }
    assert shown.keys() == expected.keys()
    for key, joules in expected.items():
        assert shown[key] == pytest.approx(joules, abs=0.5), key

    stats = {(m["device_id"], m["metric_id"]): m for m in summary(api_url, scene.job_id)["metrics"]}
    table = {(row[0], row[1]): row for row in charts["Metrics of the job"]["rows"]}
    assert table.keys() == stats.keys()
    node_power = table[(scene.nodes[0], "bmc_power_watt")]
    assert [float(v) for v in node_power[2:6]] == pytest.approx(
        [stats[(scene.nodes[0], "bmc_power_watt")][k] for k in ("min", "avg", "max", "count")],
        abs=0.05,
    )


def test_devices_dashboard_draws_collection_health(
    superset_app: SupersetUnderTest, scene: Scene, chromium: None, admin_client: Client
) -> None:
    """Readings per second, ingest errors with their reason, devices that stopped reporting
    (the scene's readings are minutes old: stale), the explorer, the producers' readings.
    "Readings stored per second" reads the 1-minute rollup, refreshed every 10 s: the scene's
    readings are awaited there first (a loaded run drew it before their refresh, empty; the
    node's rollup also counts the PDU outlet aliased to it, hence "at least").
    What the alert rules watch, as the ClickHouse server records it (server_health): its
    figures with no alert on this healthy stack, and a disk nearly full (a row written as
    the server would, under a subject of the test's own) named by its rule."""
    nearly_full = f"test-{scene.job_id}"
    admin_client.insert(
        "server_health",
        [[datetime.now(UTC).replace(tzinfo=None), "disk_days_left", nearly_full, 1.5]],
        column_names=["time", "figure", "subject", "value"],
    )
    wait_until(
        lambda: admin_client.query(
            "SELECT count() FROM server_health WHERE figure = 'kafka_consumer_lag' "
            "AND time > now() - INTERVAL 5 MINUTE"
        ).first_row[0],
        90,
        "the ClickHouse server's health record",
    )
    wait_until(
        lambda: (
            admin_client.query(
                "SELECT sum(count) FROM metrics_1m FINAL WHERE device_id = {d:String}",
                parameters={"d": scene.nodes[0]},
            ).first_row[0]
            >= 3 * (SECONDS + 1)
        ),
        180,
        f"the 1-minute rollup to hold the readings of {scene.nodes[0]}",
    )
    screenshot = superset_app.stack.state_dir / "superset" / "devices-dashboard.png"
    seen = browse(superset_app, "/superset/dashboard/jobscope-devices/", screenshot)
    assert not not_drawn(seen), not_drawn(seen)
    charts = by_title(seen)
    reasons = charts["Ingest errors by reason"]["rows"]
    assert any("Cannot parse input: test message" in cell for row in reasons for cell in row)
    freshness = {row[0]: row[1] for row in charts["Devices: newest reading"]["rows"]}
    assert freshness[scene.nodes[0]] == "stale"
    health = charts["ClickHouse server: what the alerts watch"]["rows"]
    alerts = {(row[1], row[3]): row[0] for row in health}  # alert, figure, value, subject, at
    assert alerts[("disk_days_left", nearly_full)] == "JobscopeDiskFull", health
    lag = [alert for (figure, _), alert in alerts.items() if figure == "kafka_consumer_lag"]
    assert lag and set(lag) == {"ok"}, health


def test_pages_load_nothing_from_outside(superset_app: SupersetUnderTest) -> None:
    """Superset's pages embed an analytics pixel from an outside host: the content security
    policy (superset_config.py) lets browsers load from Superset only."""
    response = httpx.get(f"{superset_app.url}/login/", timeout=30)
    policy = response.headers["content-security-policy"]
    assert "img-src 'self' blob: data:;" in policy
    assert "http" not in policy


def _metadata(app: SupersetUnderTest) -> dict[str, list[tuple[Any, ...]]]:
    """Superset's metadata tables of the imported objects, without their modification times
    (the importer stamps every object it overwrites) and, for the dashboards' chart lists,
    the row ids (it writes the lists again)."""
    tables = ("dbs", "tables", "table_columns", "sql_metrics", "slices", "dashboards")
    tables += ("dashboard_slices",)
    database = superset.home(app.stack) / "superset.db"
    with sqlite3.connect(database) as db:
        dump = {}
        for table in tables:
            names = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            dropped = {"changed_on", "changed_by_fk"} | (
                {"id"} if table == "dashboard_slices" else set()
            )
            kept = [n for n in names if n not in dropped]
            columns = ", ".join(kept)
            rows = db.execute(f"SELECT {columns} FROM {table} ORDER BY {columns}")
            dump[table] = [tuple(row) for row in rows]
    return dump


def test_second_import_changes_nothing(superset_app: SupersetUnderTest) -> None:
    before = _metadata(superset_app)
    assert len(before["dashboards"]) == 2
    assert len(before["slices"]) == len(list((REPO_ROOT / "superset/bundle/charts").glob("*")))
    superset.import_bundle(superset_app.stack, superset_app.settings)
    assert _metadata(superset_app) == before


def test_sql_lab_reads_metrics_as_the_read_only_user(
    superset_app: SupersetUnderTest, scene: Scene
) -> None:
    response = sqllab(
        superset_app, f"SELECT count() AS n FROM metrics WHERE device_id = '{scene.nodes[0]}'"
    )
    assert response.status_code == 200, response.text
    assert response.json()["data"] == [{"n": 3 * 121}]  # power, temperature, network

    # Superset refuses a write on this database (allow_dml: false) ...
    refused = sqllab(superset_app, "INSERT INTO metrics (device_id) VALUES ('x')")
    assert refused.status_code != 200
    assert "DML_NOT_ALLOWED" in refused.text
    # ... and ClickHouse refuses Superset's user anything but reading, even through SQL.
    lifted = sqllab(superset_app, "SELECT * FROM metrics SETTINGS readonly=0 LIMIT 1")
    assert lifted.status_code != 200
    assert "READONLY" in lifted.text


def test_superset_user_cannot_write(superset_app: SupersetUnderTest) -> None:
    """Superset's ClickHouse user is read-only like the reader."""
    password = services.component_env(superset_app.stack)["JOBSCOPE_CLICKHOUSE_SUPERSET_PASSWORD"]
    client = clickhouse_connect.get_client(
        host=superset_app.stack.host,
        port=superset_app.stack.clickhouse_port,
        username="superset",
        password=password,
    )
    with pytest.raises(DatabaseError, match="READONLY"):
        client.command("INSERT INTO metrics (device_id) VALUES ('x')")


# (hours, seconds between readings) of each long job, by the rollup Superset reads for it
LONG_JOBS = {"minute": (4, 30), "hour": (72, 300)}


@pytest.fixture(scope="module")
def long_jobs(
    admin_client: Client, api_url: str, api_tokens: dict[str, str]
) -> dict[str, tuple[str, int]]:
    """A job per entry of LONG_JOBS, on a node of its own, ended an hour ago, with its readings
    in the rollups (refreshed after their minute: one wait for both): (job and node, count)."""
    tag = uuid.uuid4().hex[:6]
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(hours=1)
    jobs = {}
    for resolution, (hours, every_s) in LONG_JOBS.items():
        node = f"long{resolution[0]}{tag}"
        start = end - timedelta(hours=hours)
        count = hours * 3600 // every_s + 1
        rows = [
            [start + timedelta(seconds=i * every_s), node, "bmc_power_watt", 200.0 + i % 4, {}]
            for i in range(count)
        ]
        admin_client.insert("metrics", rows, column_names=COLUMNS)
        post_job(api_url, api_tokens, node, [node], start, end)
        jobs[resolution] = (node, count)
    for node, count in jobs.values():
        wait_for_rollups(admin_client, node, count)
    return jobs


@pytest.mark.parametrize(
    "resolution", list(LONG_JOBS), ids=["4-hours-minute-rollup", "3-days-hour-rollup"]
)
def test_long_jobs_read_a_rollup_with_the_api_figures(
    superset_app: SupersetUnderTest,
    api_url: str,
    long_jobs: dict[str, tuple[str, int]],
    resolution: str,
) -> None:
    """A job longer than 3 hours draws from the 1-minute rollup, longer than 2 days from the
    1-hour one; min, average, max, readings and the unit stay the API summary's, and the
    energy (always from raw readings) too."""
    node, count = long_jobs[resolution]
    job_id = node

    got = dataset_query(
        superset_app,
        "job_readings",
        job_id,
        ["resolution", "device_id", "unit"],
        ["min_value", "avg_value", "max_value", "readings"],
    )
    assert [(r["resolution"], r["device_id"]) for r in got] == [(resolution, node)]
    (stats,) = summary(api_url, job_id)["metrics"]
    assert got[0]["unit"] == stats["unit"] == "W"  # the registry's, in SQL and in the API
    assert stats["count"] == count
    assert (got[0]["min_value"], got[0]["max_value"], got[0]["readings"]) == (
        stats["min"],
        stats["max"],
        stats["count"],
    )
    assert got[0]["avg_value"] == pytest.approx(stats["avg"], rel=1e-12)

    energy = dataset_query(superset_app, "job_energy", job_id, ["device_id"], ["energy_j"])
    (expected,) = summary(api_url, job_id)["energy"]
    assert energy == [{"device_id": node, "energy_j": pytest.approx(expected["joules"])}]
