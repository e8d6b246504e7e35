"""A real OpenTelemetry Collector in front of jobscope's OTLP/HTTP endpoint (`POST /v1/metrics`),
as a site runs one: the OpenTelemetry Python SDK's OTLP/HTTP exporter sends to the Collector
(built from Go modules: tests/otelcol/), whose otlphttp exporter forwards to the API with an
agent token, once as protobuf (gzip) and once as JSON (uncompressed). ClickHouse holds exactly
what the SDK sent: value bits, microseconds, names and labels as api/otlp.py documents them;
the Collector counts every point sent, none failed, and logs no warning or error. With a token
that may not push for the node, the Collector counts every point failed, logs jobscope's
refusal, and nothing is stored.

Why the Collector: its contrib modules are served by the Go module proxy at one release with
the core (Telegraf's module is not), and ocb generates its sources from a few lines of config.
"""

from __future__ import annotations

import struct
import subprocess
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import pytest
from clickhouse_connect.driver.client import Client
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult, MetricsData
from opentelemetry.sdk.resources import Resource

from api.infra.tokens import Role, create_token
from stack import secrets, services
from stack.config import StackSettings
from stack.processes import wait_until
from tests import ports
from tests.api.otel_collector import SOURCES, TOKEN_VARIABLE, OtelCollector, config

API_PORT, RECEIVER_PORT, TELEMETRY_PORT = ports.ports("otel-collector")
NAMES = {
    "gpu.power": "gpu_power_watts",
    "node.energy": "node_energy_joules_total",
    "slurm.jobs": "slurm_jobs",
    "cpu.utilization": "cpu_utilization_ratio",
}
"""What the SDK sends (name, with its unit and kind) and the name jobscope stores (docs of
api/otlp.py: Prometheus' translation, unit words and `_total` for a monotonic sum)."""
LABELS = {"gpu": "gpu", "socket.id": "socket_id", "cpu": "cpu"}
"""Attribute keys and the label names they become."""
POWER = (
    {"0": 0.1, "1": 1.0000000000000002e-300, "2": -123456789.98765432},
    {"0": 250.5, "1": 5e-324, "2": 1.7976931348623157e308},
)
"""Per round, per GPU: values that print badly in decimal (a denormal, the largest double)."""
ENERGY = (9007199254740991, 1)
"""An int counter's increments: 2**53 - 1, then 2**53 (still exact as a double)."""
Encoding = Literal["proto", "json"]
Compression = Literal["gzip", "none"]
SENDS: list[tuple[Encoding, Compression]] = [("proto", "gzip"), ("json", "none")]
GENERATED = ("main.go", "main_others.go", "main_windows.go", "components.go", "go.mod", "go.sum")
"""What ocb writes from tests/otelcol/builder-config.yaml (committed, never edited by hand)."""


class Site:
    """An API with a device map and an agent token for the nodes of this module."""

    def __init__(self, secret: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.hosts = {enc: f"otel-{tag}-{enc}.cluster.test" for enc, _ in SENDS}
        self.nodes = {enc: f"otelnode-{tag}-{enc}" for enc, _ in SENDS}
        self.foreign = {enc: f"otelother-{tag}-{enc}" for enc, _ in SENDS}
        self.agent_user = f"agent-{tag}"
        self.agent = create_token(
            secret, self.agent_user, Role.AGENT, timedelta(hours=1), nodes=self.nodes.values()
        )
        self.url = ""

    def mapping(self) -> str:
        return "".join(f'"{self.hosts[enc]}": {self.nodes[enc]}\n' for enc, _ in SENDS)


@pytest.fixture(scope="module")
def site(clickhouse: StackSettings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    secret = secrets.load_or_create(clickhouse.state_dir)["JOBSCOPE_TOKEN_SECRET"]
    site = Site(secret)
    devices = tmp_path_factory.mktemp("otel-collector") / "push-devices.yaml"
    devices.write_text(site.mapping())
    name = "api-otel-collector"
    env = {"JOBSCOPE_PUSH_DEVICES": str(devices), "JOBSCOPE_RECORDS_INTERVAL_S": "0"}
    site.url = services.start_api(clickhouse, name=name, port=API_PORT, env=env)
    yield site
    services.process(clickhouse, name).stop()


def _collector(
    site: Site, state: Path, encoding: Encoding, compression: Compression, token: str
) -> OtelCollector:
    text = config(RECEIVER_PORT, TELEMETRY_PORT, f"{site.url}/v1/metrics", encoding, compression)
    return OtelCollector(state, text, RECEIVER_PORT, TELEMETRY_PORT, {TOKEN_VARIABLE: token})


def _sdk_send(endpoint: str, host: str) -> list[MetricsData]:
    """Two collections of the SDK's instruments on a resource named `host`, each exported by
    the SDK's OTLP/HTTP exporter to `endpoint`; what it exported."""
    reader = InMemoryMetricReader()
    resource = Resource.create({"host.name": host, "service.name": "jobscope-tests"})
    provider = MeterProvider(resource=resource, metric_readers=[reader])
    meter = provider.get_meter("jobscope.tests")
    round_ = [0]

    def power(_: CallbackOptions) -> list[Observation]:
        return [Observation(v, {"gpu": gpu}) for gpu, v in POWER[round_[0]].items()]

    meter.create_observable_gauge("gpu.power", [power], unit="W")
    energy = meter.create_counter("node.energy", unit="J")
    jobs = meter.create_up_down_counter("slurm.jobs", unit="{job}")
    utilisation = meter.create_gauge("cpu.utilization", unit="1")
    exporter = OTLPMetricExporter(endpoint=endpoint, timeout=10)
    sent = []
    for i, increment in enumerate(ENERGY):
        round_[0] = i
        energy.add(increment, {"socket.id": "0"})
        jobs.add(-3 + i, {})
        utilisation.set(0.75 / (i + 1), {"cpu": "3"})
        data = reader.get_metrics_data()
        assert data is not None
        assert exporter.export(data) is MetricExportResult.SUCCESS
        sent.append(data)
    exporter.shutdown()
    provider.shutdown()
    return sent


def _expected(sent: list[MetricsData], source: str) -> set[tuple[str, tuple[Any, ...], int, bytes]]:
    """(metric, labels, microseconds, value bits) of every point the SDK exported."""
    rows = set()
    for data in sent:
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        labels = {LABELS[k]: str(v) for k, v in point.attributes.items()}
                        labels["source"] = source
                        rows.add(
                            (
                                NAMES[metric.name],
                                tuple(sorted(labels.items())),
                                point.time_unix_nano // 1000,
                                struct.pack("<d", float(point.value)),
                            )
                        )
    return rows


def _stored(client: Client, device: str) -> set[tuple[str, tuple[Any, ...], int, bytes]]:
    rows = client.query(
        "SELECT metric_id, labels, toUnixTimestamp64Micro(timestamp), value FROM metrics "
        "WHERE device_id = {d:String}",
        parameters={"d": device},
    ).result_rows
    return {
        (metric, tuple(sorted(labels.items())), us, struct.pack("<d", value))
        for metric, labels, us, value in rows
    }


def _loud(collector: OtelCollector) -> list[dict[str, Any]]:
    return [r for r in collector.log_records() if r.get("level") in ("warn", "error")]


@pytest.mark.parametrize(("encoding", "compression"), SENDS)
def test_the_collector_forwards_what_the_sdk_sent_bit_for_bit(
    site: Site, admin_client: Client, tmp_path: Path, encoding: Encoding, compression: Compression
) -> None:
    collector = _collector(site, tmp_path / "otelcol", encoding, compression, site.agent)
    collector.start()
    try:
        sent = _sdk_send(collector.endpoint, site.hosts[encoding])
        expected = _expected(sent, f"agent:{site.agent_user}")
        points = len(expected)

        def forwarded() -> bool:
            failed = collector.counted("otelcol_exporter_send_failed_metric_points")
            assert failed == 0, f"the collector failed to send: {_loud(collector)}"
            return collector.counted("otelcol_exporter_sent_metric_points") >= points

        wait_until(forwarded, 30, f"{points} points sent by the collector")
        node = site.nodes[encoding]
        wait_until(
            lambda: len(_stored(admin_client, node)) >= points, 60, f"{points} rows of {node}"
        )
        metrics = collector.own_metrics()
        loud = _loud(collector)
    finally:
        collector.stop()
    assert _stored(admin_client, node) == expected
    assert {row[0] for row in expected} == set(NAMES.values())
    assert sum(len(d.resource_metrics[0].scope_metrics[0].metrics) for d in sent) == 8

    def total(name: str) -> float:
        return sum(v for k, v in metrics.items() if k.startswith(f"otelcol_{name}"))

    assert total("receiver_accepted_metric_points") == points
    assert total("exporter_sent_metric_points") == points
    assert total("receiver_refused_metric_points") == 0
    assert total("exporter_send_failed_metric_points") == 0
    assert total("exporter_enqueue_failed_metric_points") == 0
    assert loud == [], loud


@pytest.mark.parametrize(("encoding", "compression"), SENDS)
def test_a_node_the_token_may_not_push_for_is_a_failed_send_and_stores_nothing(
    site: Site, admin_client: Client, tmp_path: Path, encoding: Encoding, compression: Compression
) -> None:
    """jobscope's 403 reaches the collector as a permanent error (no retry): it counts the
    points failed and logs the refusal. The message inside jobscope's google.rpc.Status shows
    only with protobuf: the collector's otlphttp exporter (v0.165.0) decodes an error body as
    protobuf whatever its encoding, and jobscope answers a JSON request in JSON, as OTLP/HTTP
    says a server answers in the request's Content-Type."""
    foreign = site.foreign[encoding]
    collector = _collector(site, tmp_path / "otelcol", encoding, compression, site.agent)
    collector.start()
    try:
        sent = _sdk_send(collector.endpoint, f"{foreign}.example.org")
        points = len(_expected(sent, ""))
        wait_until(
            lambda: collector.counted("otelcol_exporter_send_failed_metric_points") >= points,
            30,
            f"{points} points failed",
        )
        sent_ok = collector.counted("otelcol_exporter_sent_metric_points")
        errors = [r for r in collector.log_records() if r.get("level") == "error"]
    finally:
        collector.stop()
    assert sent_ok == 0
    assert errors and all("403" in r.get("error", "") for r in errors), errors
    refusal = f"device {foreign!r} is not a node of agent"
    if encoding == "proto":
        assert any(refusal in r["error"] for r in errors), errors
    assert _stored(admin_client, foreign) == set()


def test_the_collector_sources_are_what_ocb_generates(tmp_path: Path) -> None:
    """tests/otelcol's Go sources are ocb's output for its builder-config.yaml, unedited: a
    component or version changed in one and not the other fails here."""
    done = subprocess.run(
        ["bash", str(SOURCES / "generate.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(GENERATED)
    for name in GENERATED:
        assert (SOURCES / name).read_bytes() == (tmp_path / name).read_bytes(), (
            f"tests/otelcol/{name} is not what ocb generates: run bash tests/otelcol/generate.sh"
        )
