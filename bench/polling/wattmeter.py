"""Wattmeter streams: readings per CPU-second of jobscope's producer and of Kwollect's
`kwollector-wattmetre`, reading the same simulated 50 Hz meters with every port in full mode.

The meters: simulated Omegawatt wattmeters (stack/simulators/wattmetre.py), version 2 frames,
CHANNELS ports each, 50 frames per second; the same seed gives both collectors the same
frames. Their CPU is printed, never counted.

1. jobscope: `python -m producers` with one `wattmeter://127.0.0.1:<port>/?version=2` entry per
   meter (METERS of them, over TCP), every port activated on demand at `optional_period: 20`
   by one activation on the on-demand topic (as a job's), publishing to a real Kafka broker
   (the polling benchmarks' shared stack's); readings = those of the readings topic with a
   timestamp in the window (each message: one port, the ~50 frames of one poll).
2. Kwollect: `kwollector-wattmetre` 1.3.1 (the venv of bench/polling/kwollect.py), one process
   per meter as Kwollect runs them (KWOLLECT_METERS of them), each fed its meter's frames on
   its standard input (the simulator's --stdout form, as sites pipe a meter into it), every
   port mapped to a node listed in `promoted_metrics` (Kwollect's full monitoring), writing to
   PostgreSQL 15 with Kwollect's schema (bench/kwollect_schema.py); readings = rows with a
   timestamp in the window.

Both at the same load: Kwollect runs as many meters as jobscope where this machine sustains
it. Where it does not (the full profile's 160 meters), jobscope is measured a second time at
Kwollect's load, and the ratio of the two collectors is taken at that equal load only.

The figure is readings over the CPU seconds (utime + stime, threads and children) of the
collector process(es) in the window: not Kafka's or PostgreSQL's (printed beside), nor the
simulators'. Goal for jobscope: GOAL readings per CPU-second (one core serves 160 meters of
24 ports at 50 Hz).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.polling.cpu import Window
from bench.polling.kwollect import create_tables, kwollect_venv
from bench.polling.producer import PollingStack, producer, tail
from bench.polling.topic import TopicFollower
from bench.systems.postgres import Postgres
from stack.config import REPO_ROOT
from stack.processes import free_port, stop_child, wait_until
from stack.simulators.wattmetre import FRAME_PERIOD_S, MeterSpec, Wattmetres

log = logging.getLogger("bench.wattmeter")

CHANNELS = 24
METRIC = "wattmetre_power_watt"
GOAL = 200_000
SEED = 1
# Keyed by quick (True) or full run (False):
METERS = {True: 40, False: 160}
KWOLLECT_METERS = {True: 40, False: 40}
"""Kwollect's load: jobscope's where 2 cores sustain it. At 40 meters it kept up (completeness
1.000) with the machine 98% busy: collectors 0.21 cores, their PostgreSQL 0.78, the feeders
0.18 (quick run on the reference machine), so 160 meters would need about 5 cores."""
KEPT_UP = 0.95
"""The least completeness (readings stored / readings the meters sent) of a collector that
kept up with its load."""
MEASURE_S = {True: 5, False: 30}
WARMUP_S = {True: 1, False: 10}
START_TIMEOUT_S = 60.0
CATCH_UP_S = 30.0
"""How long Kwollect's collectors are given to store the window's last frames; one still
behind then shows in its completeness."""
FULL_MODE_READINGS = 25
"""A message with at least this many readings comes from a port in full mode (50 per s)."""


def _result(readings: int, window: Window, meters: int, **extra: Any) -> dict[str, Any]:
    asked = meters * CHANNELS * window.cpu["window_s"] / FRAME_PERIOD_S
    cpu = window.cpu["collector_cpu_s"]
    return {
        "meters": meters,
        "readings": readings,
        "readings_per_s": round(readings / window.cpu["window_s"], 1),
        "readings_per_core_s": round(readings / cpu, 1) if cpu > 0 else None,
        "completeness": round(readings / asked, 4),
        **window.cpu,
        **extra,
    }


def _meters(count: int, prefix: str) -> list[MeterSpec]:
    """Meters on ports the simulator picks (port 0), or fed to a command (--stdout)."""
    return [MeterSpec(f"{prefix}{i + 1}", 0, 2, CHANNELS) for i in range(count)]


def _ports(specs: list[MeterSpec]) -> list[str]:
    return [f"{spec.name}-port{p}" for spec in specs for p in range(spec.channels)]


# -- jobscope ------------------------------------------------------------------------------


def message_span(payload: bytes) -> tuple[int, int, int]:
    """(readings, first timestamp, last timestamp) of a readings message whose readings share
    their device and metric and carry no labels (fixed-size rows): read from its first and
    last rows only, so that counting 200,000 readings/s costs this process little."""
    from kafka.message import unpack

    count, shift, pos = 0, 0, 0
    while True:
        byte = payload[pos]
        pos += 1
        count |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
    if count == 0:
        return 0, 0, 0
    first = int.from_bytes(payload[pos : pos + 8], "little", signed=True)
    row = (len(payload) - pos) // count
    if (len(payload) - pos) % count or payload[pos + row - 1] != 0:  # not fixed-size rows
        readings = unpack(payload)
        return len(readings), readings[0].timestamp_us, readings[-1].timestamp_us
    last_at = pos + (count - 1) * row
    last = int.from_bytes(payload[last_at : last_at + 8], "little", signed=True)
    return count, first, last


class MessageSpans(TopicFollower):
    """(readings, first, last timestamp) of each message of the meters' ports (keys
    starting with `prefix`)."""

    def __init__(self, bootstrap: str, topic: str, prefix: str) -> None:
        super().__init__(bootstrap, topic)
        self.prefix = prefix.encode()
        self.spans: list[tuple[int, int, int]] = []

    def take(self, key: bytes, value: bytes) -> None:
        if key.startswith(self.prefix):
            self.spans.append(message_span(value))

    def full_mode(self) -> bool:
        return any(count >= FULL_MODE_READINGS for count, _, _ in self.spans[-100:])

    def readings_between(self, t0_us: int, t1_us: int) -> int:
        """Readings with a timestamp in [t0, t1): those of a message straddling a bound are
        counted as if its frames were evenly spaced (they are: 20 ms apart)."""
        total = 0
        for count, first, last in self.spans:
            if last < t0_us or first >= t1_us:
                continue
            if first >= t0_us and last < t1_us:
                total += count
                continue
            step = (last - first) / (count - 1) if count > 1 else 0
            total += sum(1 for i in range(count) if t0_us <= first + i * step < t1_us)
        return total


def _activate(bootstrap: str, topic: str, devices: list[str]) -> None:
    """Every port switched on for good, as a job's activation is (producers/ondemand.py)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    document = {"id": "bench/wattmeter", "devices": devices, "metrics": "wattmetre_"}
    producer.produce(topic, key=b"bench/wattmeter", value=json.dumps(document).encode())
    if producer.flush(30) != 0:
        raise RuntimeError("the activation was not delivered to Kafka")


def write_devices_file(path: Path, specs: list[MeterSpec]) -> Path:
    lines = [
        f"- {{name: {METRIC}, device_id: {spec.name}, "
        f"url: 'wattmeter://127.0.0.1:{spec.port}/?version=2', update_every: 1000, "
        "optional_period: 20}"
        for spec in specs
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _jobscope(stack: PollingStack, work: Path, quick: bool, count: int) -> dict[str, Any]:
    """jobscope's producer reading `count` meters, publishing to the Kafka of `stack`."""
    from kafka import topics
    from stack import services

    meters = Wattmetres(work / "meters", _meters(count, "wmj"), free_port(), seed=SEED)
    spans: MessageSpans | None = None
    try:
        meters.start()
        specs = meters.meters  # with the ports they took
        settings = stack.need("kafka")
        log.info("wattmeter: jobscope: Kafka ready, %d meters streaming", len(specs))
        _activate(settings.kafka_bootstrap, topics.ON_DEMAND.name, _ports(specs))
        spans = MessageSpans(settings.kafka_bootstrap, topics.READINGS.name, "wmj")
        spans.start()
        devices = write_devices_file(work / "devices.yaml", specs)
        with producer(
            stack,
            devices,
            spans.full_mode,
            "readings of every frame from jobscope's producer",
            START_TIMEOUT_S,
            JOBSCOPE_STATS_INTERVAL_S="5",
        ) as proc:
            pid = proc.pid()
            assert pid is not None
            time.sleep(WARMUP_S[quick])
            kafka_pid = services.process(settings, "kafka").pid()
            window = Window(pid, [kafka_pid] if kafka_pid else [], [meters.pid or 0])
            window.run(MEASURE_S[quick])
            time.sleep(1.5)  # the frames of the window's last second are polled and published
        spans.finish.set()
        spans.join(60)
        if spans.error is not None:
            raise spans.error
        readings = spans.readings_between(int(window.t0 * 1e6), int(window.t1 * 1e6))
        return _result(readings, window, len(specs), messages=len(spans.spans))
    finally:
        if spans is not None:
            spans.finish.set()
        meters.stop()


# -- Kwollect ------------------------------------------------------------------------------


@dataclass
class KwollectSide:
    """What Kwollect's run needs, made ready while jobscope's is measured."""

    pg: Postgres
    collector: Path
    specs: list[MeterSpec]
    mapping: Path


def _prepare_kwollect(state_dir: Path, work: Path, count: int) -> KwollectSide:
    """Kwollect's venv, PostgreSQL with its tables, every port of `count` meters mapped to a
    node in `promoted_metrics` (full monitoring) and the mapping file naming them."""
    venv = kwollect_venv(state_dir)
    specs = _meters(count, "wmk")
    nodes = {port: f"node-{port}" for port in _ports(specs)}
    work.mkdir(parents=True, exist_ok=True)
    mapping = work / "mapping.yaml"
    mapping.write_text("".join(f"{node}: [{port}]\n" for port, node in nodes.items()))
    pg = Postgres(work / "postgres")
    try:
        pg.start()
        with pg._connect() as conn:
            create_tables(conn)
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO promoted_metrics (device_id, metric_id) VALUES (%s, %s)",
                    [(node, METRIC) for node in nodes.values()],
                )
    except BaseException:
        pg.stop()
        raise
    return KwollectSide(pg, venv / "bin" / "kwollector-wattmetre", specs, mapping)


def _kwollector(side: KwollectSide, work: Path, quick: bool) -> dict[str, Any]:
    pg, specs = side.pg, side.specs
    running: list[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]] = []
    try:
        for spec in specs:
            config = work / f"{spec.name}.yaml"
            config.write_text(
                f"wattmetre_id: {spec.name}\nwattmetre_version: 2\n"
                f"mapping_file_path: {side.mapping}\ndb_name: postgres\ndb_user: postgres\n"
                "db_password: unused\ndb_host: 127.0.0.1\nlog_level: warning\n"
            )
            with open(work / f"{spec.name}.log", "wb") as out:
                feeder = subprocess.Popen(
                    Wattmetres.stdout_argv(spec, seed=SEED),
                    stdout=subprocess.PIPE,
                    stderr=out,
                    stdin=subprocess.DEVNULL,
                    cwd=REPO_ROOT,
                )
                assert feeder.stdout is not None
                kwollector = subprocess.Popen(
                    [str(side.collector), str(config)],
                    stdin=feeder.stdout,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "PGPORT": str(pg.port)},
                    cwd=work,
                )
                feeder.stdout.close()  # kwollector holds the pipe now
            running.append((feeder, kwollector))

        def rows(where: str = "", *args: Any) -> int:
            with pg._connect() as conn:
                row = conn.execute(f"SELECT count(*) FROM metrics {where}", args).fetchone()
            return int(row[0]) if row else 0

        def ports_after(t: datetime) -> int:
            with pg._connect() as conn:
                row = conn.execute(
                    "SELECT count(DISTINCT device_id) FROM metrics WHERE timestamp >= %s", (t,)
                ).fetchone()
            return int(row[0]) if row else 0

        def exited() -> bool:
            return any(kwollector.poll() is not None for _, kwollector in running)

        full_second = FULL_MODE_READINGS * len(specs) * CHANNELS
        wait_until(
            lambda: exited() or rows() >= full_second,
            START_TIMEOUT_S,
            "every frame from kwollector-wattmetre",
        )
        if exited():
            raise RuntimeError(
                "kwollector-wattmetre exited:\n" + tail(work / f"{specs[0].name}.log")
            )
        time.sleep(WARMUP_S[quick])
        postmaster = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
        window = Window(
            [k.pid for _, k in running], [postmaster], [feeder.pid for feeder, _ in running]
        )
        window.run(MEASURE_S[quick])
        t0, t1 = (datetime.fromtimestamp(t, UTC) for t in (window.t0, window.t1))
        # a meter's second is inserted once the first frame of its next one arrives: wait
        # until every port (one node each) has a row after the window, or CATCH_UP_S
        ports = len(specs) * CHANNELS
        caught_up = time.monotonic() + CATCH_UP_S
        wait_until(
            lambda: ports_after(t1) >= ports or time.monotonic() > caught_up,
            CATCH_UP_S + 30,
            "rows of every port after the window",
        )
        readings = rows("WHERE timestamp >= %s AND timestamp < %s", t0, t1)
        logs = "".join((work / f"{s.name}.log").read_text(errors="replace") for s in specs)
        return _result(
            readings,
            window,
            len(specs),
            log_errors=logs.count(":ERROR:"),
            log_warnings=logs.count(":WARNING:"),
        )
    finally:
        for feeder, kwollector in running:
            stop_child(kwollector)
            stop_child(feeder)


# -- the whole measurement -------------------------------------------------------------------


def _run(name: str, results: dict[str, Any], work: Callable[[], dict[str, Any]]) -> None:
    log.info("wattmeter: %s: measuring", name)
    try:
        results[name] = r = work()
        log.info(
            "wattmeter: %s: %s readings/core-s (%.0f readings/s from %d meters, completeness "
            "%.3f, collector %.3f cores, sink %s cores, simulated meters %.3f cores)",
            name,
            f"{r['readings_per_core_s']:,.0f}" if r["readings_per_core_s"] else "n/a",
            r["readings_per_s"],
            r["meters"],
            r["completeness"],
            r["collector_cpu_cores"],
            r["sink_cpu_cores"],
            r["agents_cpu_cores"],
        )
    except Exception as exc:
        log.exception("wattmeter: %s failed", name)
        results[name] = {"error": f"{type(exc).__name__}: {exc}"}


def markdown(out: dict[str, Any]) -> str:
    """The step's figures as a table (bench/report.py prints the other polling steps)."""
    systems = out["wattmeter_polling"]["systems"]

    def figure(value: float | None, fmt: str = "{:,.0f}") -> str:
        return fmt.format(value) if value is not None else "n/a"

    goal = out["wattmeter_goal_met"]
    rows = [
        (
            "jobscope producer, readings per CPU-second",
            figure(out["wattmeter_readings_per_core_s"])
            + ("" if goal is None else f"; goal >= {GOAL:,}: " + ("met" if goal else "MISSED")),
        ),
        (
            "Kwollect's kwollector-wattmetre 1.3.1 (to PostgreSQL), readings per CPU-second",
            figure(out["kwollector_wattmetre_readings_per_core_s"])
            + ("" if out["kwollector_wattmetre_kept_up"] is not False else " (did NOT keep up)"),
        ),
        (
            f"jobscope / kwollector-wattmetre, at {figure(out['wattmeter_vs_kwollector_meters'])}"
            " meters each",
            figure(out["wattmeter_vs_kwollector"], "{:.2f}x"),
        ),
    ]
    if "jobscope_at_kwollect_load" in systems:
        rows.insert(
            1,
            (
                "jobscope producer at Kwollect's load, readings per CPU-second",
                figure(out["wattmeter_at_kwollect_load_readings_per_core_s"]),
            ),
        )
    lines = ["| wattmeters, 50 Hz x 24 ports, full mode | value |", "|---|---|"]
    lines += [f"| {title} | {value} |" for title, value in rows]
    for name, r in systems.items():
        if "error" in r:
            lines.append(f"- {name}: FAILED: {r['error']}")
        elif r:
            lines.append(
                f"- {name}: {r['meters']} meters, {r['readings_per_s']:,.0f} readings/s "
                f"(completeness {r['completeness']:.3f}), collector {r['collector_cpu_cores']:.3f}"
                f" cores, its sink {r['sink_cpu_cores']:.3f}, simulated meters (not counted) "
                f"{r['agents_cpu_cores']:.3f}, machine busy "
                f"{100 * (r['machine_busy_fraction'] or 0):.0f}%"
            )
    return "\n".join(lines)


def figures(systems: dict[str, Any]) -> dict[str, Any]:
    """The top-level figures of the collectors' results: jobscope's at its own load (the
    goal's), and its ratio to Kwollect's taken from jobscope's run at Kwollect's load (the
    same run where the loads are the same), at equal load only: otherwise none."""
    js, kw = systems["jobscope"], systems["kwollector_wattmetre"]
    equal = systems.get("jobscope_at_kwollect_load", js)
    ours, theirs = equal.get("readings_per_core_s"), kw.get("readings_per_core_s")
    same_load = "meters" in kw and equal.get("meters") == kw["meters"]
    kept_up, own = kw.get("completeness"), js.get("readings_per_core_s")
    return {
        "wattmeter_readings_per_core_s": own,
        "wattmeter_at_kwollect_load_readings_per_core_s": ours,
        "kwollector_wattmetre_readings_per_core_s": theirs,
        "wattmeter_vs_kwollector": (
            round(ours / theirs, 3) if ours and theirs and same_load else None
        ),
        "wattmeter_vs_kwollector_meters": kw["meters"] if same_load else None,
        "kwollector_wattmetre_kept_up": None if kept_up is None else kept_up >= KEPT_UP,
        "wattmeter_goal_met": None if own is None else own >= GOAL,
    }


def measure(state_dir: Path, quick: bool, stack: PollingStack) -> dict[str, Any]:
    """The wattmeter benchmark (jobscope's producer publishing to the Kafka of `stack`); keys
    for the top level of bench-results.json."""
    state_dir = state_dir.resolve()
    work = state_dir / "wattmeter"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    systems: dict[str, Any] = {}
    ours_n, theirs_n = METERS[quick], KWOLLECT_METERS[quick]
    with ThreadPoolExecutor(1) as pool:  # Kwollect's PostgreSQL starts meanwhile
        kwollect = pool.submit(_prepare_kwollect, state_dir, work / "kwollector", theirs_n)
        try:
            _run("jobscope", systems, lambda: _jobscope(stack, work / "jobscope", quick, ours_n))
            if theirs_n != ours_n:
                _run(
                    "jobscope_at_kwollect_load",
                    systems,
                    lambda: _jobscope(stack, work / "jobscope-kwollect-load", quick, theirs_n),
                )
            _run(
                "kwollector_wattmetre",
                systems,
                lambda: _kwollector(kwollect.result(), work / "kwollector", quick),
            )
        finally:
            if kwollect.exception() is None:
                kwollect.result().pg.stop()
    js, kw = systems["jobscope"], systems["kwollector_wattmetre"]
    equal = systems.get("jobscope_at_kwollect_load", js)
    out: dict[str, Any] = {
        **figures(systems),
        "wattmeter_simulators_cpu_cores": js.get("agents_cpu_cores"),
        "wattmeter_polling": {
            "channels": CHANNELS,
            "frames_per_s": round(1 / FRAME_PERIOD_S),
            "goal_readings_per_core_s": GOAL,
            "measure_s": MEASURE_S[quick],
            "warmup_s": WARMUP_S[quick],
            "kwollect": "1.3.1",
            "meters": {"jobscope": ours_n, "kwollector_wattmetre": theirs_n},
            "kept_up_completeness": KEPT_UP,
            "systems": systems,
        },
    }
    for key, system in (
        ("wattmeter_error", js),
        ("wattmeter_at_kwollect_load_error", equal),
        ("kwollector_wattmetre_error", kw),
    ):
        if "error" in system:
            out[key] = system["error"]
    print(markdown(out), flush=True)
    return out
