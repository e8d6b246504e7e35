"""OTLP/HTTP metrics (`POST /v1/metrics`) against the real stack: OpenTelemetry's Python SDK
records gauges, a counter and an up-down counter with attributes, and its own OTLP/HTTP
exporter sends them with an agent token through the real API process to Kafka and
ClickHouse; ClickHouse holds exactly what the SDK collected (names and labels as documented,
value bits, timestamps to the microsecond). The same request as OTLP JSON (json_format) and as
gzip protobuf stores the same; a JSON body written by hand (int64 as strings, enums as
integers) too. What is not stored is counted in `partialSuccess`. Each bad request is a 4xx
with a google.rpc.Status (or, refused before the route, jobscope's error body) and stores
nothing: checked by a write after it that lands.
"""

from __future__ import annotations

import gzip
import struct
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import orjson
import pytest
from clickhouse_connect.driver.client import Client
from google.protobuf import json_format
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import Resource

from api import otlp, push
from api.infra.errors import TooLarge
from api.infra.tokens import Principal, Role, create_token
from api.otlp import labels_of, metric_id
from stack import secrets
from stack.config import StackSettings
from stack.processes import wait_until

PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}


def test_names_follow_prometheus_translation_of_otlp() -> None:
    cases = [
        (("gpu.power", "W", "gauge"), "gpu_power_watts"),
        (("http.server.duration", "s", "gauge"), "http_server_duration_seconds"),
        (("net.io", "By/s", "updown"), "net_io_bytes_per_second"),
        (("jobs.done", "{job}", "counter"), "jobs_done_total"),
        (("jobs_total.done", "1", "counter"), "jobs_done_total"),
        (("gpu.util", "1", "gauge"), "gpu_util_ratio"),
        (("gpu.util", "1", "updown"), "gpu_util"),
        (("memory__used-bytes", "By", "gauge"), "memory_used_bytes"),
        (("9lives", "", "gauge"), "_9lives"),
        (("x", "widgets", "gauge"), "x_widgets"),
    ]
    assert [metric_id(*given) for given, _ in cases] == [wanted for _, wanted in cases]

    def kv(key: str, **value: Any) -> KeyValue:
        return KeyValue(key=key, value=AnyValue(**value))

    labels = labels_of(
        "p",
        [
            kv("gpu.uuid", string_value="GPU-1"),
            kv("a--b", bool_value=True),
            kv("0x", int_value=-3),
            kv("d", double_value=0.5),
            kv("raw", bytes_value=b"\x00\xff"),
        ],
    )
    assert labels == {"gpu_uuid": "GPU-1", "a_b": "true", "key_0x": "-3", "d": "0.5", "raw": "AP8="}


# ---- against the real stack ---------------------------------------------------------------


@pytest.fixture(scope="module")
def agent(clickhouse: StackSettings) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    secret = secrets.load_or_create(clickhouse.state_dir)["JOBSCOPE_TOKEN_SECRET"]
    nodes = [f"otlp-{tag}", f"otlpjson-{tag}", f"otlpgz-{tag}", f"otlphand-{tag}"]
    user = f"agent-{tag}"
    token = create_token(secret, user, Role.AGENT, timedelta(hours=1), nodes=nodes)
    reader = create_token(secret, f"reader-{tag}", Role.USER, timedelta(hours=1))
    return {
        "node": nodes[0],
        "json": nodes[1],
        "gzip": nodes[2],
        "hand": nodes[3],
        "foreign": f"otlpother-{tag}",
        "token": token,
        "reader": reader,
        "source": push.source(Principal(user, Role.AGENT)),
    }


def _rows(client: Client, device: str) -> list[tuple[Any, ...]]:
    return client.query(
        "SELECT metric_id, labels, toUnixTimestamp64Micro(timestamp), value FROM metrics "
        "WHERE device_id = {d:String} ORDER BY metric_id, toString(labels), timestamp",
        parameters={"d": device},
    ).result_rows


def _bits(rows: list[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    """Rows with their values as float64 bits (0.1 compared bit for bit, not as printed)."""
    return {
        (m, tuple(sorted(labels.items())), at, struct.pack("<d", v)) for m, labels, at, v in rows
    }


def _post(url: str, body: bytes, token: str | None, **headers: str) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{url}/v1/metrics", content=body, headers=auth | headers, timeout=60)


def _on(request: ExportMetricsServiceRequest, host: str) -> ExportMetricsServiceRequest:
    """A copy of `request` whose every resource says `host.name: host`."""
    copy = ExportMetricsServiceRequest()
    copy.CopyFrom(request)
    for resource in copy.resource_metrics:
        for kv in resource.resource.attributes:
            if kv.key == "host.name":
                kv.value.string_value = host
    return copy


def _sdk_metrics(host: str) -> tuple[InMemoryMetricReader, Callable[[], None]]:
    """A MeterProvider for `host` with two gauges, a counter and an up-down counter; the
    returned function records their values."""
    reader = InMemoryMetricReader()
    resource = Resource.create({"host.name": f"{host}.example.org", "service.name": "gpu-agent"})
    meter = MeterProvider(resource=resource, metric_readers=[reader]).get_meter("jobscope.test")

    def power(_options: CallbackOptions) -> list[Observation]:
        return [
            Observation(0.1, {"gpu": "0", "gpu.uuid": "GPU-a"}),
            Observation(1.0000000000000002e-300, {"gpu": "1", "gpu.uuid": "GPU-b"}),
        ]

    meter.create_observable_gauge("gpu.power", [power], unit="W")
    temperature = meter.create_gauge("gpu.temperature", unit="Cel")
    energy = meter.create_counter("gpu.energy", unit="J")
    busy = meter.create_up_down_counter("jobs.running", unit="{job}")

    def record() -> None:
        temperature.set(-123456789.98765432, {"gpu": "0"})
        energy.add(3, {"gpu": "0"})
        energy.add(4.25, {"gpu": "0"})
        busy.add(5, {"queue": "batch"})
        busy.add(-7, {"queue": "batch"})

    return reader, record


def test_the_sdk_exports_and_clickhouse_holds_exactly_it(
    api_url: str, agent: dict[str, str], admin_client: Client
) -> None:
    reader, record = _sdk_metrics(agent["node"])
    record()
    data = reader.get_metrics_data()
    assert data is not None
    exporter = OTLPMetricExporter(
        endpoint=f"{api_url}/v1/metrics",
        headers={"Authorization": f"Bearer {agent['token']}"},
        timeout=30,
    )
    assert exporter.export(data) is MetricExportResult.SUCCESS
    sent = encode_metrics(data)  # what the exporter posted, as a message
    source = agent["source"]
    expected = []
    names = {
        "gpu.power": "gpu_power_watts",
        "gpu.temperature": "gpu_temperature_celsius",
        "gpu.energy": "gpu_energy_joules_total",
        "jobs.running": "jobs_running",
    }
    for scope in sent.resource_metrics[0].scope_metrics:
        for metric in scope.metrics:
            points = getattr(metric, metric.WhichOneof("data")).data_points
            for point in points:
                labels = {
                    kv.key.replace(".", "_"): kv.value.string_value for kv in point.attributes
                }
                value = point.as_double if point.HasField("as_double") else float(point.as_int)
                at = point.time_unix_nano // 1000
                expected.append((names[metric.name], {**labels, "source": source}, at, value))
    assert len(expected) == 5
    wait_until(lambda: len(_rows(admin_client, agent["node"])) == 5, 30, "the SDK's readings")
    stored = _rows(admin_client, agent["node"])
    assert _bits(stored) == _bits(expected)
    assert {(m, v) for m, _, _, v in stored} >= {
        ("gpu_energy_joules_total", 7.25),
        ("jobs_running", -2.0),
        ("gpu_temperature_celsius", -123456789.98765432),
    }

    # the same request as OTLP JSON, and as gzip protobuf: the same readings
    as_json = json_format.MessageToJson(_on(sent, agent["json"])).encode()
    response = _post(api_url, as_json, agent["token"], **JSON)
    assert response.status_code == 200, response.text
    assert response.json() == {} and response.headers["X-Jobscope-Accepted"] == "5"
    as_gzip = gzip.compress(_on(sent, agent["gzip"]).SerializeToString())
    response = _post(api_url, as_gzip, agent["token"], **PROTOBUF, **{"Content-Encoding": "gzip"})
    assert response.status_code == 200, response.text
    assert ExportMetricsServiceResponse.FromString(response.content).ByteSize() == 0
    for device in (agent["json"], agent["gzip"]):
        wait_until(lambda d=device: len(_rows(admin_client, d)) == 5, 30, f"{device}'s readings")
        assert _bits(_rows(admin_client, device)) == _bits(stored)


def test_a_hand_written_json_request_with_int64_as_strings(
    api_url: str, agent: dict[str, str], admin_client: Client
) -> None:
    """As a Collector's otlphttp exporter writes JSON: camelCase, int64 as strings, enums as
    integers; at Prometheus' path. A histogram, a delta sum, a NaN and a point with no recorded
    value are not stored: counted in partialSuccess."""
    at_ns = time.time_ns() - 5_000_000_123
    stamp = str(at_ns)

    def point(**value: Any) -> dict[str, Any]:
        return {"timeUnixNano": stamp, "startTimeUnixNano": "1", **value}

    body = {
        "resourceMetrics": [
            {
                "resource": {
                    "attributes": [
                        {"key": "service.instance.id", "value": {"stringValue": agent["hand"]}}
                    ]
                },
                "scopeMetrics": [
                    {
                        "scope": {"name": "otelcol/hostmetrics"},
                        "metrics": [
                            {
                                "name": "system.cpu.time",
                                "unit": "s",
                                "sum": {
                                    "aggregationTemporality": 2,
                                    "isMonotonic": True,
                                    "dataPoints": [
                                        point(
                                            asInt="9007199254740993",
                                            attributes=[
                                                {"key": "cpu", "value": {"stringValue": "cpu7"}},
                                                {"key": "n", "value": {"intValue": "12"}},
                                            ],
                                        )
                                    ],
                                },
                            },
                            {
                                "name": "load",
                                "gauge": {
                                    "dataPoints": [
                                        point(asDouble=0.25),
                                        point(asDouble="NaN"),
                                        point(asDouble=1.0, flags=1),
                                    ]
                                },
                            },
                            {
                                "name": "delta",
                                "sum": {
                                    "aggregationTemporality": 1,
                                    "dataPoints": [point(asInt=1)],
                                },
                            },
                            {
                                "name": "latency",
                                "histogram": {
                                    "aggregationTemporality": 2,
                                    "dataPoints": [{"timeUnixNano": stamp, "count": "3"}],
                                },
                            },
                        ],
                    }
                ],
            }
        ]
    }
    response = httpx.post(
        f"{api_url}/api/v1/otlp/v1/metrics",
        content=orjson.dumps(body),
        headers={"Authorization": f"Bearer {agent['token']}", **JSON},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert response.headers["X-Jobscope-Accepted"] == "2"
    partial = response.json()["partialSuccess"]
    assert partial["rejectedDataPoints"] == "4"
    for said in ("1 NaN or infinite", "1 with no recorded value", "1 of delta", "1 of histograms"):
        assert said in partial["errorMessage"], partial
    source = agent["source"]
    at_us = at_ns // 1000
    wait_until(lambda: len(_rows(admin_client, agent["hand"])) == 2, 30, "the hand-written rows")
    assert _rows(admin_client, agent["hand"]) == [
        ("load", {"source": source}, at_us, 0.25),
        (
            "system_cpu_time_seconds_total",
            {"cpu": "cpu7", "n": "12", "source": source},
            at_us,
            float(9007199254740993),
        ),
    ]


def _request(host: str | None, name: str, **attributes: str) -> bytes:
    """A protobuf request of one gauge point now, from `host` (no host.name if None)."""
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add()
    if host is not None:
        resource.resource.attributes.add(key="host.name").value.string_value = host
    metric = resource.scope_metrics.add().metrics.add(name=name)
    point = metric.gauge.data_points.add(time_unix_nano=time.time_ns() - 10**9, as_double=1.5)
    for key, value in attributes.items():
        point.attributes.add(key=key).value.string_value = value
    return request.SerializeToString()


def _many_points(host: str, count: int) -> bytes:
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add()
    resource.resource.attributes.add(key="host.name").value.string_value = host
    gauge = resource.scope_metrics.add().metrics.add(name="otlpbad").gauge
    now = time.time_ns()
    for i in range(count):
        gauge.data_points.add(time_unix_nano=now - i * 1000, as_double=1.0)
    return request.SerializeToString()


def _many_points_json(host: str, count: int) -> bytes:
    """OTLP's JSON of `count` gauge points, written without protobuf (its JSON writer is as
    slow as its parser)."""
    point = {"timeUnixNano": str(time.time_ns()), "asDouble": 1.0}
    resource = {"attributes": [{"key": "host.name", "value": {"stringValue": host}}]}
    metric = {"name": "otlpbad", "gauge": {"dataPoints": [point] * count}}
    tree = {"resourceMetrics": [{"resource": resource, "scopeMetrics": [{"metrics": [metric]}]}]}
    return orjson.dumps(tree)


def test_a_json_request_over_the_points_limit_is_refused_before_protobuf_reads_it() -> None:
    """protobuf's JSON parser takes about 9 µs a point (2.75 s for 300,000): a body of 500,000
    points, gzip making it small on the wire, is counted and refused before that parser runs,
    in well under the 4.5 s it would hold the API's interpreter."""
    body = _many_points_json("node-1", 500_000)
    started = time.monotonic()
    with pytest.raises(TooLarge, match="500000 data points"):
        otlp.decode(body, otlp.JSON, "", len(body), 10_000)
    assert time.monotonic() - started < 1.5


BAD = [
    # case, body (a function of the agent's names), token, headers, status, google.rpc.Code, says
    ("text/plain", lambda a: b"x", "token", {"Content-Type": "text/plain"}, 415, 12, "OTLP/HTTP"),
    ("no content type", lambda a: _request(a["node"], "otlpbad"), "token", {}, 415, 12, "sends"),
    ("corrupt protobuf", lambda a: b"\x0a\xff\xff\xff", "token", PROTOBUF, 400, 3, "corrupt"),
    ("invalid JSON", lambda a: b'{"resourceMetrics": [', "token", JSON, 400, 3, "OTLP's JSON"),
    ("JSON of another shape", lambda a: b'{"resourceMetrics": 3}', "token", JSON, 400, 3, "JSON"),
    ("deep JSON", lambda a: b"[" * 100_000, "token", JSON, 400, 3, "JSON"),
    (
        "a gzip bomb",  # 64 KiB on the wire, 64 MiB once decompressed
        lambda a: gzip.compress(b"\x00" * (64 << 20), compresslevel=9),
        "token",
        {**PROTOBUF, "Content-Encoding": "gzip"},
        413,
        8,
        "decompressed",
    ),
    (
        "an oversize body",
        lambda a: b"\x00" * (16 * 1024 * 1024 + 1),
        "token",
        PROTOBUF,
        413,
        8,
        "JOBSCOPE_PUSH_MAX_BODY_BYTES",
    ),
    (
        "too many data points",
        lambda a: _many_points(a["node"], 10_001),
        "token",
        PROTOBUF,
        413,
        8,
        "10001 data points",
    ),
    (
        "too many data points as JSON",
        lambda a: _many_points_json(a["node"], 10_001),
        "token",
        JSON,
        413,
        8,
        "10001 data points",
    ),
    (
        "another encoding",
        lambda a: _request(a["node"], "otlpbad"),
        "token",
        {**PROTOBUF, "Content-Encoding": "br"},
        415,
        12,
        "gzip",
    ),
    (
        "no host.name",
        lambda a: _request(None, "otlpbad"),
        "token",
        PROTOBUF,
        400,
        3,
        "no host.name or service.instance.id",
    ),
    (
        "a host.name that is an address",
        lambda a: _request("10.1.2.3", "otlpbad"),
        "token",
        PROTOBUF,
        400,
        3,
        "host.name '10.1.2.3' names no device",
    ),
    (
        "a node not in the agent's token",
        lambda a: _request(a["foreign"], "otlpbad"),
        "token",
        PROTOBUF,
        403,
        7,
        "is not a node of agent",
    ),
    (
        "a reserved label",
        lambda a: _request(a["node"], "otlpbad", _device_alias=a["foreign"]),
        "token",
        PROTOBUF,
        400,
        3,
        "attributes._device_alias: labels starting with '_' are reserved",
    ),
    (
        "a reader's token",
        lambda a: _request(a["node"], "otlpbad"),
        "reader",
        JSON,
        403,
        7,
        "agent",
    ),
]


@pytest.mark.parametrize(
    ("case", "body", "token", "headers", "status", "code", "says"), BAD, ids=[b[0] for b in BAD]
)
def test_bad_requests_are_refused_and_store_nothing(
    api_url: str,
    agent: dict[str, str],
    admin_client: Client,
    case: str,
    body: Callable[[dict[str, str]], bytes],
    token: str,
    headers: dict[str, str],
    status: int,
    code: int,
    says: str,
) -> None:
    response = _post(api_url, body(agent), agent[token], **headers)
    assert response.status_code == status, f"{case}: {response.text[:500]}"
    if response.headers["content-type"] == PROTOBUF["Content-Type"]:
        answer = Status.FromString(response.content)
    else:
        answer = json_format.Parse(response.content, Status())
    assert answer.code == code and says in answer.message, f"{case}: {answer}"
    _nothing_stored(api_url, agent, admin_client)


def test_no_token_is_a_401(api_url: str, agent: dict[str, str], admin_client: Client) -> None:
    """Refused before the body is read (as every write): jobscope's error body."""
    response = _post(api_url, _request(agent["node"], "otlpbad"), None, **PROTOBUF)
    assert response.status_code == 401 and "bearer" in response.json()["error"]
    _nothing_stored(api_url, agent, admin_client)


def _nothing_stored(api_url: str, agent: dict[str, str], admin_client: Client) -> None:
    """A good request after the refused one lands; nothing of the refused one ever does."""
    marker = f"otlpmark_{uuid.uuid4().hex[:8]}"
    after = _post(api_url, _request(agent["node"], marker), agent["token"], **PROTOBUF)
    assert after.status_code == 200, after.text
    wait_until(
        lambda: any(r[0] == marker for r in _rows(admin_client, agent["node"])),
        30,
        "the request after",
    )
    assert "otlpbad" not in {r[0] for r in _rows(admin_client, agent["node"])}
    assert _rows(admin_client, agent["foreign"]) == []
