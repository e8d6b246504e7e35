"""Every part watched: Debian's Prometheus scrapes the test stack's API (with the broker's
figures), its ClickHouse server and a producer, with the shipped alert rules loaded; every
target is up, the series an operator needs are there with sane values, no alert is pending
or firing on the healthy stack, and a stopped producer fires JobscopePartDown.

The rules are loaded as shipped but for their `for:` durations (1 s here): a rule that would
fire on the healthy stack at all shows at once, and the stopped part's alert fires within
seconds rather than 2 minutes. Scrapes and evaluations run every second for the same reason.
"""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from stack import services
from stack.config import StackSettings
from stack.processes import wait_until
from stack.simulators.prometheus import Prometheus
from tests import ports
from tests.monitoring.test_alert_rules import RULES

pytestmark = pytest.mark.slow
JOBS = ("jobscope-api", "jobscope-clickhouse", "jobscope-producers")


def _target(url: str) -> str:
    return url.removeprefix("http://")


@pytest.fixture()
def producer(clickhouse: StackSettings, tmp_path: Path) -> Iterator[str]:
    """A producer polling one tester device of its own; yields the device id."""
    device = f"watched-{uuid.uuid4().hex[:8]}"
    devices = tmp_path / "devices.yaml"
    devices.write_text(
        f"- {{name: watched_value, device_id: {device}, url: 'tester://', update_every: 500}}\n"
    )
    proc = services.start_producers(clickhouse, devices, name="producers-watched")
    yield device
    proc.stop()


@pytest.fixture()
def prometheus(
    clickhouse: StackSettings, api_url: str, tmp_path: Path
) -> Iterator[tuple[Prometheus, Path]]:
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "1s"
    rules_file = tmp_path / "alerts.yml"
    rules_file.write_text(yaml.safe_dump(rules))
    producers = f"{clickhouse.host}:{clickhouse.producer_metrics_port}"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(rules_file)],
        "scrape_configs": [
            {"job_name": name, "static_configs": [{"targets": [target]}]}
            for name, target in (
                ("jobscope-api", _target(api_url)),
                ("jobscope-clickhouse", _target(clickhouse.clickhouse_url)),
                ("jobscope-producers", producers),
            )
        ],
    }
    server = Prometheus(
        ports.state_dir("monitoring") / "prometheus",
        ports.port("monitoring"),
        yaml.safe_dump(config, sort_keys=False),
    )
    server.start()
    yield server, rules_file
    server.stop()


def _value(server: Prometheus, promql: str) -> float | None:
    """The one value of an instant query, None when it has no series."""
    result = server.query(promql)
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else None


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_every_part_scraped_and_alerting(
    prometheus: tuple[Prometheus, Path],
    producer: str,
    api_url: str,
    reader_client: Client,
) -> None:
    server, _rules = prometheus

    def all_up() -> bool:
        up = {r["metric"]["job"]: r["value"][1] for r in server.query("up")}
        return up == dict.fromkeys(JOBS, "1")

    wait_until(all_up, 60, "every part's target up")

    # the API's request counter grows with requests made: 5 answered, 1 refused as too large
    route = 'jobscope_api_requests_total{route="/api/devices",status="2xx"}'
    before = _value(server, route) or 0.0
    for _ in range(5):
        assert _get(f"{api_url}/api/devices") == 200
    request = urllib.request.Request(f"{api_url}/api/jobs", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError, match="401"):  # a write without a token
        urllib.request.urlopen(request, timeout=10)
    _get(f"{api_url}/api/devices/{producer}/latest")  # counted by its template, not its path
    _get(f"{api_url}/no/such/{producer}")
    wait_until(
        lambda: (_value(server, route) or 0.0) >= before + 5, 30, "5 more /api/devices requests"
    )
    refused = 'jobscope_api_refused_requests_total{reason="unauthenticated"}'
    wait_until(lambda: (_value(server, refused) or 0) >= 1, 30, "the refused write counted")
    latency = 'jobscope_api_request_duration_seconds_count{route="/api/devices",method="GET"}'
    assert (_value(server, latency) or 0) >= 5
    template = 'jobscope_api_requests_total{route="/api/devices/{device_id}/latest"}'
    wait_until(lambda: _value(server, f"sum({template})"), 30, "the device request counted")
    unmatched = 'sum(jobscope_api_requests_total{route="<unmatched>",status="4xx"})'
    assert (_value(server, unmatched) or 0) >= 1
    assert server.query(f'{{__name__=~"jobscope_api_.+", route=~".*{producer}.*"}}') == []

    # a SQL query the server's guard refuses is counted by its reason
    denied = 'jobscope_clickhouse_refused_queries_total{reason="access_denied"}'
    before = _value(server, denied) or 0.0
    with pytest.raises(DatabaseError, match="497"):
        reader_client.query("SELECT * FROM file('/etc/passwd', 'LineAsString')")
    wait_until(lambda: (_value(server, denied) or 0) >= before + 1, 30, "the refusal counted")
    assert (_value(server, 'jobscope_clickhouse_queries_total{outcome="ok"}') or 0) > 0

    # the figures computed when scraped: numbers, and sane
    expected = {
        'jobscope_clickhouse_kafka_consumer_lag{table="default.readings_queue"}': (0, 1e6),
        'jobscope_kafka_consumer_group_lag{group="jobscope-clickhouse"}': (0, 1e6),
        'jobscope_kafka_topic_partitions{topic="readings"}': (6, 6),
        'sum(jobscope_kafka_under_replicated_partitions{topic="readings"})': (0, 0),
        "jobscope_kafka_up": (1, 1),
        "jobscope_kafka_brokers": (1, 1),
        'jobscope_clickhouse_rollup_refresh_age_seconds{view="default.metrics_1m_refresh"}': (
            0,
            120,
        ),
        "jobscope_clickhouse_data_bytes": (1, 1e12),
        "jobscope_clickhouse_disk_free_bytes": (1, 1e15),
        "jobscope_clickhouse_file_write_failures_total": (0, 0),
        'jobscope_clickhouse_engine_connections{pool="read_write"}': (0, 8),
        "jobscope_clickhouse_client_connections": (1, 1024),
        "jobscope_api_exports_streaming": (0, 8),
        "jobscope_api_live_streams": (0, 1000),
        f'jobscope_producer_readings_total{{device="{producer}"}}': (1, 1e9),
    }

    def present() -> dict[str, float | None]:
        return {name: _value(server, name) for name in expected}

    wait_until(lambda: None not in present().values(), 60, "every expected series")
    for name, value in present().items():
        low, high = expected[name]
        assert value is not None and low <= value <= high, f"{name} = {value}"

    # healthy: no alert pending or firing, over evaluations since every target was up
    assert server.query("ALERTS") == [], server.query("ALERTS")
    assert server.query("max_over_time(ALERTS[20s])") == []


def test_stopped_part_fires_its_alert(
    prometheus: tuple[Prometheus, Path], clickhouse: StackSettings, tmp_path: Path
) -> None:
    server, _rules = prometheus
    devices = tmp_path / "devices.yaml"
    devices.write_text("- {name: v, device_id: watched-stop, url: 'tester://'}\n")
    proc = services.start_producers(clickhouse, devices, name="producers-watched")
    try:
        wait_until(
            lambda: _value(server, 'up{job="jobscope-producers"}') == 1, 60, "the producer up"
        )
        assert _value(server, 'ALERTS{alertname="JobscopePartDown"}') is None
    finally:
        proc.stop()
    firing = 'ALERTS{alertname="JobscopePartDown",alertstate="firing",job="jobscope-producers"}'
    wait_until(lambda: _value(server, firing) == 1, 60, "JobscopePartDown firing")
