"""Prometheus remote_write (`POST /api/v1/write`) against the real stack: Debian's Prometheus
scrapes Debian's node_exporter and remote-writes to an API with a device map, with an agent
token; what lands in ClickHouse is, sample for sample and bit for bit, what Prometheus holds,
named as documented. Hand-built writes (an encoder written here, apart from the decoder) show
the mapping, the skipped NaN and stale markers, and that each bad write is a 4xx that stores
nothing: wrong content type, corrupt snappy, a snappy bomb, truncated protobuf, a series with
no device, a node not in the token, a reserved label; Kafka down is a 503 (Prometheus retries).
"""

from __future__ import annotations

import math
import struct
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import cramjam
import httpx
import pytest
from clickhouse_connect.driver.client import Client
from fastapi.testclient import TestClient

from api import remote_write
from api.infra.config import ApiSettings
from api.infra.errors import TooLarge
from api.infra.tokens import Role, create_token
from api.main import create_app
from api.registry import SHIPPED, load
from stack import secrets, services
from stack.config import StackSettings
from stack.processes import wait_until
from stack.simulators.dcgm_exporter import DcgmExporter
from stack.simulators.node_exporter import NodeExporter
from stack.simulators.prometheus import Prometheus, gpu_remote_write_config
from tests import ports

EXPORTER_PORT, API_PORT, PROMETHEUS_PORT = ports.ports("remote-write")
HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
STALE = struct.unpack("<d", struct.pack("<Q", remote_write.STALE_NAN))[0]
COMPARED = ("node_load1", "node_cpu_seconds_total", "rw_exact", "up")
DCGM_AS = {
    "gpu_power_watt": ("DCGM_FI_DEV_POWER_USAGE", 1.0),  # W
    "gpu_energy_joules_total": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),  # mJ
    "gpu_utilization_percent": ("DCGM_FI_DEV_GPU_UTIL", 1.0),
    "gpu_memory_utilization_percent": ("DCGM_FI_DEV_MEM_COPY_UTIL", 1.0),
    "gpu_temp_celsius": ("DCGM_FI_DEV_GPU_TEMP", 1.0),
    "gpu_memory_temp_celsius": ("DCGM_FI_DEV_MEMORY_TEMP", 1.0),
    "gpu_memory_used_bytes": ("DCGM_FI_DEV_FB_USED", 1048576.0),  # MiB
    "gpu_sm_clock_hertz": ("DCGM_FI_DEV_SM_CLOCK", 1e6),  # MHz
}
"""jobscope's GPU metric <- dcgm-exporter's counter and the factor to its base unit, as
dcgm-exporter documents its default counters (the rules shipped in examples/prometheus/)."""


# ---- a WriteRequest encoder, written from the protobuf spec apart from the decoder ------------


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 as protobuf writes it: two's complement, 10 bytes if negative
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _len(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _sample(value: float, ms: int) -> bytes:
    return _varint(1 << 3 | 1) + struct.pack("<d", value) + _varint(2 << 3) + _varint(ms)


def write_request(*series: tuple[dict[str, str], list[tuple[float, int]]]) -> bytes:
    body = b""
    for labels, samples in series:
        one = b"".join(
            _len(1, _len(1, k.encode()) + _len(2, v.encode())) for k, v in labels.items()
        )
        one += b"".join(_len(2, _sample(v, ms)) for v, ms in samples)
        body += _len(1, one)
    return body


def snappy(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


def now_ms(back_s: float = 0) -> int:
    return int((time.time() - back_s) * 1000)


# ---- the decoder alone --------------------------------------------------------------------


def test_the_decoder_reads_what_the_encoder_wrote_and_skips_unknown_fields() -> None:
    labels = {"__name__": "m", "instance": "n:1", "é": "∞"}
    samples = [(1e-300, -5), (-0.0, 2**62), (STALE, 0)]
    data = write_request((labels, samples))
    # an unknown field of each wire type in the WriteRequest (metadata is field 3)
    data += _varint(9 << 3) + _varint(300) + _varint(10 << 3 | 5) + b"abcd"
    data += _varint(11 << 3 | 1) + b"12345678" + _len(3, b"metadata")
    (series,), histograms = remote_write.decode(data, 10)
    assert dict(series.labels) == labels and histograms == 0
    got = [(struct.pack("<d", v), ms) for v, ms in series.samples]
    assert got == [(struct.pack("<d", v), ms) for v, ms in samples]  # bit for bit


def test_every_truncation_and_bad_wire_type_is_malformed() -> None:
    data = write_request(({"__name__": "m", "instance": "n:1"}, [(1.5, 1), (2.5, 2)]))
    for end in range(1, len(data)):
        try:
            remote_write.decode(data[:end], 10)
        except remote_write.Malformed:
            continue
        raise AssertionError(f"a body cut at {end} of {len(data)} bytes was read")
    for bad in (b"\x0b", b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x00"):
        with pytest.raises(remote_write.Malformed):
            remote_write.decode(bad, 10)
    with pytest.raises(TooLarge):
        remote_write.decode(data, 1)


def test_a_snappy_bomb_is_refused_before_decompressing() -> None:
    """A 6-byte body whose header announces 4 GiB, and one announcing 1 byte over the limit:
    refused before any buffer for it is allocated."""
    tracemalloc.start()
    try:
        for size in (2**32 - 1, 16 * 1024 * 1024 + 1):
            with pytest.raises(TooLarge, match=f"announces {size} bytes"):
                remote_write.decompress(_varint(size) + b"\x00", 16 * 1024 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024
    with pytest.raises(remote_write.Malformed):
        remote_write.decompress(_varint(200) + snappy(b"x" * 100)[1:], 1000)  # header lies


# ---- against the real stack ---------------------------------------------------------------


class Site:
    """An API with a device map, an agent token for its nodes, and helpers."""

    def __init__(self, url: str, secret: str, admin: str, pid: int) -> None:
        self.url = f"{url}/api/v1/write"
        self.secret = secret
        self.admin = admin
        self.pid = pid
        tag = uuid.uuid4().hex[:8]
        self.node = f"rw-{tag}"  # what the map names the scraped exporter
        self.named = f"rwhost-{tag}"  # a device named by its instance's host name
        self.pdu = f"rwpdu-{tag}"  # a device measuring self.node (device_alias)
        self.foreign = f"rwother-{tag}"
        self.gpu_node = f"rwgpu-{tag}"  # a node whose GPUs' exporter Prometheus scrapes
        self.agent_user = f"agent-{tag}"
        self.agent = create_token(
            secret,
            self.agent_user,
            Role.AGENT,
            timedelta(hours=1),
            nodes=[self.node, self.named, self.pdu, self.gpu_node],
        )

    def mapping(self) -> str:
        return (
            f'"127.0.0.1:{EXPORTER_PORT}": {self.node}\n'
            f'"{self.pdu}.example.org:9116": {{device_id: {self.pdu}, device_alias: {self.node}}}\n'
        )

    def post(self, body: bytes, token: str | None = None, **headers: str) -> httpx.Response:
        auth = {"Authorization": f"Bearer {token or self.agent}"} if token != "" else {}
        return httpx.post(
            self.url, content=body, headers={**HEADERS, **auth, **headers}, timeout=30
        )


@pytest.fixture(scope="module")
def site(
    clickhouse: StackSettings, api_tokens: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    secret = secrets.load_or_create(clickhouse.state_dir)["JOBSCOPE_TOKEN_SECRET"]
    devices = tmp_path_factory.mktemp("remote-write") / "push-devices.yaml"
    placeholder = Site("", secret, api_tokens["admin"], 0)
    devices.write_text(placeholder.mapping())
    name = "api-remote-write"
    env = {"JOBSCOPE_PUSH_DEVICES": str(devices), "JOBSCOPE_RECORDS_INTERVAL_S": "0"}
    url = services.start_api(clickhouse, name=name, port=API_PORT, env=env)
    pid = services.process(clickhouse, name).pid()
    assert pid is not None
    placeholder.url, placeholder.pid = f"{url}/api/v1/write", pid
    yield placeholder
    services.process(clickhouse, name).stop()


def _rows(client: Client, device: str, metric: str | None = None) -> list[tuple[Any, ...]]:
    return client.query(
        "SELECT metric_id, labels, toUnixTimestamp64Milli(timestamp), value FROM metrics "
        "WHERE device_id = {d:String} AND ({m:String} = '' OR metric_id = {m:String}) "
        "ORDER BY metric_id, timestamp",
        parameters={"d": device, "m": metric or ""},
    ).result_rows


def test_prometheus_remote_writes_what_it_scraped_bit_for_bit(
    site: Site, admin_client: Client, tmp_path: Path
) -> None:
    """node_exporter (with a textfile of values that print badly in decimal, a NaN and an
    infinity) scraped every second; Prometheus remote-writes with the agent token. For each
    compared series, ClickHouse holds exactly Prometheus' samples up to its newest stored one:
    same timestamps (ms), same value bits, labels less `instance` and `job`, plus `source`."""
    exporter = NodeExporter(tmp_path / "node-exporter", EXPORTER_PORT)
    exporter.start()
    exporter.push(
        "rw.prom",
        'rw_exact{gpu="0"} 0.1\nrw_exact{gpu="1"} 1.0000000000000002e-300\n'
        'rw_exact{gpu="2"} -123456789.98765432\nrw_nan NaN\nrw_inf +Inf\n',
    )
    token = tmp_path / "token"
    token.write_text(site.agent)
    config = f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - job_name: node
    static_configs: [{{targets: ["127.0.0.1:{EXPORTER_PORT}"]}}]
remote_write:
  - url: {site.url}
    authorization: {{credentials_file: {token}}}
    queue_config: {{batch_send_deadline: 1s, min_backoff: 100ms, max_backoff: 1s}}
"""
    prometheus = Prometheus(tmp_path / "prometheus", PROMETHEUS_PORT, config)
    prometheus.start()
    try:
        wait_until(
            lambda: len({r[2] for r in _rows(admin_client, site.node, "rw_exact")}) >= 3,
            60,
            f"3 scrapes of rw_exact in ClickHouse; Prometheus' log: {prometheus.log_tail()}",
        )
        stored = _rows(admin_client, site.node)
        sent = prometheus.own_metrics()
        held = prometheus.query(
            f'{{__name__=~"{"|".join(COMPARED)}",instance="127.0.0.1:{EXPORTER_PORT}"}}[1h]'
        )
    finally:
        prometheus.stop()
        exporter.stop()

    def counted(name: str) -> float:
        return sum(v for k, v in sent.items() if k.startswith(f"prometheus_remote_storage_{name}"))

    # every write Prometheus sent was accepted: none refused (4xx), none to retry (5xx)
    assert counted("samples_total") >= len(stored) > 0
    assert counted("samples_failed_total") == counted("samples_retried_total") == 0
    assert counted("samples_dropped_total") == 0
    source = f"agent:{site.agent_user}"
    ours: dict[tuple[str, frozenset[tuple[str, str]]], set[tuple[int, bytes]]] = {}
    for metric, labels, ms, value in stored:
        assert labels.pop("source") == source and "instance" not in labels and "job" not in labels
        key = (metric, frozenset(labels.items()))
        ours.setdefault(key, set()).add((ms, struct.pack("<d", value)))
    assert not {m for m, _ in ours} & {"rw_nan", "rw_inf"}, "non-finite samples are skipped"
    assert len({key for key in ours if key[0] == "rw_exact"}) == 3
    assert len({key for key in ours if key[0] == "node_cpu_seconds_total"}) >= 2
    compared = 0
    for series in held:
        labels = dict(series["metric"])
        metric = labels.pop("__name__")
        assert labels.pop("instance") == f"127.0.0.1:{EXPORTER_PORT}" and labels.pop("job")
        key = (metric, frozenset(labels.items()))
        theirs = {(round(t * 1000), struct.pack("<d", float(v))) for t, v in series["values"]}
        assert key in ours, f"{key} never reached ClickHouse"
        newest = max(ms for ms, _ in ours[key])
        assert ours[key] == {s for s in theirs if s[0] <= newest}, key
        compared += len(ours[key])
    assert {m for m, _ in ours} >= set(COMPARED) and compared >= 3 * len(held)


def _series(rows: list[tuple[Any, ...]], gpus: set[str]) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(ms, value)] of the stored rows of `gpus`, in time order."""
    got: dict[str, list[tuple[int, float]]] = {}
    for metric, labels, ms, value in rows:
        if labels["gpu"] in gpus:
            got.setdefault(metric, []).append((ms, value))
    return got


def test_a_gpu_exporter_through_prometheus_is_split_between_the_jobs_holding_the_gpus(
    site: Site,
    admin_client: Client,
    api_url: str,
    post_job: Callable[..., dict[str, Any]],
    tmp_path: Path,
) -> None:
    """The shipped path for a site's GPUs (examples/prometheus/, what `make up DEVICES=sample`
    runs): Prometheus scrapes dcgm-exporter's default counters (the simulator: 4 H100s, no GPU
    here), its recording rules name them as jobscope does and remote_write sends them with an
    agent token. ClickHouse holds Prometheus' recorded series bit for bit, under registry
    names, labelled gpu, gpu_uuid and source only. Job A holds GPUs 0-1 of the node, job B
    GPUs 2-3: each one's readings, summary and energy are its own GPUs' (measured: an
    agent's readings are not a user's pushed values)."""
    exporter = DcgmExporter(tmp_path / "dcgm", EXPORTER_PORT, gpus=4, hostname=site.gpu_node)
    exporter.start()
    token = tmp_path / "token"
    token.write_text(site.agent)
    instance = f"{site.gpu_node}:9400"
    config = gpu_remote_write_config(
        f"127.0.0.1:{EXPORTER_PORT}", instance, site.url.removesuffix("/api/v1/write"), token, 1
    )
    prometheus = Prometheus(tmp_path / "prometheus", PROMETHEUS_PORT, config)
    prometheus.start()

    def evaluations() -> int:
        energy = _series(_rows(admin_client, site.gpu_node, "gpu_energy_joules_total"), {"0"})
        return len(energy.get("gpu_energy_joules_total", []))

    try:
        wait_until(
            lambda: evaluations() >= 8,
            90,
            f"8 rule evaluations in ClickHouse; Prometheus' log: {prometheus.log_tail()}",
        )
        held = prometheus.query(f'{{__name__=~"gpu_.*",instance="{instance}"}}[1h]')
        scraped = prometheus.query(f'{{__name__=~"DCGM_.*",instance="{instance}"}}[1h]')
        stored = _rows(admin_client, site.gpu_node)
    finally:
        prometheus.stop()
        exporter.stop()
    registry = load(SHIPPED)
    assert {r[0] for r in stored} == set(DCGM_AS), "every mapped series, and nothing else"
    assert [m for m in sorted(DCGM_AS) if registry.lookup(m).inferred] == []
    raw = {
        (s["metric"]["__name__"], s["metric"]["gpu"]): [
            (round(t * 1000), float(v)) for t, v in s["values"]
        ]
        for s in scraped
    }
    for metric, labels, ms, value in stored:  # the rule's value: the last scrape's, in base units
        name, factor = DCGM_AS[metric]
        last = [v for t, v in raw[(name, labels["gpu"])] if t <= ms][-1]
        assert value == pytest.approx(last * factor, rel=1e-12), (metric, labels, ms)
    uuids = {labels["gpu"]: labels["gpu_uuid"] for _, labels, _, _ in stored}
    assert sorted(uuids) == ["0", "1", "2", "3"] and len(set(uuids.values())) == 4
    for metric, labels, _, _ in stored:
        assert set(labels) == {"gpu", "gpu_uuid", "source"}, (metric, labels)
        assert labels["source"] == f"agent:{site.agent_user}"
    ours = {(m, lab["gpu"], ms): struct.pack("<d", v) for m, lab, ms, v in stored}
    newest = max(ms for _, _, ms in ours)
    for series in held:
        key = (series["metric"]["__name__"], series["metric"]["gpu"])
        theirs = {(*key, round(t * 1000)): struct.pack("<d", float(v)) for t, v in series["values"]}
        assert {k: v for k, v in ours.items() if k[:2] == key} == {
            k: v for k, v in theirs.items() if k[2] <= newest
        }, key

    times = sorted({ms for _, _, ms in ours})
    start, end = times[1] - 500, times[-2] + 500  # whole evaluations, none on a boundary
    inside = [r for r in stored if start < r[2] < end]
    for job, gpus in ((f"{site.gpu_node}-a", {"0", "1"}), (f"{site.gpu_node}-b", {"2", "3"})):
        post_job(
            job_id=job,
            user="alice",
            nodes=[site.gpu_node],
            state="terminated",
            start=_iso_ms(start),
            end=_iso_ms(end),
            allocations={site.gpu_node: {"gpus": sorted(gpus)}},
        )
        own = _series(inside, gpus)
        got = httpx.get(f"{api_url}/api/jobs/{job}/summary", timeout=30).json()
        power = [m for m in got["metrics"] if m["metric_id"] == "gpu_power_watt"]
        assert [(p["count"], p["pushed"]) for p in power] == [(len(own["gpu_power_watt"]), False)]
        energy = {e["metric_id"]: e for e in got["energy"]}
        counter = energy["gpu_energy_joules_total"]
        deltas = 0.0
        for gpu in gpus:
            by_gpu = _series(inside, {gpu})["gpu_energy_joules_total"]
            deltas += by_gpu[-1][1] - by_gpu[0][1]
        assert counter["role"] == "gpu" and not counter["pushed"]
        assert counter["joules"] == pytest.approx(deltas, rel=1e-9), (job, counter, deltas)
        listed = httpx.get(
            f"{api_url}/api/jobs/{job}/metrics",
            params={"metrics": "gpu_power_watt"},
            timeout=30,
        ).json()
        assert {r["labels"]["gpu"] for r in listed} == gpus


def _iso_ms(ms: int) -> str:
    return f"{datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec='milliseconds')[:-6]}Z"


def test_a_hand_built_write_is_mapped_and_counts_what_it_skips(
    site: Site, admin_client: Client
) -> None:
    at = now_ms(5)
    body = write_request(
        (
            {
                "__name__": "gpu_power_watt",
                "instance": f"{site.named}.example.org:9400",
                "job": "dcgm",
                "gpu": "3",
                "host": "kept",
            },
            [(250.5, at), (math.nan, at + 1), (STALE, at + 2), (math.inf, at + 3)],
        ),
        (
            {
                "__name__": "pdu_outlet_power_watt",
                "instance": f"{site.pdu}.example.org:9116",
                "outlet": "4",
            },
            [(97.25, at)],
        ),
        ({"__name__": "rw_by_host", "host": site.named}, [(1.0, at)]),
    )
    response = site.post(snappy(body))
    assert response.status_code == 200, response.text
    assert response.json() == {
        "accepted": 3,
        "skipped": {"stale": 1, "non_finite": 2, "histograms": 0},
    }
    empty = site.post(snappy(b""))  # Prometheus' metadata-only writes carry no series
    assert empty.status_code == 200 and empty.json()["accepted"] == 0, empty.text
    source = f"agent:{site.agent_user}"
    wait_until(lambda: _rows(admin_client, site.named, "rw_by_host") != [], 30, "the host's row")
    assert _rows(admin_client, site.named, "gpu_power_watt") == [
        ("gpu_power_watt", {"gpu": "3", "host": "kept", "source": source}, at, 250.5)
    ]
    assert _rows(admin_client, site.named, "rw_by_host") == [
        ("rw_by_host", {"source": source}, at, 1.0)
    ]
    wait_until(lambda: _rows(admin_client, site.pdu) != [], 30, "the PDU's row")
    assert _rows(admin_client, site.pdu) == [
        (
            "pdu_outlet_power_watt",
            {"outlet": "4", "source": source, "_device_alias": site.node},
            at,
            97.25,
        )
    ]


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_bad_writes_are_refused_and_store_nothing(site: Site, admin_client: Client) -> None:
    at = now_ms(5)
    good = ({"__name__": "rw_refused", "instance": f"{site.named}:9100"}, [(1.0, at)])
    valid = snappy(write_request(good))
    pusher = create_token(site.secret, "rw-nobody", Role.PUSHER, timedelta(hours=1))
    reader = create_token(site.secret, "rw-reader", Role.USER, timedelta(hours=1))

    def series(**labels: str) -> tuple[dict[str, str], list[tuple[float, int]]]:
        return {"__name__": "rw_refused", **labels}, [(2.0, at)]

    refusals: list[tuple[str, bytes, dict[str, str], str | None, int, str]] = [
        ("no token", valid, {}, "", 401, "missing bearer token"),
        ("a reader's token", valid, {}, reader, 403, "agent"),
        ("JSON", b'{"a": 1}', {"Content-Type": "application/json"}, None, 415, "x-protobuf"),
        (
            "remote_write 2.0",
            valid,
            {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"},
            None,
            415,
            "2.0",
        ),
        (
            "not compressed",
            write_request(good),
            {"Content-Encoding": "identity"},
            None,
            415,
            "snappy",
        ),
        ("corrupt snappy", valid[:1] + b"\xff" * 20, {}, None, 400, "corrupt snappy"),
        ("a snappy bomb", _varint(2**32 - 1) + b"\x00" * 8, {}, None, 413, "announces"),
        ("truncated protobuf", snappy(write_request(good)[:-3]), {}, None, 400, "truncated"),
        (
            "a series with no device",
            snappy(write_request(good, series(instance="10.1.2.3:9100"))),
            {},
            None,
            400,
            "instance '10.1.2.3:9100' names no device",
        ),
        (
            "no instance at all",
            snappy(write_request(good, series())),
            {},
            None,
            400,
            "timeseries[1] (rw_refused): no instance or host label",
        ),
        (
            "a node not in the agent's token",
            snappy(write_request(good, series(instance=f"{site.foreign}:9100"))),
            {},
            None,
            403,
            f"device {site.foreign!r} is not a node of agent",
        ),
        ("a pusher without a job there", valid, {}, pusher, 403, "not a node of a running job"),
        (
            "a reserved label",
            snappy(write_request(good, series(instance=site.named, _device_alias=site.foreign))),
            {},
            None,
            400,
            "labels._device_alias: labels starting with '_' are reserved",
        ),
        (
            "a reserved label, even for an admin",
            snappy(write_request(series(instance=site.named, _site="x"))),
            {},
            site.admin,
            400,
            "labels._site",
        ),
        (
            "a bad metric name",
            snappy(write_request(good, ({"__name__": "a-b", "instance": site.named}, [(1, at)]))),
            {},
            None,
            400,
            "__name__: 'a-b' is not a metric name",
        ),
        (
            "a sample a day ahead",
            snappy(write_request(good, ({**good[0]}, [(1.0, now_ms(-86400))]))),
            {},
            None,
            400,
            "outside the accepted window",
        ),
    ]
    peak = _peak_rss_kib(site.pid)
    for case, body, headers, token, status, says in refusals:
        response = site.post(body, token, **headers)
        assert response.status_code == status, f"{case}: {response.text}"
        assert says in response.json()["error"], f"{case}: {response.text}"
    assert _peak_rss_kib(site.pid) - peak < 64 * 1024, "the bomb was decompressed"
    marker = snappy(write_request(({"__name__": "rw_marker", "instance": site.named}, [(1, at)])))
    assert site.post(marker).status_code == 200
    wait_until(lambda: _rows(admin_client, site.named, "rw_marker") != [], 30, "the marker")
    assert _rows(admin_client, site.named, "rw_refused") == []
    assert _rows(admin_client, site.foreign) == []


def test_kafka_down_is_a_503_that_prometheus_retries(api_tokens: dict[str, str]) -> None:
    settings = ApiSettings(
        clickhouse_port=1,
        kafka_bootstrap="127.0.0.1:1",
        clickhouse_api_password="x",
        admin_token=api_tokens["admin"],
        kafka_write_timeout_s=1.0,
    )
    body = snappy(write_request(({"__name__": "m", "instance": "n-1:9100"}, [(1.0, now_ms())])))
    with TestClient(create_app(settings)) as client:
        headers = {**HEADERS, "Authorization": f"Bearer {api_tokens['admin']}"}
        response = client.post("/api/v1/write", content=body, headers=headers)
        assert response.status_code == 503, response.text
        assert "nothing was written" in response.json()["error"]


def test_a_bad_device_map_stops_the_start(tmp_path: Path, api_tokens: dict[str, str]) -> None:
    bad = tmp_path / "push-devices.yaml"
    bad.write_text("node-1:9100: {device_id: node-1, alias: node-2}\n")
    settings = ApiSettings(clickhouse_api_password="x", push_devices=bad)
    with pytest.raises(ValueError, match="entry 'node-1:9100'"):
        create_app(settings)
