"""`live_latency_*` and `live_cpu_per_client`: the API's live stream of a job's readings
(`GET /api/jobs/{id}/live`, Server-Sent Events) under a steady load, through the whole stack
(producers -> Kafka -> API -> client).

Load: the producers poll NODES tester:// nodes with METRICS metrics each every second, and
PDUS PDUs with one outlet per node (labelled `_device_alias=<node>`) every second. JOBS jobs
of JOB_NODES nodes each, on disjoint nodes: a job's stream carries its nodes' readings, its
outlets' under the PDU's id and, summed, under the node (EXPECTED_PER_S readings/s).

Clients: async SSE readers in the bench process (httpx streaming, one asyncio loop; the
bench's own CPU is recorded beside, `bench_cpu_cores`), each reading its job's whole stream
with no `metrics=` or `devices=`. Phases, one after the other:
- `idle`: no client connected;
- `one`: the probe, one client on job 0, connected with `since=` the job's start (it replays
  first: `replayed`, and the seconds from the request to its `live` event);
- `same_job`: K_MAX clients on job 0 (the probe and K_MAX - 1 more);
- `distinct_jobs`: K_MAX clients on K_MAX jobs (the probe and one on each other job).
A phase's window starts once each of its clients has had its `live` event, plus SETTLE_S.
CPU: utime + stime of the API process (all threads; /proc, bench/polling/cpu.py) over the
window, per second; `live_cpu_per_client` = (API cores with K_MAX clients on one job - with
none) / K_MAX, as % of one core (`_k1`: with the probe alone, `_distinct_jobs`: K_MAX jobs).
Latency: for every reading received in a window (any client, any phase but idle), the time
its event's last line arrived minus the reading's `timestamp` (one machine, one clock); its
p50, p99 and max over all windows, and per phase. Goal: p99 <= 1 s.
At the end, job 0 is ended (PATCH end and state): `end_event_s` is the time until the
probe's `end` event. Readings of the wrong shape, outside the job's scope or sent twice to
one client, and `dropped` or `error` events, are counted with an example (`problems`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.polling import sse
from bench.polling.cpu import cpu_seconds, machine_ticks
from bench.polling.producer import PollingStack, whole_stack

log = logging.getLogger("bench.live")
NODES = 200
METRICS = 20
PDUS = 10  # NODES / PDUS outlets each, outlet k of PDU p powers node p * NODES / PDUS + k
JOB_NODES = 10
JOBS = NODES // JOB_NODES
K_MAX = JOBS
EXPECTED_PER_S = JOB_NODES * (METRICS + 2)  # own metrics, outlet under the PDU, sum under node
WINDOW_S = {  # quick or not: seconds of each phase's window
    True: {"idle": 2, "one": 3, "same_job": 3, "distinct_jobs": 3},
    False: {"idle": 15, "one": 20, "same_job": 20, "distinct_jobs": 20},
}
SETTLE_S = 0.5
GOAL_P99_S = 1.0
TIMEOUT_S = 60.0
READING_KEYS = {"timestamp", "device_id", "metric_id", "value", "labels"}


def _outlet(prefix: str, i: int) -> tuple[str, str]:
    """The (PDU, outlet label) powering node i."""
    per_pdu = NODES // PDUS
    return f"{prefix}-pdu{i // per_pdu}", str(i % per_pdu + 1)


def _devices(path: Path, prefix: str) -> Path:
    """The producers' devices file: the nodes' metrics and the PDU outlets powering them."""
    lines = []
    for i in range(NODES):
        node = f"{prefix}-n{i}"
        pdu, outlet = _outlet(prefix, i)
        lines.append(
            f"- {{name: live_value, device_id: {node}, url: 'tester://?metrics={METRICS}', "
            "update_every: 1000}"
        )
        lines.append(
            f"- {{name: pdu_outlet_power_watt, device_id: {pdu}, url: 'tester://', "
            f'update_every: 1000, labels: {{outlet: "{outlet}", _device_alias: {node}}}}}'
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class Job:
    """A job of the bench and what its stream may carry: its nodes' readings (their own, and
    the outlets' sums under them) and its outlets' under the PDU's id (shown, as by
    `/api/jobs/{id}/metrics`, without `_device_alias`: told apart by their `outlet` label)."""

    job_id: str
    nodes: tuple[str, ...]
    outlets: frozenset[tuple[str, str]]

    def in_scope(self, row: dict[str, Any]) -> bool:
        if row["device_id"] in self.nodes:
            return True
        labels = row["labels"]
        return isinstance(labels, dict) and (row["device_id"], labels.get("outlet")) in self.outlets


@dataclass
class Tally:
    """What the clients received, by phase (None: between windows, not counted)."""

    phase: str | None = None
    latencies: dict[str, list[float]] = field(default_factory=dict)
    problems: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)

    def problem(self, kind: str, example: str) -> None:
        self.problems[kind] = self.problems.get(kind, 0) + 1
        self.examples.setdefault(kind, example[:300])


@dataclass
class Client:
    """One SSE reader of a job's live stream."""

    job: Job
    tally: Tally
    parser: sse.EventParser = field(default_factory=sse.EventParser)
    started: float = 0.0
    live_at: float | None = None
    replayed: int | None = None
    replay_rows: int = 0
    ended_at: float | None = None
    readings: dict[str, int] = field(default_factory=dict)
    other_events: dict[str, int] = field(default_factory=dict)
    seen: set[tuple[Any, ...]] = field(default_factory=set)
    failure: str | None = None
    closed: bool = False
    task: asyncio.Task[None] | None = None

    async def follow(self, http: httpx.AsyncClient, url: str, params: dict[str, str]) -> None:
        self.started = time.time()
        try:
            async for event in sse.events(http, url, params, self.parser):
                self._on(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
        finally:
            self.closed = True

    def _on(self, event: sse.Event) -> None:
        if event.name == "readings":
            self._readings(event)
        elif event.name == "live":
            self.live_at = event.received
            self.replayed = orjson.loads(event.data).get("replayed")
        elif event.name == "end":
            self.ended_at = event.received
        else:
            self.other_events[event.name] = self.other_events.get(event.name, 0) + 1
            if event.name in ("dropped", "error"):
                self.tally.problem(f"event {event.name}", event.data)

    def _readings(self, event: sse.Event) -> None:
        rows = orjson.loads(event.data)
        if not isinstance(rows, list):
            self.tally.problem("readings data not an array", event.data)
            return
        phase = self.tally.phase if self.live_at is not None else None
        if self.live_at is None:
            self.replay_rows += len(rows)
        elif phase is not None:
            self.readings[phase] = self.readings.get(phase, 0) + len(rows)
        latencies = self.tally.latencies.setdefault(phase, []) if phase else None
        for row in rows:
            if not isinstance(row, dict) or set(row) != READING_KEYS:
                self.tally.problem("reading of another shape", str(row))
                continue
            if not self.job.in_scope(row):
                self.tally.problem("reading outside the job's scope", str(row))
            key = (row["device_id"], row["metric_id"], row["timestamp"], str(row["labels"]))
            if key in self.seen:
                self.tally.problem("reading sent twice to one client", str(row))
            self.seen.add(key)
            if latencies is not None:
                stamp = datetime.fromisoformat(row["timestamp"]).timestamp()
                latencies.append(event.received - stamp)


@dataclass
class Session:
    """The stack's API, its jobs and the clients connected to them."""

    api: str
    api_pid: int
    jobs: list[Job]
    job_start: float
    http: httpx.AsyncClient
    tally: Tally = field(default_factory=Tally)
    clients: list[Client] = field(default_factory=list)

    def connect(self, job: int, params: dict[str, str] | None = None) -> Client:
        client = Client(self.jobs[job], self.tally)
        url = f"{self.api}/api/jobs/{client.job.job_id}/live"
        client.task = asyncio.create_task(client.follow(self.http, url, params or {}))
        self.clients.append(client)
        return client

    async def disconnect(self, clients: list[Client]) -> None:
        for c in clients:
            assert c.task is not None
            c.task.cancel()
        await asyncio.gather(*(c.task for c in clients if c.task), return_exceptions=True)
        self.clients = [c for c in self.clients if c not in clients]

    async def until_live(self, clients: list[Client]) -> None:
        def done() -> bool:
            failed = [c for c in clients if c.failure or (c.closed and c.live_at is None)]
            if failed:
                c = failed[0]
                raise RuntimeError(f"live stream of {c.job.job_id}: {c.failure or 'closed'}")
            return all(c.live_at is not None for c in clients)

        await _until(done, TIMEOUT_S, f"the 'live' event of {len(clients)} client(s)")
        await asyncio.sleep(SETTLE_S)

    async def window(self, phase: str, seconds: float) -> dict[str, Any]:
        """CPU of the API, of the bench and of the machine over one phase's window; the
        readings its clients received."""
        clients = list(self.clients)
        api0, bench0, ticks0, t0 = (
            cpu_seconds(self.api_pid),
            time.process_time(),
            machine_ticks(),
            time.time(),
        )
        self.tally.phase = phase
        await asyncio.sleep(seconds)
        self.tally.phase = None
        api1, bench1, ticks1, t1 = (
            cpu_seconds(self.api_pid),
            time.process_time(),
            machine_ticks(),
            time.time(),
        )
        span = t1 - t0
        broken = [c for c in clients if c.closed]
        if broken:
            why = broken[0].failure or f"closed by the server ({self.tally.problems or 'no event'})"
            raise RuntimeError(f"{len(broken)} stream(s) ended during {phase}: {why}")
        counts = [c.readings.get(phase, 0) for c in clients]
        latencies = self.tally.latencies.get(phase, [])
        figures = {
            "clients": len(clients),
            "window_s": round(span, 2),
            "api_cpu_cores": round((api1 - api0) / span, 4),
            "bench_cpu_cores": round((bench1 - bench0) / span, 4),
            "machine_busy_fraction": round(
                (ticks1[0] - ticks0[0]) / max(1, ticks1[1] - ticks0[1]), 3
            ),
            "readings_per_s_per_client": round(sum(counts) / len(counts) / span, 1)
            if counts
            else None,
            "readings": sum(counts),
            **_latency(latencies),
        }
        log.info("live: %s: %s", phase, figures)
        return figures


def _latency(values: list[float]) -> dict[str, float | None]:
    return {
        "latency_p50_s": _round(_quantile(values, 0.5)),
        "latency_p99_s": _round(_quantile(values, 0.99)),
        "latency_max_s": _round(max(values) if values else None),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


async def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)


async def _create_jobs(s: Session) -> None:
    bodies = [
        {"job_id": job.job_id, "nodes": list(job.nodes), "state": "running", "start": s.job_start}
        for job in s.jobs
    ]
    posted = await asyncio.gather(*(s.http.post(f"{s.api}/api/jobs", json=b) for b in bodies))
    for response in posted:
        response.raise_for_status()
    pending = {job.job_id for job in s.jobs}
    deadline = time.monotonic() + TIMEOUT_S
    while pending:  # a 202 is readable once ClickHouse has consumed it
        for job_id in list(pending):
            if (await s.http.get(f"{s.api}/api/jobs/{job_id}")).status_code == 200:
                pending.discard(job_id)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {TIMEOUT_S:.0f} s waiting for jobs {pending}")
        await asyncio.sleep(0.2)


async def _end_job(s: Session, probe: Client) -> dict[str, Any]:
    """End job 0 and time the probe's `end` event (not fatal: the figure is None then)."""
    ended = time.time()
    response = await s.http.patch(
        f"{s.api}/api/jobs/{s.jobs[0].job_id}",
        json={"end": ended, "state": "terminated"},
    )
    if response.status_code >= 400:
        return {"end_event_s": None, "end_note": f"PATCH: {response.status_code} {response.text}"}
    try:
        await _until(lambda: probe.ended_at is not None or probe.closed, 20.0, "the 'end' event")
    except TimeoutError as exc:
        return {"end_event_s": None, "end_note": str(exc)}
    if probe.ended_at is None:
        return {"end_event_s": None, "end_note": f"stream closed without 'end': {probe.failure}"}
    return {"end_event_s": round(probe.ended_at - ended, 3)}


async def _run(s: Session, windows: dict[str, float]) -> dict[str, Any]:
    began = time.monotonic()
    await _create_jobs(s)
    log.info("live: %d jobs readable after %.1f s", len(s.jobs), time.monotonic() - began)
    phases = {"idle": await s.window("idle", windows["idle"])}
    since = str(int(s.job_start))
    probe = s.connect(0, {"since": since})
    await s.until_live([probe])
    replay = {
        "since": since,
        "replayed": probe.replayed,
        "replay_readings_received": probe.replay_rows,
        "replay_to_live_s": round((probe.live_at or 0) - probe.started, 3),
    }
    phases["one"] = await s.window("one", windows["one"])
    same = [s.connect(0) for _ in range(K_MAX - 1)]
    await s.until_live(same)
    phases["same_job"] = await s.window("same_job", windows["same_job"])
    await s.disconnect(same)
    distinct = [s.connect(j) for j in range(1, K_MAX)]
    await s.until_live(distinct)
    phases["distinct_jobs"] = await s.window("distinct_jobs", windows["distinct_jobs"])
    await s.disconnect(distinct)
    end = await _end_job(s, probe)
    await s.disconnect([probe])
    return {
        "phases": phases,
        "replay": replay,
        **end,
        "heartbeats": probe.parser.comments,
        "field_only_events": probe.parser.without_data,
        "other_events": probe.other_events,
    }


def _per_client(phases: dict[str, Any], phase: str) -> float:
    """API CPU per client in `phase` over the idle phase, % of one core."""
    extra = phases[phase]["api_cpu_cores"] - phases["idle"]["api_cpu_cores"]
    return round(100 * extra / phases[phase]["clients"], 3)


def measure(state_dir: Path, quick: bool, stack: PollingStack) -> dict[str, Any]:
    """The live stream through `stack`, with a producer of this benchmark's own."""
    from stack import services
    from stack.processes import wait_until

    started = time.monotonic()
    prefix = f"lv{uuid.uuid4().hex[:6]}"
    work = state_dir.resolve() / "live"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with whole_stack(stack, _devices(work / "devices.yaml", prefix)) as settings:
        api_pid = services.process(settings, "api").pid()
        if api_pid is None:
            raise RuntimeError("the API is not running")
        log.info("live: stack up after %.1f s", time.monotonic() - started)
        reader = services.clickhouse_client(settings, "reader")
        wait_until(
            lambda: (
                reader.command(
                    "SELECT count() FROM metrics WHERE startsWith(device_id, {p:String})",
                    parameters={"p": prefix},
                )
                > 0
            ),
            TIMEOUT_S,
            "the first readings",
        )
        log.info("live: first readings stored after %.1f s", time.monotonic() - started)
        token = services.component_env(settings)["JOBSCOPE_ADMIN_TOKEN"]
        jobs = [
            Job(
                f"{prefix}-job{j}",
                tuple(f"{prefix}-n{i}" for i in range(j * JOB_NODES, (j + 1) * JOB_NODES)),
                frozenset(_outlet(prefix, i) for i in range(j * JOB_NODES, (j + 1) * JOB_NODES)),
            )
            for j in range(JOBS)
        ]

        async def session() -> dict[str, Any]:
            headers = {"Authorization": f"Bearer {token}"}
            limits = httpx.Limits(max_connections=K_MAX + 5)
            timeout = httpx.Timeout(30.0, read=30.0)
            async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as http:
                s = Session(settings.api_url, api_pid, jobs, time.time() - 5, http)
                try:
                    out = await _run(s, WINDOW_S[quick])
                finally:
                    await s.disconnect(list(s.clients))
                out["problems"] = s.tally.problems
                out["problem_examples"] = s.tally.examples
                out["all_latencies"] = [v for lat in s.tally.latencies.values() for v in lat]
                return out

        live = asyncio.run(session())
        log.info("live: measured after %.1f s, stopping the stack", time.monotonic() - started)
    latencies = live.pop("all_latencies")
    if not latencies:
        raise RuntimeError("no reading received over the live stream in any window")
    phases = live["phases"]
    overall = _latency(latencies)
    return {
        "live_latency_p50_s": overall["latency_p50_s"],
        "live_latency_p99_s": overall["latency_p99_s"],
        "live_latency_max_s": overall["latency_max_s"],
        "live_cpu_per_client": _per_client(phases, "same_job"),
        "live_cpu_per_client_k1": _per_client(phases, "one"),
        "live_cpu_per_client_distinct_jobs": _per_client(phases, "distinct_jobs"),
        "live": {
            **live,
            "latency_readings": len(latencies),
            "nodes": NODES,
            "metrics_per_node": METRICS,
            "pdus": PDUS,
            "job_nodes": JOB_NODES,
            "jobs": JOBS,
            "k_max": K_MAX,
            "expected_readings_per_s_per_client": EXPECTED_PER_S,
            "goal_p99_s": GOAL_P99_S,
            "cpu_per_client_unit": "% of one core",
            "cpus": os.cpu_count(),
            "step_wall_s": round(time.monotonic() - started, 1),
        },
    }
