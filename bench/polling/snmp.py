"""SNMP polling: OIDs per CPU-second of three collectors polling the same fleet of real agents.

The fleet: `devices` devices, each a real SNMP endpoint of its own (127.0.1.1:161,
127.0.1.2:161, ...: every address of 127.0.0.0/8 is loopback), served by AGENTS or more Net-SNMP
`snmpd` processes (stack/simulators/snmpd.py). Every device is asked the same 20 OIDs
(OIDS: IF-MIB counters of `lo`, Counter32 and Counter64, system and HOST-RESOURCES uptimes,
UCD-SNMP memory, load and CPU counters) in one GET every PERIOD_MS. One devices file, in
Kwollect's plain form (one entry per OID: `snmp://public@127.0.1.1:161/<OID>`), serves both
jobscope and Kwollect unchanged.

The collectors run one after the other, alone on the machine with the agents:
1. jobscope: `python -m producers --devices FILE`, publishing to a real Kafka broker (that
   of the polling benchmarks' shared stack, bench/polling/producer.py); OIDs = readings
   received from the readings topic with a timestamp in the window; tick lateness from those
   timestamps (timestamp - tick).
2. snmp_exporter (Prometheus, Debian package): one module with the 20 OIDs, scraped for every
   device every PERIOD_MS by a minimal HTTP client in this process; OIDs = samples returned
   (the `snmp_scrape_*` ones excluded) by scrapes started in the window.
3. kwollector (Kwollect 1.3.1 from PyPI, own venv): writing to PostgreSQL 15 with Kwollect's
   schema (bench/kwollect_schema.py); OIDs = rows of `metrics` with a timestamp in the
   window. It always polls port 161 (it ignores the URL's port), hence the fleet on port 161.

The figure is the OIDs collected in the window divided by the CPU seconds (utime + stime, in
/proc, threads and child processes included) the collector process used in it: only the
collector's, not its sink's (Kafka, PostgreSQL; printed beside it) nor the scraper's. The
agents' CPU is printed too, to show they are not the bottleneck, and the completeness (OIDs
collected / OIDs asked) to show each collector kept up with the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import shutil
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.polling.cpu import Window
from bench.polling.kwollect import create_tables, kwollect_venv
from bench.polling.producer import PollingStack, producer, tail
from bench.polling.topic import ReadingsCounter
from bench.systems.base import dpkg_version
from stack.processes import free_port, stop_child, wait_until
from stack.simulators.snmpd import Snmpd
from stack.transient import STARTING

log = logging.getLogger("bench.snmp")

# The 20 OIDs every device is asked, with a metric name and the exporter's metric type.
OIDS: tuple[tuple[str, str, str], ...] = (
    ("sys_uptime", "1.3.6.1.2.1.1.3.0", "gauge"),
    ("if_mtu", "1.3.6.1.2.1.2.2.1.4.1", "gauge"),
    ("if_speed", "1.3.6.1.2.1.2.2.1.5.1", "gauge"),
    ("if_in_octets", "1.3.6.1.2.1.2.2.1.10.1", "counter"),
    ("if_in_ucast_pkts", "1.3.6.1.2.1.2.2.1.11.1", "counter"),
    ("if_in_discards", "1.3.6.1.2.1.2.2.1.13.1", "counter"),
    ("if_in_errors", "1.3.6.1.2.1.2.2.1.14.1", "counter"),
    ("if_out_octets", "1.3.6.1.2.1.2.2.1.16.1", "counter"),
    ("if_out_ucast_pkts", "1.3.6.1.2.1.2.2.1.17.1", "counter"),
    ("if_out_discards", "1.3.6.1.2.1.2.2.1.19.1", "counter"),
    ("if_out_errors", "1.3.6.1.2.1.2.2.1.20.1", "counter"),
    ("if_hc_in_octets", "1.3.6.1.2.1.31.1.1.1.6.1", "counter"),
    ("if_hc_in_ucast_pkts", "1.3.6.1.2.1.31.1.1.1.7.1", "counter"),
    ("if_hc_out_octets", "1.3.6.1.2.1.31.1.1.1.10.1", "counter"),
    ("hr_system_uptime", "1.3.6.1.2.1.25.1.1.0", "gauge"),
    ("mem_total_real", "1.3.6.1.4.1.2021.4.5.0", "gauge"),
    ("mem_avail_real", "1.3.6.1.4.1.2021.4.6.0", "gauge"),
    ("mem_total_free", "1.3.6.1.4.1.2021.4.11.0", "gauge"),
    ("load_int_1min", "1.3.6.1.4.1.2021.10.1.5.1", "gauge"),
    ("ss_cpu_raw_user", "1.3.6.1.4.1.2021.11.50.0", "counter"),
)
COMMUNITY = "public"
PERIOD_MS = 1000
AGENTS = 4  # snmpd processes (at least); the devices are spread over them
DEVICES_PER_AGENT = 100  # at most (one snmpd serves up to ~120 endpoints)
FIRST_ADDRESS = ipaddress.IPv4Address("127.0.1.1")
# Keyed by quick (True) or full run (False):
DEVICES = {True: 200, False: 1000}  # full: the load, 1,000 PDUs x 20 OIDs every second
MEASURE_S = {True: 6, False: 180}
WARMUP_S = {True: 2, False: 20}
START_TIMEOUT_S = 120.0
EXPORTER = "/usr/bin/prometheus-snmp-exporter"


# -- the fleet -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    device_id: str
    address: str
    port: int


def fleet_devices(count: int, port: int) -> list[Device]:
    """Devices on 127.0.1.1, 127.0.1.2, ... (skipping .0 and .255 of each /24)."""
    devices: list[Device] = []
    address = FIRST_ADDRESS
    while len(devices) < count:
        if int(address) & 0xFF not in (0, 255):
            devices.append(Device(f"dev-{len(devices) + 1:04d}", str(address), port))
        address += 1
    return devices


@contextlib.contextmanager
def fleet(state_dir: Path, devices: list[Device]) -> Iterator[list[Snmpd]]:
    """snmpd processes (AGENTS, more for a large fleet) answering for `devices`."""
    agents = []
    count = max(AGENTS, -(-len(devices) // DEVICES_PER_AGENT))
    try:
        for i in range(count):
            mine = devices[i::count]
            if not mine:
                continue
            agent = Snmpd(
                state_dir / f"agent-{i + 1}",
                mine[0].address,
                mine[0].port,
                COMMUNITY,
                also_listen=[(d.address, d.port) for d in mine[1:]],
            )
            agents.append(agent)
            agent.start(timeout=60)
        yield agents
    finally:
        for agent in agents:
            agent.stop()


def write_devices_file(path: Path, devices: list[Device]) -> Path:
    """Kwollect's plain form: one entry per OID, read unchanged by jobscope and Kwollect."""
    lines = []
    for d in devices:
        for name, oid, _ in OIDS:
            lines.append(
                f"- {{name: {name}, device_id: {d.device_id}, "
                f'url: "snmp://{COMMUNITY}@{d.address}:{d.port}/{oid}", '
                f"update_every: {PERIOD_MS}}}"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _result(oids: int, window: Window, devices: int, **extra: Any) -> dict[str, Any]:
    asked = devices * len(OIDS) * window.cpu["window_s"] * 1000 / PERIOD_MS
    cpu = window.cpu["collector_cpu_s"]
    return {
        "oids": oids,
        "oids_per_s": round(oids / window.cpu["window_s"], 1),
        "oids_per_core_s": round(oids / cpu, 1) if cpu > 0 else None,
        "completeness": round(oids / asked, 4),
        **window.cpu,
        **extra,
    }


# -- jobscope ------------------------------------------------------------------------------

STATS_LINE = re.compile(
    r"(\d+) poll errors, (\d+) poll timeouts, (\d+) missed ticks.*tick lateness p99 ([\d.]+) ms"
)


def _jobscope(
    stack: PollingStack, devices_file: Path, agents: list[Snmpd], n: int, quick: bool
) -> dict[str, Any]:
    from stack import services

    settings = stack.need("kafka")
    counter = ReadingsCounter(settings.kafka_bootstrap, "readings")
    counter.start()
    try:
        with producer(
            stack,
            devices_file,
            lambda: bool(counter.messages),
            "the first readings of jobscope's producer",
            START_TIMEOUT_S,
            JOBSCOPE_STATS_INTERVAL_S="10",
        ) as proc:
            pid = proc.pid()
            assert pid is not None
            time.sleep(WARMUP_S[quick])
            kafka_pid = services.process(settings, "kafka").pid()
            window = Window(pid, [kafka_pid] if kafka_pid else [], [a.pid or 0 for a in agents])
            log_start = proc.log_file.stat().st_size
            window.run(MEASURE_S[quick])
            log_end = proc.log_file.stat().st_size
            time.sleep(2 * PERIOD_MS / 1000)  # the polls of the last ticks reach Kafka
        counter.finish.set()
        counter.join(60)
        if counter.error is not None:
            raise counter.error
    finally:
        counter.finish.set()
    t0_us, t1_us = int(window.t0 * 1e6), int(window.t1 * 1e6)
    period_us = PERIOD_MS * 1000
    in_window = [(ts, c) for ts, c in counter.messages if t0_us <= ts < t1_us]
    lateness = sorted((ts % period_us) / 1000 for ts, _ in in_window)
    with open(proc.log_file, "rb") as f:
        f.seek(log_start)
        stats = STATS_LINE.findall(f.read(log_end - log_start).decode(errors="replace"))
    return _result(
        sum(c for _, c in in_window),
        window,
        n,
        messages=len(in_window),
        tick_lateness_p50_ms=round(statistics.median(lateness), 2) if lateness else None,
        tick_lateness_p99_ms=round(lateness[int(len(lateness) * 0.99)], 2) if lateness else None,
        stats_tick_lateness_p99_ms=max((float(s[3]) for s in stats), default=None),
        poll_errors=sum(int(s[0]) for s in stats),
        poll_timeouts=sum(int(s[1]) for s in stats),
        missed_ticks=sum(int(s[2]) for s in stats),
    )


# -- snmp_exporter ---------------------------------------------------------------------------


def exporter_config() -> str:
    """snmp.yml of snmp_exporter 0.21: module `bench`, the OIDS by GET, SNMPv2c."""
    lines = ["bench:", "  version: 2", "  auth:", f"    community: {COMMUNITY}", "  get:"]
    lines += [f"    - {oid}" for _, oid, _ in OIDS]
    lines.append("  metrics:")
    for name, oid, kind in OIDS:
        lines += [f"    - name: {name}", f"      oid: {oid}", f"      type: {kind}"]
    return "\n".join(lines) + "\n"


class Scraper(threading.Thread):
    """Scrapes /snmp?module=bench&target=<device> for every device at every aligned tick,
    over keep-alive HTTP/1.1 connections (a minimal client: its CPU is not counted)."""

    def __init__(self, port: int, devices: list[Device], concurrency: int = 64) -> None:
        super().__init__(daemon=True)
        self.port, self.devices, self.concurrency = port, devices, concurrency
        self.scrapes: list[tuple[float, int]] = []  # (start wall time, OIDs returned)
        self.failures = 0
        self.last_failure = ""
        self.stop_event = threading.Event()

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        pool: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        limit = asyncio.Semaphore(self.concurrency)
        period = PERIOD_MS / 1000
        tasks: set[asyncio.Task[None]] = set()
        tick = (time.time() // period + 1) * period
        while not self.stop_event.is_set():
            await asyncio.sleep(max(tick - time.time(), 0))
            for d in self.devices:
                task = asyncio.create_task(self._scrape(pool, limit, d))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            tick += period
            while tick < time.time():  # overrun: skip to the next tick
                tick += period
        await asyncio.gather(*tasks, return_exceptions=True)
        for _, writer in pool:
            writer.close()

    async def _scrape(self, pool: list[Any], limit: asyncio.Semaphore, d: Device) -> None:
        started = time.time()
        async with limit:
            try:
                body = await self._get(pool, f"/snmp?module=bench&target={d.address}:{d.port}")
            except Exception as exc:
                self.failures += 1
                self.last_failure = f"{type(exc).__name__}: {exc}"
                return
        oids = sum(
            1
            for line in body.split(b"\n")
            if line and not line.startswith(b"#") and not line.startswith(b"snmp_scrape_")
        )
        self.scrapes.append((started, oids))

    async def _get(self, pool: list[Any], path: str) -> bytes:
        if pool:
            reader, writer = pool.pop()
        else:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (line.partition(":") for line in header_lines if line)
        }
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            parts = []
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                parts.append((await reader.readexactly(size + 2))[:-2])
            await reader.readuntil(b"\r\n")
            body = b"".join(parts)
        else:
            raise RuntimeError(f"unexpected response headers: {head!r}")
        if headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            pool.append((reader, writer))
        if status_line.split()[1] != "200":
            raise RuntimeError(f"{status_line}: {body[:200]!r}")
        return body


def _exporter(
    workdir: Path, devices: list[Device], agents: list[Snmpd], quick: bool
) -> dict[str, Any]:
    if not Path(EXPORTER).exists():
        raise RuntimeError("prometheus-snmp-exporter is not installed: run bench/install-peers.sh")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "snmp.yml"
    config.write_text(exporter_config())
    port = free_port()
    log_file = workdir / "exporter.log"
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            [EXPORTER, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    scraper = Scraper(port, devices)
    try:
        url = f"http://127.0.0.1:{port}/snmp?module=bench&target={devices[0].address}:{devices[0].port}"

        def answers() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"snmp_exporter exited:\n{tail(log_file)}")
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status == 200 and b"sys_uptime" in response.read()

        wait_until(answers, 30, "snmp_exporter", transient=STARTING)
        scraper.start()
        wait_until(
            lambda: len(scraper.scrapes) >= len(devices), START_TIMEOUT_S, "the first scrapes"
        )
        time.sleep(WARMUP_S[quick])
        window = Window(proc.pid, [], [a.pid or 0 for a in agents])
        window.run(MEASURE_S[quick])
        time.sleep(2 * PERIOD_MS / 1000)  # scrapes started in the window complete
        scraper.stop_event.set()
        scraper.join(30)
        done = [o for t, o in scraper.scrapes if window.t0 <= t < window.t1]
        return _result(
            sum(done),
            window,
            len(devices),
            scrapes=len(done),
            scrape_failures=scraper.failures,
            last_failure=scraper.last_failure or None,
            oids_per_scrape_min=min(done, default=None),
        )
    finally:
        scraper.stop_event.set()
        stop_child(proc)


# -- kwollector --------------------------------------------------------------------------------


def _kwollector(
    state_dir: Path, workdir: Path, devices_file: Path, agents: list[Snmpd], n: int, quick: bool
) -> dict[str, Any]:
    from bench.systems.postgres import Postgres

    venv = kwollect_venv(state_dir)
    pg = Postgres(workdir / "postgres")
    proc: subprocess.Popen[bytes] | None = None
    try:
        pg.start()
        with pg._connect() as conn:
            create_tables(conn)
        metrics_dir = workdir / "metrics.d"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        shutil.copy(devices_file, metrics_dir / "bench.yaml")
        config = workdir / "kwollector.yaml"
        config.write_text(
            f"metrics_dir: {metrics_dir}\ndb_host: 127.0.0.1\ndb_name: postgres\n"
            "db_user: postgres\ndb_password: unused\nlog_level: warning\nworker: 8\n"
        )
        log_file = workdir / "kwollector.log"
        with open(log_file, "wb") as out:
            proc = subprocess.Popen(
                [str(venv / "bin" / "kwollector"), str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PGPORT": str(pg.port)},  # asyncpg reads the port there
                cwd=workdir,
            )

        def rows(where: str = "", *args: Any) -> int:
            with pg._connect() as conn:
                row = conn.execute(f"SELECT count(*) FROM metrics {where}", args).fetchone()
            return int(row[0]) if row else 0

        wait_until(
            lambda: proc.poll() is not None or rows() > 0,
            START_TIMEOUT_S,
            "kwollector's first rows",
        )
        if proc.poll() is not None:
            raise RuntimeError(f"kwollector exited ({proc.returncode}):\n{tail(log_file)}")
        time.sleep(WARMUP_S[quick])
        postmaster = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
        window = Window(proc.pid, [postmaster], [a.pid or 0 for a in agents])
        log_start = log_file.stat().st_size
        window.run(MEASURE_S[quick])
        log_end = log_file.stat().st_size
        from datetime import UTC, datetime

        t0, t1 = (datetime.fromtimestamp(t, UTC) for t in (window.t0, window.t1))
        # rows reach PostgreSQL up to a second after their poll (SQL workers every second)
        wait_until(
            lambda: rows("WHERE timestamp >= %s", t1) > 0, 60, "kwollector's rows after the window"
        )
        time.sleep(2.0)
        oids = rows("WHERE timestamp >= %s AND timestamp < %s", t0, t1)
        with open(log_file, "rb") as f:
            f.seek(log_start)
            text = f.read(log_end - log_start).decode(errors="replace")
        return _result(
            oids,
            window,
            n,
            log_errors=text.count(":ERROR:"),
            log_warnings=text.count(":WARNING:"),
        )
    finally:
        if proc is not None:
            stop_child(proc)
        pg.stop()


# -- the whole measurement -----------------------------------------------------------------------


def _run(name: str, results: dict[str, Any], work: Callable[[], dict[str, Any]]) -> None:
    log.info("snmp: %s: measuring", name)
    try:
        results[name] = work()
        r = results[name]
        log.info(
            "snmp: %s: %s OIDs/core-s (%.0f OIDs/s, completeness %.3f, collector %.3f cores, "
            "agents %.3f cores, max one agent %.3f, machine busy %.0f%%)",
            name,
            f"{r['oids_per_core_s']:,.0f}" if r["oids_per_core_s"] else "n/a",
            r["oids_per_s"],
            r["completeness"],
            r["collector_cpu_cores"],
            r["agents_cpu_cores"],
            r["agent_max_cpu_cores"],
            100 * (r["machine_busy_fraction"] or 0),
        )
    except Exception as exc:
        log.exception("snmp: %s failed", name)
        results[name] = {"error": f"{type(exc).__name__}: {exc}"}


def measure(
    state_dir: Path, quick: bool, stack: PollingStack, devices: int | None = None
) -> dict[str, Any]:
    """The SNMP polling benchmark (jobscope's producer publishing to the Kafka of `stack`);
    keys for the top level of bench-results.json."""
    state_dir = state_dir.resolve()
    work = state_dir / "snmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    n = devices or DEVICES[quick]
    root = os.geteuid() == 0
    port = 161 if root else 16161
    fleet_list = fleet_devices(n, port)
    devices_file = write_devices_file(work / "devices.yaml", fleet_list)
    systems: dict[str, Any] = {}
    with fleet(work / "agents", fleet_list) as agents:
        log.info(
            "snmp: %d devices (%s..%s port %d) on %d snmpd agents, %d OIDs each every %d ms: "
            "%d OIDs/s asked",
            n,
            fleet_list[0].address,
            fleet_list[-1].address,
            port,
            len(agents),
            len(OIDS),
            PERIOD_MS,
            n * len(OIDS) * 1000 // PERIOD_MS,
        )
        _run(
            "jobscope",
            systems,
            lambda: _jobscope(stack, devices_file, agents, n, quick),
        )
        _run(
            "snmp_exporter",
            systems,
            lambda: _exporter(work / "exporter", fleet_list, agents, quick),
        )
        if root:
            _run(
                "kwollector",
                systems,
                lambda: _kwollector(state_dir, work / "kwollector", devices_file, agents, n, quick),
            )
        else:
            systems["kwollector"] = {
                "error": "kwollector always polls port 161 (it ignores the URL's port) and "
                "binding port 161 needs root: run the benchmark as root"
            }
    js, ex, kw = (systems.get(k, {}) for k in ("jobscope", "snmp_exporter", "kwollector"))

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    out: dict[str, Any] = {
        "snmp_oids_per_core_s": js.get("oids_per_core_s"),
        "snmp_exporter_oids_per_core_s": ex.get("oids_per_core_s"),
        "kwollector_oids_per_core_s": kw.get("oids_per_core_s"),
        "snmp_vs_exporter": ratio(js.get("oids_per_core_s"), ex.get("oids_per_core_s")),
        "snmp_vs_kwollector": ratio(js.get("oids_per_core_s"), kw.get("oids_per_core_s")),
        "snmp_tick_lateness_p99_ms": js.get("tick_lateness_p99_ms"),
        "snmp_agents_cpu_cores": max(
            (s["agents_cpu_cores"] for s in systems.values() if "agents_cpu_cores" in s),
            default=None,
        ),
    }
    for key, system in (("snmp_error", js), ("snmp_exporter_error", ex), ("kwollector_error", kw)):
        if "error" in system:
            out[key] = system["error"]
    out["snmp_polling"] = {
        "devices": n,
        "agents": len(agents),
        "oids_per_device": len(OIDS),
        "period_ms": PERIOD_MS,
        "oids_asked_per_s": n * len(OIDS) * 1000 / PERIOD_MS,
        "measure_s": MEASURE_S[quick],
        "warmup_s": WARMUP_S[quick],
        "port": port,
        "oids": [oid for _, oid, _ in OIDS],
        "versions": {
            "snmpd": dpkg_version("snmpd"),
            "snmp_exporter": dpkg_version("prometheus-snmp-exporter"),
            "kwollect": "1.3.1",
        },
        "systems": systems,
    }
    return out
