"""The API and ingestion while SQL users abuse ClickHouse (issue 12), on jobscope's bench stack
(bench/systems/jobscope.py, step `abuse`).

Load: a producer polling `FLEET` tester:// nodes x 20 metrics every second (ingestion goes
on throughout), plus a backfill of `BACKFILL_DEVICES` devices x 20 metrics x some minutes put
on the readings topic first, so that `metrics` has something to group. The small query is a
job of 10 of those devices x 1 minute (12,000 readings): `GET /api/jobs/{id}/metrics`
(JSON), its rows counted on every answer. An answer succeeds when it is a 200 with the right
count; any other (a refusal: 429, 503, 504; a wrong count; a client timeout; a connection
reset) is a failure, timed like the others but kept out of the percentiles of successes.

Phases, one after the other:
- `no_abuse`: one client sends the small query back to back -> `api_p99_no_abuse_s` (of the
  successful answers), `api_success_ratio_no_abuse`; a probe reading every 100 ms, a checker
  (the admin user, every 50 ms, as the freshness step) -> `freshness_p99_no_abuse_s`.
- `throughput`: 64 concurrent clients (asyncio) send it back to back ->
  `api_small_queries_per_s` (successful answers per second), `api_small_queries_p99_s` (of
  the successful answers) and `api_small_queries_success_ratio`.
- `sql_abuse`: 16 threads, each its own connection as the read-only `reader` user, send
  heavy queries (a count over 10^11 numbers; a GROUP BY over `metrics` repeated 100 times by
  an ARRAY JOIN) and send again as soon as one ends, however it ends; once they are running,
  the `no_abuse` measurement again -> `api_p99_under_sql_abuse_s`,
  `api_success_ratio_under_sql_abuse`, `freshness_p99_under_sql_abuse_s`,
  `freshness_seen_ratio_under_sql_abuse`. What the abusers got (answers, error codes, HTTP
  statuses, client timeouts) is counted. At the end their queries are killed (`KILL QUERY`
  by their query ids, as the admin user).

Freshness = when the checker first sees a probe reading minus when it was produced; the
checker's own query goes through the same server as the abuse, so a checker kept waiting
shows as staleness too (`checker_query_p99_s` beside each phase's freshness).

Verdicts (`verdicts`): a goal is met when the p99 of the successes is within its bound AND at
least SUCCESS_GOAL of the attempts succeeded (for freshness, an attempt that fails is a probe
never seen though produced more than the bound before the phase ended). A p99 goal allows 1%
of answers beyond the bound, and a refused answer is beyond any bound: judged on the p99 of
every answer, quick refusals would pull the p99 down and meet the goal by refusing.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from clickhouse_connect.driver.client import Client
from confluent_kafka import Producer

from bench.polling.cpu import machine_ticks
from bench.systems.jobscope_api import rows
from kafka.message import pack
from kafka.reading import Reading
from stack import kafka_broker, services
from stack.config import StackSettings
from stack.processes import wait_until

log = logging.getLogger("bench.abuse")

FLEET = 100  # tester:// nodes polled live, 20 metrics each every second
METRICS = 20
BACKFILL_DEVICES = 100
BACKFILL_TICKS = {True: 120, False: 900}  # 1 s apart: 2 / 15 minutes of 100 devices
JOB_DEVICES = 10
JOB_SECONDS = 60
CLIENTS = 64
ABUSERS = 16
# Seconds of each phase (quick, full); the abuse phase's once every abuser has sent a query.
WINDOW_S = {True: 3.0, False: 30.0}
ABUSE_WINDOW_S = {True: 5.0, False: 60.0}
REQUEST_TIMEOUT_S = {True: 20.0, False: 60.0}
PROBE_DEVICE = "abuse-probe"
PROBE_INTERVAL_S = 0.1
CHECK_INTERVAL_S = 0.05
GOALS = {"api_p99_under_sql_abuse_s": 1.0, "freshness_p99_under_sql_abuse_s": 2.0}
SUCCESS_GOAL = 0.99
"""The least share of attempts that must succeed for a goal on a p99 to be met."""
OK = "ok"
HEAVY_QUERIES = (
    "SELECT count() FROM numbers(100000000000)",
    "SELECT device_id, metric_id, count(), avg(value * n), max(value + n) FROM metrics "
    "ARRAY JOIN range(100) AS n GROUP BY device_id, metric_id",
)
CODE = re.compile(r"Code: (\d+)")


def write_devices(path: Path, prefix: str) -> Path:
    """The live fleet's devices file: `FLEET` tester:// nodes named after `prefix`."""
    path.write_text(
        "".join(
            f"- {{name: ab, device_id: {prefix}-{i}, url: 'tester://?metrics={METRICS}', "
            "update_every: 1000}\n"
            for i in range(FLEET)
        )
    )
    return path


def measure_on(
    settings: StackSettings, quick: bool, prefix: str, fleet_readings_per_s: int
) -> dict[str, Any]:
    """Every figure, on a running stack (Kafka, ClickHouse and the API) of `settings`; the
    devices of the backfill are named after `prefix`."""
    job_id, expected = _backfill_and_job(settings, prefix, quick)
    timeout = REQUEST_TIMEOUT_S[quick]
    path = f"/api/jobs/{job_id}/metrics"
    phases: dict[str, Any] = {}
    log.info("abuse: no abuse, one client")
    phases["no_abuse"] = _sequential_phase(settings, path, expected, WINDOW_S[quick], timeout)
    log.info("abuse: %d concurrent clients", CLIENTS)
    phases["throughput"] = asyncio.run(
        _concurrent(settings.api_url, path, expected, WINDOW_S[quick], timeout)
    )
    log.info("abuse: %d heavy reader queries", ABUSERS)
    abusers = _Abusers(settings)
    abusers.start()
    try:
        wait_until(lambda: abusers.sent >= ABUSERS, 30, "every abuser to send a query")
        phases["sql_abuse"] = _sequential_phase(
            settings, path, expected, ABUSE_WINDOW_S[quick], timeout
        )
    finally:
        phases["abusers"] = abusers.stop()
    under, none = phases["sql_abuse"], phases["no_abuse"]
    out = {
        "api_p99_no_abuse_s": none["api"]["p99_s"],
        "api_success_ratio_no_abuse": none["api"]["success_ratio"],
        "api_p99_under_sql_abuse_s": under["api"]["p99_s"],
        "api_success_ratio_under_sql_abuse": under["api"]["success_ratio"],
        "freshness_p99_no_abuse_s": none["freshness"]["p99_s"],
        "freshness_p99_under_sql_abuse_s": under["freshness"]["p99_s"],
        "freshness_seen_ratio_under_sql_abuse": under["freshness"]["seen_ratio"],
        "api_small_queries_per_s": phases["throughput"]["per_s"],
        "api_small_queries_p99_s": phases["throughput"]["p99_s"],
        "api_small_queries_success_ratio": phases["throughput"]["success_ratio"],
        "abuse": {
            **phases,
            "small_query": {"devices": JOB_DEVICES, "seconds": JOB_SECONDS, "readings": expected},
            "fleet_readings_per_s": fleet_readings_per_s,
            "abuser_threads": ABUSERS,
            "clients": CLIENTS,
            "heavy_queries": HEAVY_QUERIES,
            "goals": GOALS,
            "success_goal": SUCCESS_GOAL,
        },
    }
    out.update(verdicts(out))
    log.info(
        "abuse: small query p99 (successes) %s s alone, %s s under abuse (success ratio %s / "
        "%s); freshness p99 %s / %s s (seen ratio under abuse %s); %.1f queries/s with %d "
        "clients (p99 %s s, success ratio %s); abusers got %s",
        *(
            "n/a" if out[k] is None else f"{out[k]:.3f}"
            for k in (
                "api_p99_no_abuse_s",
                "api_p99_under_sql_abuse_s",
                "api_success_ratio_no_abuse",
                "api_success_ratio_under_sql_abuse",
                "freshness_p99_no_abuse_s",
                "freshness_p99_under_sql_abuse_s",
                "freshness_seen_ratio_under_sql_abuse",
            )
        ),
        out["api_small_queries_per_s"],
        CLIENTS,
        *(
            "n/a" if out[k] is None else f"{out[k]:.3f}"
            for k in ("api_small_queries_p99_s", "api_small_queries_success_ratio")
        ),
        phases["abusers"]["outcomes"],
    )
    return out


def verdicts(out: dict[str, Any]) -> dict[str, bool]:
    """Whether each goal under abuse is met: the p99 of the successes within its bound and at
    least SUCCESS_GOAL of the attempts successful (no figure: not met)."""

    def met(p99_key: str, ratio_key: str) -> bool:
        p99, ratio = out.get(p99_key), out.get(ratio_key)
        if p99 is None or ratio is None:
            return False
        return p99 <= GOALS[p99_key] and ratio >= SUCCESS_GOAL

    return {
        "api_under_sql_abuse_goal_met": met(
            "api_p99_under_sql_abuse_s", "api_success_ratio_under_sql_abuse"
        ),
        "freshness_under_sql_abuse_goal_met": met(
            "freshness_p99_under_sql_abuse_s", "freshness_seen_ratio_under_sql_abuse"
        ),
    }


def _backfill_and_job(settings: StackSettings, prefix: str, quick: bool) -> tuple[str, int]:
    """Put minutes of past readings of `BACKFILL_DEVICES` devices on the readings topic, wait
    until stored, create a terminated job over `JOB_DEVICES` of them x `JOB_SECONDS`; return
    its id and its number of readings."""
    ticks = BACKFILL_TICKS[quick]
    start_s = int(time.time()) - ticks - 60
    devices = [f"{prefix}-bf-{i}" for i in range(BACKFILL_DEVICES)]
    client = kafka_broker.client_settings(settings).kafka_client()
    producer = Producer({**client, "linger.ms": 20})
    labels: dict[str, str] = {}
    for tick in range(ticks):
        ts = (start_s + tick) * 1_000_000
        for n, device in enumerate(devices):
            readings = [
                Reading(ts, device, f"ab_m{m}", float(tick * 1000 + n + m), labels)
                for m in range(METRICS)
            ]
            while True:
                try:
                    producer.produce("readings", pack(readings).payload, key=device)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("the backfill was not delivered to Kafka")
    total = ticks * BACKFILL_DEVICES * METRICS
    admin = services.clickhouse_client(settings, "jobscope")
    wait_until(
        lambda: (
            admin.command(
                "SELECT count() FROM metrics WHERE startsWith(device_id, {p:String})",
                parameters={"p": f"{prefix}-bf-"},
            )
            >= total
        ),
        120,
        f"the backfill of {total:,} readings stored",
    )
    job_id = f"{prefix}-job"
    first = start_s + ticks // 2
    document = {
        "job_id": job_id,
        "user": "bench",
        "nodes": devices[:: BACKFILL_DEVICES // JOB_DEVICES][:JOB_DEVICES],
        "start": datetime.fromtimestamp(first, UTC).isoformat(),
        "end": datetime.fromtimestamp(first + JOB_SECONDS - 1, UTC).isoformat(),
        "state": "terminated",
    }
    token = services.component_env(settings)["JOBSCOPE_ADMIN_TOKEN"]
    response = httpx.post(
        f"{settings.api_url}/api/jobs",
        json=document,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    response.raise_for_status()
    wait_until(
        lambda: httpx.get(f"{settings.api_url}/api/jobs/{job_id}", timeout=10).status_code == 200,
        60,
        f"job {job_id} readable",
    )
    return job_id, JOB_DEVICES * JOB_SECONDS * METRICS


def _busy_since(ticks: tuple[int, int]) -> float:
    """The machine's busy fraction of CPU time since `ticks` (machine_ticks())."""
    busy, total = machine_ticks()
    return round((busy - ticks[0]) / max(1, total - ticks[1]), 3)


def _percentiles(seconds: list[float]) -> dict[str, float | None]:
    if not seconds:
        return {"p50_s": None, "p99_s": None, "max_s": None}
    values = np.array(seconds)
    return {
        "p50_s": float(np.percentile(values, 50)),
        "p99_s": float(np.percentile(values, 99)),
        "max_s": float(values.max()),
    }


def answers_summary(answers: list[tuple[str, float]]) -> dict[str, Any]:
    """A phase's answers, (outcome, seconds) each: how many of each outcome, the share that
    succeeded (`OK`) and the percentiles of the successes; every answer's percentiles apart
    (`all_answers`), where quick refusals pull the p99 down."""
    ok = [seconds for outcome, seconds in answers if outcome == OK]
    return {
        "queries": len(answers),
        "outcomes": dict(Counter(outcome for outcome, _ in answers)),
        "success_ratio": round(len(ok) / len(answers), 4) if answers else None,
        **_percentiles(ok),
        "all_answers": _percentiles([seconds for _, seconds in answers]),
    }


def _outcome(response: httpx.Response, body: bytes, expected: int) -> str:
    if response.status_code != 200:
        return f"HTTP {response.status_code}"
    got = rows("json", [body])
    return OK if got == expected else f"{got} readings instead of {expected}"


def _failed(exc: httpx.TransportError) -> str:
    """The outcome of a request that got no answer (a timeout, a connection refused or
    reset): a failure like a refusal."""
    if isinstance(exc, httpx.TimeoutException):
        return "client timeout"
    return f"no answer: {type(exc).__name__}"


def back_to_back(
    api_url: str, path: str, expected: int, window_s: float, timeout: float
) -> list[tuple[str, float]]:
    """(outcome, seconds) of each request one client sends to `path` back to back for
    `window_s`, every answer and every failure to get one."""
    answers: list[tuple[str, float]] = []
    with httpx.Client(base_url=api_url, timeout=timeout) as client:
        end = time.monotonic() + window_s
        while time.monotonic() < end:
            began = time.perf_counter()
            try:
                response = client.get(path)
                outcome = _outcome(response, response.content, expected)
            except httpx.TransportError as exc:
                outcome = _failed(exc)
            answers.append((outcome, time.perf_counter() - began))
    return answers


def _sequential_phase(
    settings: StackSettings, path: str, expected: int, window_s: float, timeout: float
) -> dict[str, Any]:
    """One client sending the small query back to back for `window_s`, and the freshness
    probe and checker beside it."""
    stop = threading.Event()
    freshness = _Freshness(settings)
    threads = [threading.Thread(target=f, args=(stop,), daemon=True) for f in freshness.workers()]
    for t in threads:
        t.start()
    ticks = machine_ticks()
    answers = back_to_back(settings.api_url, path, expected, window_s, timeout)
    stop.set()
    for t in threads:
        t.join(timeout + 5)
    return {
        "api": answers_summary(answers),
        "freshness": freshness.summary(),
        "window_s": window_s,
        "machine_busy_fraction": _busy_since(ticks),
    }


async def _concurrent(
    api_url: str, path: str, expected: int, window_s: float, timeout: float
) -> dict[str, Any]:
    """`CLIENTS` clients sending the small query back to back for `window_s`."""
    answers: list[tuple[str, float]] = []
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    ticks = machine_ticks()
    async with httpx.AsyncClient(base_url=api_url, timeout=timeout, limits=limits) as client:
        began_all = time.monotonic()
        end = began_all + window_s

        async def one_client() -> None:
            while time.monotonic() < end:
                began = time.perf_counter()
                try:
                    response = await client.get(path)
                    outcome = _outcome(response, response.content, expected)
                except httpx.TransportError as exc:
                    outcome = _failed(exc)
                answers.append((outcome, time.perf_counter() - began))

        await asyncio.gather(*(one_client() for _ in range(CLIENTS)))
        elapsed = time.monotonic() - began_all
    summary = answers_summary(answers)
    return {
        "clients": CLIENTS,
        **summary,
        "per_s": summary["outcomes"].get(OK, 0) / elapsed,
        "elapsed_s": elapsed,
        "machine_busy_fraction": _busy_since(ticks),
    }


class _Freshness:
    """A probe reading every 100 ms on the readings topic; a checker that sees when each one
    becomes queryable (the admin user, every 50 ms)."""

    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.sent_at: dict[int, float] = {}  # probe timestamp (µs) -> when produced
        self.seen: dict[int, float] = {}
        self.check_s: list[float] = []

    def workers(self) -> list[Callable[[threading.Event], None]]:
        return [self._probe, self._check]

    def _probe(self, stop: threading.Event) -> None:
        client = kafka_broker.client_settings(self.settings).kafka_client()
        producer = Producer({**client, "linger.ms": 0, "acks": "all"})
        while not stop.wait(PROBE_INTERVAL_S):
            now_us = int(time.time() * 1e6)
            reading = Reading(now_us, PROBE_DEVICE, "abuse_probe", 1.0, {})
            self.sent_at[now_us] = time.time()
            producer.produce("readings", pack([reading]).payload, key=PROBE_DEVICE)
            producer.poll(0)
        producer.flush(10)

    def _check(self, stop: threading.Event) -> None:
        client = services.clickhouse_client(self.settings, "jobscope")
        try:
            while not stop.wait(CHECK_INTERVAL_S):
                began = time.perf_counter()
                latest = client.command(
                    "SELECT toUnixTimestamp64Micro(max(timestamp)) FROM metrics "
                    "WHERE device_id = {d:String}",
                    parameters={"d": PROBE_DEVICE},
                )
                self.check_s.append(time.perf_counter() - began)
                now = time.time()
                for ts in [
                    t for t in list(self.sent_at) if t <= int(latest) and t not in self.seen
                ]:
                    self.seen[ts] = now - self.sent_at[ts]
        finally:
            client.close()

    def summary(self) -> dict[str, Any]:
        """Percentiles of the probes seen; those produced more than 5 s before the end and
        never seen are `unseen` (a probe never seen has no figure of its own). Those produced
        more than the freshness goal before the end and never seen are failures
        (`unseen_past_goal`: staler than the goal whenever they show up): `seen_ratio` is
        the probes seen over them and the probes seen."""
        last = max(self.sent_at, default=0)
        bound_us = int(GOALS["freshness_p99_under_sql_abuse_s"] * 1e6)
        never = [t for t in self.sent_at if t not in self.seen]
        past_goal = sum(1 for t in never if t < last - bound_us)
        judged = len(self.seen) + past_goal
        return {
            **_percentiles(list(self.seen.values())),
            "probes": len(self.sent_at),
            "seen": len(self.seen),
            "unseen": sum(1 for t in never if t < last - 5_000_000),
            "unseen_past_goal": past_goal,
            "seen_ratio": round(len(self.seen) / judged, 4) if judged else None,
            "checker_query_p99_s": _percentiles(self.check_s)["p99_s"],
        }


class _Abusers:
    """`ABUSERS` threads sending heavy queries as `reader`, each again as soon as it ends."""

    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.stopping = threading.Event()
        self.outcomes: Counter[str] = Counter()
        self.seconds: list[float] = []
        self.sent = 0
        self.lock = threading.Lock()
        self.run_id = uuid.uuid4().hex[:8]
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(ABUSERS)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        client: Client | None = None
        sql = HEAVY_QUERIES[i % len(HEAVY_QUERIES)]
        sent = 0
        while not self.stopping.is_set():
            sent += 1
            query_id = f"abuse-{self.run_id}-{i}-{sent}"
            with self.lock:
                self.sent += 1
            began = time.perf_counter()
            try:
                if client is None:  # connecting runs a query too, which may be refused
                    client = services.clickhouse_client(
                        self.settings, "reader", send_receive_timeout=600
                    )
                client.query(sql, settings={"query_id": query_id})
                outcome = "answered"
            except Exception as exc:  # every way a query can end is counted
                found = CODE.search(str(exc))
                status = re.search(r"HTTP(?: status)?[^0-9]{0,10}(\d{3})", str(exc))
                outcome = (
                    f"code {found.group(1)}"
                    if found
                    else f"HTTP {status.group(1)}"
                    if status
                    else type(exc).__name__
                )
            with self.lock:
                self.outcomes[outcome] += 1
                self.seconds.append(time.perf_counter() - began)
        if client is not None:
            client.close()

    def stop(self) -> dict[str, Any]:
        """Stop sending, kill what runs (the admin user's KILL QUERY by query id), wait."""
        self.stopping.set()
        admin = services.clickhouse_client(self.settings, "jobscope")
        killed = 0
        deadline = time.monotonic() + 60
        while any(t.is_alive() for t in self.threads) and time.monotonic() < deadline:
            try:
                # run_id is hex: safe to write into the statement (the local server's KILL
                # takes no bound parameters)
                result = admin.query(
                    f"KILL QUERY WHERE query_id LIKE 'abuse-{self.run_id}-%' ASYNC"
                )
                killed += len(result.result_rows)
            except Exception as exc:
                log.warning("abuse: KILL QUERY failed: %s", exc)
            for t in self.threads:
                t.join(1.0)
        with self.lock:
            return {
                "outcomes": dict(self.outcomes),
                "finished_queries": sum(self.outcomes.values()),
                "query_s": _percentiles(self.seconds),
                "kill_rows": killed,
                "still_running": sum(t.is_alive() for t in self.threads),
            }
