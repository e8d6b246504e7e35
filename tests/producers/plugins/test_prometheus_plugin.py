"""prometheus:// against Debian's node_exporter (stack/simulators/node_exporter.py), and an
exporter serving OpenMetrics through prometheus_client's own HTTP server; the exposition
parser against prometheus_client's."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from kafka.reading import Reading
from producers.config import ProducerSettings, load_devices
from producers.entry import DeviceEntry
from producers.plugins.base import Skips
from producers.plugins.prometheus import plugin as prom
from producers.plugins.prometheus.exposition import ExpositionError, parse_text
from producers.runtime import Runtime, build_groups
from stack.simulators.node_exporter import NodeExporter
from tests import ports
from tests.producers.conftest import RecordingPublisher

SAMPLE = Path(prom.__file__).parent / "sample.yaml"
# NOTHING_PORT: nothing listens there
OPENMETRICS_PORT, NOTHING_PORT, SECOND_EXPORTER_PORT, BROKEN_PORT = ports.ports("prometheus")
T = 1_795_288_158_123_456


def entry(port: int, path: str, name: str = "prom", **fields: Any) -> DeviceEntry:
    return DeviceEntry(
        name=name, device_id="node-1", url=f"prometheus://127.0.0.1:{port}{path}", **fields
    )


def build(*entries: DeviceEntry) -> prom.PrometheusPlugin:
    """The one instance the runtime builds for entries of one target, with its own skips."""
    (plugin,) = prom.PrometheusPlugin.build(entries)
    plugin.skips = Skips(logging.getLogger("test"))
    return plugin


def polls(plugin: prom.PrometheusPlugin, *timestamps: int) -> list[list[Reading]]:
    """One poll per timestamp, in one event loop (one HTTP client), then close."""

    async def run() -> list[list[Reading]]:
        try:
            return [await plugin.poll(ts) for ts in timestamps]
        finally:
            await plugin.close()

    return asyncio.run(run())


def by_metric(readings: list[Reading]) -> dict[str, list[Reading]]:
    out: dict[str, list[Reading]] = {}
    for reading in readings:
        out.setdefault(reading.metric_id, []).append(reading)
    return out


def scrape_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


# ---- the parser ----------------------------------------------------------------------------


def _reference(text: str) -> list[tuple[str, dict[str, str], float, int | None]]:
    """prometheus_client's reading of `text`, one line at a time (names as written)."""
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            for family in text_string_to_metric_families(line):
                for s in family.samples:
                    ts = None if s.timestamp is None else round(float(s.timestamp) * 1e6)
                    out.append((s.name, s.labels, float(s.value), ts))
    return out


def _same(ours: list[Any], reference: list[Any]) -> bool:
    """Equal sample lists, NaN equal to NaN; the reference's empty labels left out (ours
    leaves them out: Prometheus reads an empty label as no label)."""
    key = [(n, lab, "nan" if math.isnan(v) else v, t) for n, lab, v, t in ours]
    return key == [
        (n, {k: v for k, v in lab.items() if v}, "nan" if math.isnan(v) else v, t)
        for n, lab, v, t in reference
    ]


def test_the_parser_reads_node_exporter_as_prometheus_client_does(
    node_exporter: NodeExporter,
) -> None:
    """Every sample of a real exposition, and its families' view where it names them alike
    (node_exporter's counters all end in _total)."""
    text = scrape_text(node_exporter.url)
    ours = parse_text(text)
    assert len(ours) > 300
    assert '=""' in text  # node_exporter exposes empty labels (lo's duplex, node_network_info)
    assert _same(ours, _reference(text))
    families = [
        (s.name, s.labels, float(s.value), s.timestamp)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    assert _same(ours, families)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('a{b="1",c="x y"} 2', ("a", {"b": "1", "c": "x y"}, 2.0, None)),
        ("a 1 1700000000123", ("a", {}, 1.0, 1_700_000_000_123_000)),
        ('a{b="x\\"y",c="d\\\\e\\nf"} 1', ("a", {"b": 'x"y', "c": "d\\e\nf"}, 1.0, None)),
        ('a{b="}{,="} 1', ("a", {"b": "}{,="}, 1.0, None)),
        ('a{b="1",} 1', ("a", {"b": "1"}, 1.0, None)),
        ("a{} 1", ("a", {}, 1.0, None)),
        ('  a:b_c{le="+Inf"}\t3e2  ', ("a:b_c", {"le": "+Inf"}, 300.0, None)),
        ("a -Inf", ("a", {}, -math.inf, None)),
        ("a +5", ("a", {}, 5.0, None)),
        ('a{b = "1"} 1', ("a", {"b": "1"}, 1.0, None)),
        ('a{b="é"} 1.5 -2', ("a", {"b": "é"}, 1.5, -2000)),
    ],
)
def test_a_line_reads_as_prometheus_client_reads_it(line: str, expected: tuple[Any, ...]) -> None:
    assert parse_text(line) == [expected] == _reference(line)


@pytest.mark.parametrize("line", ['a{b="",c="1"} 2', 'a{b="",c="x\\"y"} 2'])
def test_empty_labels_are_left_out(line: str) -> None:
    """On both paths (the second line has an escape: prometheus_client reads it)."""
    ((name, labels, value, _),) = parse_text(line)
    assert (name, value) == ("a", 2.0) and list(labels) == ["c"]


def test_nan_values() -> None:
    ((name, labels, value, ts),) = parse_text("a NaN")
    assert (name, labels, ts) == ("a", {}, None) and math.isnan(value)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('# HELP a x\na 1\na{b="1",b="2"} 1', "line 3: Invalid labels"),
        ("a{b=1} 1", "line 1: Invalid labels"),
        ("a", "line 1:"),
        ("a 1_000", "line 1: Invalid value"),
        ("a 0x1p3", "line 1:"),
        ('a{__x="1"} 1', "line 1: Invalid labels"),
        ("a 1 99999999999999999999999", "line 1: timestamp"),
        ("\n\n# TYPE a nonsense\na 1", "line 3: bad TYPE line"),
        ("# TYPE a", "line 1: bad TYPE line"),
    ],
)
def test_malformed_lines_are_refused_with_their_number(text: str, error: str) -> None:
    with pytest.raises(ExpositionError, match=error):
        parse_text(text)


# ---- what an entry may say ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("prometheus://127.0.0.1/", "needs the exporter's port"),
        ("prometheus://127.0.0.1:99999/", "bad port"),
        ("prometheus://:9100/", "needs a host"),
        ("prometheus://u:p@h:9100/", "no user or password"),
        ("prometheus://h:9100/#x", "no #fragment"),
        ("prometheus://h:9100/?nope=1", "nope: Extra inputs are not permitted"),
        ("prometheus://h:9100/?match=(", "match: Input should be a valid regular expression"),
        ("prometheus://h:9100/?label.mode=[", "keep_labels.mode: Input should be a valid regul"),
        ("prometheus://h:9100/node load1", "metrics: not metric names: node load1"),
        ("prometheus://h:9100/metrics", "write prometheus://h:9100/ for every sample"),
        ("prometheus://h:9100/?metrics=", "metrics: not metric names: [(]none"),
        ("prometheus://h:9100/?prefix=1x", "prefix: String should match pattern"),
        ("prometheus://h:9100/?timeout_s=0", "timeout_s: Input should be greater than 0"),
        ("prometheus://h:9100/?match=a&match=b", "option 'match' is given twice"),
    ],
)
def test_bad_urls_are_refused_with_the_reason(url: str, error: str) -> None:
    bad = DeviceEntry(name="prom", device_id="node-1", url=url)
    with pytest.raises(ValueError, match=error):
        prom.PrometheusPlugin.check(bad)


def test_scrape_urls_of_both_forms() -> None:
    def target(url: str) -> prom.Target:
        return prom.parse(DeviceEntry(name="p", device_id="d", url=url))[0]

    assert target("prometheus://node-1:9100/node_load1-node_load5").url == (
        "http://node-1:9100/metrics"
    )
    assert target("prometheus://node-1:9100/?match=.%2A").url == "http://node-1:9100/metrics"
    assert target("prometheus://[::1]:9116/snmp?param.target=pdu-1&param.module=apc").url == (
        "http://[::1]:9116/snmp?target=pdu-1&module=apc"
    )
    options = prom.parse(DeviceEntry(name="p", device_id="d", url="prometheus://h:1/?match=a.+"))
    assert options[1].match is not None and options[1].match.pattern == "a.+"  # + is literal


# ---- against node_exporter ------------------------------------------------------------------


def test_kwollect_form_names_samples_as_kwollect(node_exporter: NodeExporter) -> None:
    """`/a-b-c` keeps those samples, named prom_<name>, at the tick's time; `/` keeps all."""
    loads = build(entry(node_exporter.port, "/node_load1-node_load5-node_load15"))
    (readings,) = polls(loads, T)
    assert sorted((r.metric_id, dict(r.labels), r.timestamp_us) for r in readings) == [
        ("prom_node_load1", {}, T),
        ("prom_node_load15", {}, T),
        ("prom_node_load5", {}, T),
    ]
    everything = build(entry(node_exporter.port, "/"))
    (readings,) = polls(everything, T)
    metrics = by_metric(readings)
    assert len(readings) > 300
    assert all(m.startswith("prom_") for m in metrics)
    cpu = metrics["prom_node_cpu_seconds_total"]
    assert {r.labels["mode"] for r in cpu} >= {"idle", "user", "system"}
    quantiles = {r.labels.get("quantile") for r in metrics["prom_go_gc_duration_seconds"]}
    assert quantiles == {"0", "0.25", "0.5", "0.75", "1"}
    assert "prom_go_gc_duration_seconds_count" in metrics


def test_sample_entries_of_one_target_and_period_share_one_scrape(
    node_exporter: NodeExporter,
) -> None:
    text = SAMPLE.read_text().replace("127.0.0.1:11100", f"127.0.0.1:{node_exporter.port}")
    path = node_exporter.state_dir / "devices.yaml"
    path.write_text(text)
    entries = load_devices(path)
    assert len(entries) == len(yaml.safe_load(text)) == 4
    groups = build_groups(entries)
    assert sorted(len(g.members[0].entries) for g in groups) == [1, 3]
    assert all(len(g.members) == 1 for g in groups)
    node_exporter.push("job.prom", 'kwollect_custom{_metric_id="job_progress_ratio"} 0.42\n')
    readings: list[Reading] = []
    for group in groups:
        (plugin,) = group.members
        assert isinstance(plugin, prom.PrometheusPlugin)
        readings += polls(plugin, T)[0]
        assert plugin.scrapes == 1
    metrics = by_metric(readings)
    assert set(metrics) == {
        "prom_node_load1",
        "prom_node_load5",
        "prom_node_load15",
        "prom_node_cpu_seconds_total",
        "prom_node_network_receive_bytes_total",
        "prom_node_network_transmit_bytes_total",
        "job_progress_ratio",
    }
    modes = {r.labels["mode"] for r in metrics["prom_node_cpu_seconds_total"]}
    assert "user" in modes and not modes & {"idle", "iowait"}
    network = metrics["prom_node_network_receive_bytes_total"]
    assert {r.labels["source"] for r in network} == {"node_exporter"}
    assert all(r.labels["device"].startswith("e") for r in network)
    (progress,) = metrics["job_progress_ratio"]
    assert (progress.value, dict(progress.labels)) == (
        0.42,
        {"_metric_origin": "prom_kwollect_custom"},
    )


def test_kwollect_custom_values_pushed_through_the_textfile_collector(
    node_exporter: NodeExporter, caplog: pytest.LogCaptureFixture
) -> None:
    """Kwollect's convention: named after _metric_id, at _timestamp, other labels kept (the
    empty ones node_exporter fills in dropped); a value with its own time is published once;
    a _timestamp that is not a time is skipped, counted and logged once."""
    node_exporter.push(
        "job.prom",
        'kwollect_custom{_metric_id="job_progress_ratio", _timestamp="1795288100.5"} 0.42\n'
        'kwollect_custom{_metric_id="job_temp_celsius", gpu="0"} 61\n'
        'kwollect_custom{_metric_id="job_bad", _timestamp="yesterday"} 1\n'
        'kwollect_custom{gpu="1"} 3\n',
    )
    plugin = build(entry(node_exporter.port, "/kwollect_custom"))
    first, second = polls(plugin, T, T + 1_000_000)
    origin = {"_metric_origin": "prom_kwollect_custom"}
    assert sorted((r.metric_id, dict(r.labels), r.value, r.timestamp_us) for r in first) == [
        ("job_progress_ratio", origin, 0.42, 1_795_288_100_500_000),
        ("job_temp_celsius", {"gpu": "0", **origin}, 61.0, T),
        ("prom_kwollect_custom", {"gpu": "1", **origin}, 3.0, T),
    ]
    assert sorted((r.metric_id, r.timestamp_us) for r in second) == [
        ("job_temp_celsius", T + 1_000_000),
        ("prom_kwollect_custom", T + 1_000_000),
    ]
    assert plugin.skips.count == 2
    warnings = [r.getMessage() for r in caplog.records if r.name == "test"]
    assert len(warnings) == 1
    assert "kwollect_custom job_bad" in warnings[0]
    assert "_timestamp 'yesterday' is not a Unix time in seconds" in warnings[0]
    node_exporter.push(
        "job.prom",
        'kwollect_custom{_metric_id="job_progress_ratio", _timestamp="1795288101.5"} 0.5\n',
    )
    (third,) = polls(plugin, T + 2_000_000)
    assert [(r.metric_id, r.value, r.timestamp_us) for r in third] == [
        ("job_progress_ratio", 0.5, 1_795_288_101_500_000)
    ]


def test_user_textfiles_cannot_alias_nor_backdate(
    node_exporter: NodeExporter, caplog: pytest.LogCaptureFixture
) -> None:
    """A user's textfile cannot reach another node's jobs: a sample carrying `_device_alias`
    (or any label starting with `_`) is dropped and reported, and so is a `_timestamp`
    further than time_max_age_s before (or time_max_ahead_s after) the poll (reported once:
    it is not read again while it stays the same). The device entry's own `_device_alias`
    still applies (the sample's is kept aside, as any clashing label); a `_timestamp` inside
    the window is honoured."""
    t = T / 1e6
    node_exporter.push(
        "job.prom",
        'kwollect_custom{_metric_id="job_power_watt", _device_alias="node-9"} 500\n'
        f'kwollect_custom{{_metric_id="job_old", _timestamp="{t - 120}"}} 1\n'
        f'kwollect_custom{{_metric_id="job_ahead", _timestamp="{t + 60}"}} 1\n'
        f'kwollect_custom{{_metric_id="job_ok", _timestamp="{t - 30}"}} 2\n'
        'job_gauge{_device_alias="node-9"} 3\n'
        'job_plain{_site="elsewhere"} 4\n',
    )
    user = entry(node_exporter.port, "/kwollect_custom-job_gauge-job_plain")
    outlet = DeviceEntry(
        name="outlet",
        device_id="pdu-1",
        url=f"prometheus://127.0.0.1:{node_exporter.port}/job_gauge",
        labels={"_device_alias": "node-1"},
    )
    plugin = build(user, outlet)
    first, second = polls(plugin, T, T + 1_000_000)
    origin = {"_metric_origin": "prom_kwollect_custom"}
    aliased = {"_device_alias": "node-1", "exported__device_alias": "node-9"}
    assert sorted(
        (r.device_id, r.metric_id, dict(r.labels), r.value, r.timestamp_us) for r in first
    ) == [
        ("node-1", "job_ok", origin, 2.0, round((t - 30) * 1e6)),
        ("pdu-1", "prom_job_gauge", aliased, 3.0, T),
    ]
    assert [(r.device_id, r.metric_id, r.timestamp_us) for r in second] == [
        ("pdu-1", "prom_job_gauge", T + 1_000_000)
    ]
    assert plugin.skips.count == 5 + 3  # reserved labels at each poll, times once
    warnings = sorted(r.getMessage() for r in caplog.records if r.name == "test")
    assert len(warnings) == 5
    reserved = [w for w in warnings if "is reserved" in w]
    assert len(reserved) == 3 and all("device_id=node-1" in w for w in reserved)
    assert sum("label _device_alias is reserved" in w for w in reserved) == 2
    assert any("job_plain" in w and "label _site is reserved" in w for w in reserved)
    late = [w for w in warnings if "time_max_age_s=60" in w]
    assert len(late) == 2 and any("job_old" in w for w in late)
    assert any("job_ahead" in w for w in late)


def test_filters_prefix_params_scale_and_entry_labels(
    node_exporter: NodeExporter, caplog: pytest.LogCaptureFixture
) -> None:
    port = node_exporter.port
    cpu = entry(port, "/metrics?match=node_cpu_.+&label.mode=user|system&prefix=host_")
    not_idle = entry(
        port, "/?metrics=node_cpu_seconds_total&label.mode!=idle", name="b", labels={"cpu": "all"}
    )
    load = entry(port, "/node_load1-no_such_metric-kwollect_custom", name="c")
    load_doubled = entry(port, "/node_load1", name="d", scale_factor=2, labels={"x": "2"})
    plugin = build(cpu, not_idle, load, load_doubled)
    (readings,) = polls(plugin, T)
    assert plugin.scrapes == 1
    metrics = by_metric(readings)
    host = [r for m, rs in metrics.items() if m.startswith("host_") for r in rs]
    assert {r.metric_id for r in host} >= {"host_node_cpu_seconds_total"}
    assert {r.labels["mode"] for r in host} == {"user", "system"}
    cpu_all = metrics["prom_node_cpu_seconds_total"]
    assert {r.labels["cpu"] for r in cpu_all} == {"all"}  # the entry's label wins...
    assert {r.labels["exported_cpu"] for r in cpu_all} >= {"0"}  # ...the exposed one is kept
    assert "idle" not in {r.labels["mode"] for r in cpu_all}
    (plain,) = (r for r in metrics["prom_node_load1"] if "x" not in r.labels)
    (doubled,) = (r for r in metrics["prom_node_load1"] if "x" in r.labels)
    assert doubled.value == 2 * plain.value
    assert plugin.skips.count == 1
    assert f"no_such_metric (http://127.0.0.1:{port}/metrics): not in the exposition" in (
        caplog.text
    )
    only_loadavg = build(entry(port, "/?match=node_.*&param.collect[]=loadavg"))
    (readings,) = polls(only_loadavg, T)
    metrics = by_metric(readings)
    assert "prom_node_load1" in metrics and "prom_node_cpu_seconds_total" not in metrics


# ---- OpenMetrics ----------------------------------------------------------------------------


@pytest.fixture
def openmetrics_exporter() -> Iterator[int]:
    """A Python exporter: prometheus_client's HTTP server, which answers OpenMetrics to a
    client that accepts it (ours does, after the text format)."""
    registry = CollectorRegistry()
    requests = Counter("requests", "Requests.", ["path"], registry=registry)
    requests.labels("/").inc(3)
    Gauge("temp_celsius", "Temperature.", registry=registry).set(21.5)
    latency = Histogram("latency_seconds", "Latency.", buckets=(0.1, 1.0), registry=registry)
    latency.observe(0.05)
    latency.observe(0.5)
    Info("build", "Build.", registry=registry).info({"version": "1.2"})
    server, thread = start_http_server(OPENMETRICS_PORT, addr="127.0.0.1", registry=registry)
    yield OPENMETRICS_PORT
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_openmetrics_expositions_are_read(openmetrics_exporter: int) -> None:
    url = f"http://127.0.0.1:{openmetrics_exporter}/metrics"
    request = urllib.request.Request(url, headers={"Accept": prom.ACCEPT})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    plugin = build(
        entry(openmetrics_exporter, "/?match=requests_total|temp_celsius|latency_.*|build_info")
    )
    (readings,) = polls(plugin, T)
    got = {(r.metric_id, tuple(sorted(r.labels.items()))): r.value for r in readings}
    assert got[("prom_requests_total", (("path", "/"),))] == 3.0
    assert got[("prom_temp_celsius", ())] == 21.5
    assert got[("prom_latency_seconds_bucket", (("le", "0.1"),))] == 1.0
    assert got[("prom_latency_seconds_bucket", (("le", "+Inf"),))] == 2.0
    assert got[("prom_latency_seconds_count", ())] == 2.0
    assert got[("prom_build_info", (("version", "1.2"),))] == 1.0


# ---- failures -------------------------------------------------------------------------------


def test_a_target_that_is_down_fails_the_poll_with_the_reason() -> None:
    plugin = build(entry(NOTHING_PORT, "/"))
    with pytest.raises(
        RuntimeError,
        match=rf"scrape of http://127.0.0.1:{NOTHING_PORT}/metrics "
        r"failed: ConnectError",
    ):
        polls(plugin, T)


def test_a_page_that_is_not_an_exposition_fails_the_poll(node_exporter: NodeExporter) -> None:
    """node_exporter answers its HTML landing page on any other path."""
    plugin = build(entry(node_exporter.port, "/nope?match=.*"))
    with pytest.raises(RuntimeError, match=r"not a Prometheus exposition \(Content-Type text/html"):
        polls(plugin, T)


class BrokenExporter(BaseHTTPRequestHandler):
    """Stands in for a broken exporter (no real one answers so): its answer is the server's
    `answer` (status, body)."""

    def do_GET(self) -> None:
        status, body = self.server.answer  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (200, b"# TYPE a gauge\na 1\na{b=1} 2\n", "/metrics: line 3: Invalid labels"),
        (500, b"collector failed", "/metrics: HTTP 500: b'collector failed'"),
    ],
)
def test_a_broken_exporter_fails_the_poll_with_the_reason(
    status: int, body: bytes, error: str
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", BROKEN_PORT), BrokenExporter)
    server.answer = (status, body)  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(RuntimeError, match=rf"scrape of http://127.0.0.1:{BROKEN_PORT}{error}"):
            polls(build(entry(BROKEN_PORT, "/")), T)
    finally:
        server.shutdown()
        server.server_close()


def test_a_hung_target_times_out_or_is_cancelled_and_recovers(
    node_exporter: NodeExporter,
) -> None:
    """A scrape that gets no answer ends at timeout_s, or when the runtime cancels it; the
    same instance scrapes again once the exporter answers."""
    plugin = build(entry(node_exporter.port, "/?metrics=node_load1&timeout_s=0.3"))

    async def scenario() -> list[str]:
        outcomes = []
        node_exporter.pause()
        try:
            await plugin.poll(T)
        except RuntimeError as exc:
            outcomes.append(str(exc))
        try:
            await asyncio.wait_for(plugin.poll(T), 0.1)  # as the runtime's deadline does
        except TimeoutError:
            outcomes.append("cancelled")
        node_exporter.resume()
        outcomes.append(",".join(r.metric_id for r in await plugin.poll(T)))
        await plugin.close()
        return outcomes

    timed_out, cancelled, recovered = asyncio.run(scenario())
    assert "failed: ReadTimeout" in timed_out
    assert cancelled == "cancelled"
    assert recovered == "prom_node_load1"


def test_a_target_that_stops_answering_never_delays_the_others(
    node_exporter: NodeExporter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    period_ms = 500
    second = NodeExporter(tmp_path / "second", SECOND_EXPORTER_PORT)
    live = DeviceEntry(
        name="prom",
        device_id="node-1",
        url=f"prometheus://127.0.0.1:{node_exporter.port}/node_load1",
        update_every=period_ms,
    )
    dying = DeviceEntry(
        name="prom",
        device_id="node-2",
        url=f"prometheus://127.0.0.1:{SECOND_EXPORTER_PORT}/node_load1",
        update_every=period_ms,
    )
    publisher = RecordingPublisher()
    runtime = Runtime([live, dying], publisher, ProducerSettings())  # type: ignore[arg-type]
    paused: list[int] = []

    async def scenario() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(runtime.run(stop))
        await publisher.wait_for(
            lambda: any(d == "node-2" for d, _ in publisher.sent), 30, "a reading of node-2"
        )
        second.pause()
        paused.append(time.time_ns() // 1000)
        await publisher.wait_for(
            lambda: sum(d == "node-1" and t > paused[0] for d, t in publisher.sent) >= 3,
            30,
            "3 readings of node-1 after node-2 stopped answering",
        )
        stop.set()
        await running

    with second:
        asyncio.run(scenario())
    period_us = period_ms * 1000
    (paused_at,) = paused
    stamps = [t for d, t in publisher.sent if d == "node-1"]
    ticks = [t // period_us for t in stamps]
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks))), ticks
    assert len([t for t in stamps if t > paused_at]) >= 3
    # On time: a poll held behind the dying target's timeout (about 300 ms) would be later
    # than this; below it lies the scheduling delay of a loaded 2-core run (105 ms seen).
    assert max(t % period_us for t in stamps) < period_us * 2 // 5
    dead = [t for d, t in publisher.sent if d == "node-2"]
    assert dead and max(dead) < paused_at + period_us
    assert caplog.text.count("poll failed: device_id=node-2") == 1
