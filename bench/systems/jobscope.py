"""jobscope itself: Kafka broker + local ClickHouse server with the real schema, started by
the stack's own functions (stack/services.py), fed through Kafka as the producers feed it.
The common query shapes are fetched through the API (`fetch`, the user's layer) and, beside
them, straight from ClickHouse (`query_layers`).

Measured here, beyond the common figures:
- ingest end to end (`ingest_e2e_readings_per_s` in the results): from the first message
  produced until every reading is queryable in `metrics`, through the production Kafka engine
  table and views.
- `ingest_drain_readings_per_s`: the Kafka engine draining a topic filled beforehand, into a
  fresh database given the same schema: readings per second from the consumers' first
  messages read (system.kafka_consumers) until every reading is queryable; `consumer_start_s`
  (applying the schema until then) and the overall rate beside it.
- `freshness_p50_s` / `freshness_p99_s`: under the fleet's steady load (replayed in real time
  with current timestamps), how long a reading takes from produce to queryable.
- the job API (bench/systems/jobscope_api.py): a job of ~1 M readings in every format, through
  the API and straight from ClickHouse, its summary, a 1-minute step over the whole data set,
  the API's memory while it exports a large job, the report of a 100-node, 24-hour job.
- `drain_variants` (RowBinary, readings per message) and `format_variants` (RowBinary,
  JSONEachRow, CSV, a row per reading through a bare Kafka table).

The messages are the producers' own: one RowBinary array of the readings of one device and
tick, byte for byte what kafka/message.py `pack` makes of them (checked before every
ingest). Each drain's database is dropped once its figures are taken.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import re
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import chdb
import httpx
import numpy as np
from clickhouse_connect.driver.client import Client
from confluent_kafka import KafkaError, Message, Producer

from bench import payloads
from bench.dataset import US, Dataset, utc
from bench.polling.cpu import cpu_seconds
from bench.polling.producer import start_producer
from bench.systems import jobscope_abuse, jobscope_api, jobscope_rollups
from bench.systems.base import IDENTITY, Ingest, Selection, System, run_parallel
from clickhouse.migrate import MigrationSettings, apply_migrations
from clickhouse.schema import file_statements
from kafka import topics
from kafka.message import READING_STRUCTURE, header, pack
from kafka.reading import Reading
from producers.config import ProducerSettings
from producers.publisher import producer_config
from stack import kafka_broker, services
from stack.config import StackSettings
from stack.processes import free_port, wait_until

log = logging.getLogger("bench.jobscope")

TIMEOUT = 900.0
PRODUCERS = 2  # producer threads, each with its own Kafka client (as the peers' two clients)
# The data has past dates: the default 90-day TTL would drop them. Not more than ~80 years:
# the TTL is computed as a DateTime, which ends in 2106 and wraps around (rows then vanish).
RETENTION_DAYS = 3650
PROBE_DEVICE = "bench-probe"
PROBE_INTERVAL_S = 0.1
CHECK_INTERVAL_S = 0.05
WARMUP_READINGS = 2_400_000  # produced to a topic of their own before the ingest is timed
VARIANT_SECONDS = 120  # data drained per variant (full runs): 2.4 M readings
# Keyed by quick (True) or full run (False):
FRESHNESS_S = {True: 6, False: 60}  # length of the steady-load phase
FLOOR_REPEATS = 200
SERVERS = ("kafka", "clickhouse")  # the processes that ingest and store

# The format comparison's Kafka table is derived from the production one as
# clickhouse/schema.sql defines it (`_bare_queue`), never copied.
PRODUCTION_QUEUE = "readings_queue"
# Its columns as schema.sql shows them: the message's array, replaced by a row per reading.
_QUEUE_COLUMNS = re.compile(
    rf"\ACREATE TABLE {PRODUCTION_QUEUE}\s*\(.*?\n\)\s*(?=ENGINE = Kafka\b)", re.S
)
# The error stream, dropped: it fans rows out to ingest_errors, which the bare pipeline lacks.
_ERROR_STREAM = re.compile(r"\s*kafka_handle_error_mode = '\w+',")
FORMAT_TRIALS = 2  # fetches of a shape in each of the API's formats, the best one kept
READINGS_SQL = (
    "SELECT timestamp, device_id, metric_id, value, labels FROM metrics "
    "WHERE device_id IN {devices:Array(String)} "
    "AND timestamp >= {start:DateTime64(6, 'UTC')} AND timestamp < {end:DateTime64(6, 'UTC')}"
)


class Jobscope(System):
    name = "jobscope"
    label = "jobscope"
    query_layer = (
        "the API, GET /api/metrics?devices=... in the API's fastest format for the shape "
        "(`format` beside each shape), over one kept-alive HTTP client; beside it (`layers`: "
        "`clickhouse_direct`) the same readings straight from ClickHouse in Native"
    )
    ingest_input = (
        "its producers' messages on the readings topic (RowBinary, an array of a poll's 100 "
        "readings each) from 2 producer threads; remote write: the `remote_write` part's row"
    )

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.settings = StackSettings(
            state_dir=self.workdir / "stack",
            kafka_port=free_port(),
            kafka_controller_port=free_port(),
            clickhouse_port=free_port(),
            api_port=free_port(),
            producer_metrics_port=free_port(),
            retention_days=RETENTION_DAYS,
        )
        self.admin: Client | None = None
        self.reader: Client | None = None
        self.http: httpx.Client | None = None
        self.formats: dict[str, str] = {}  # query shape -> the API's fastest format for it
        self.topic_serial = 0

    def version(self) -> str:
        from importlib.metadata import version

        return f"chdb-core {version('chdb-core')}, confluent-kafka {version('confluent-kafka')}"

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        services.stop_all(self.settings)  # what a run that crashed left (its PID files)
        shutil.rmtree(self.workdir, ignore_errors=True)
        services.start_kafka(self.settings)
        services.start_clickhouse(self.settings)
        self.admin = self._client("jobscope")
        self.reader = self._client("reader")

    def _client(self, user: str, database: str = "default") -> Client:
        return services.clickhouse_client(
            self.settings,
            user,
            database=database,
            send_receive_timeout=int(TIMEOUT),
            autogenerate_session_id=False,
        )

    def stop(self) -> None:
        if self.http is not None:
            self.http.close()
        for client in (self.admin, self.reader):
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
        services.stop_all(self.settings)

    # -- ingest ----------------------------------------------------------------------------

    def _count(self, database: str = "default") -> int:
        assert self.admin is not None
        return int(self.admin.command(f"SELECT count() FROM {database}.metrics"))

    def warm(self, data: Dataset) -> None:
        """The broker is a JVM: before the clock starts, WARMUP_READINGS of the data go to a
        topic of their own (nothing consumes it), so that the broker's code is compiled as in
        a running deployment (measured: cold, it spent 1.6-1.8 CPU-s on this load instead of
        0.9-1.1). The peers (Go, C) have nothing to warm. The rollups' refreshes stay on,
        as deployed, through the ingest and every step after it."""
        self._fill("bench-warmup", self._warmup(data), 100, payloads.PRODUCTION_FORMAT, arrays=True)

    def _warmup(self, data: Dataset) -> Dataset:
        per_s = data.spec.devices * data.spec.metrics / data.spec.period_s
        return data.head(max(data.spec.period_s, int(WARMUP_READINGS / per_s)))

    def server_pids(self) -> list[int]:
        """The broker and the ClickHouse server."""
        return list(self._servers().values())

    def _servers(self) -> dict[str, int]:
        found = {name: services.process(self.settings, name).pid() for name in SERVERS}
        return {name: pid for name, pid in found.items() if pid is not None}

    def load(self, data: Dataset) -> Ingest:
        """End to end: produce everything to `readings`, wait until all of it is queryable
        (the broker warmed first: `warm`)."""
        parts = _messages(data)
        cpu_before = self._cpu_by_process()
        start = time.monotonic()
        produced = self._produce(topics.READINGS.name, parts, data, per_message=100, arrays=True)
        produce_s = time.monotonic() - start
        wait_until(
            lambda: self._count() >= data.spec.readings,
            TIMEOUT,
            "every reading to reach ClickHouse",
            interval=0.05,
        )
        seconds = time.monotonic() - start
        cpu = {k: v - cpu_before[k] for k, v in self._cpu_by_process().items()}
        if (stored := self._count()) != data.spec.readings:
            raise RuntimeError(f"metrics holds {stored} rows, {data.spec.readings} sent")
        return Ingest(
            data.spec.readings,
            seconds,
            {
                "produce_s": round(produce_s, 3),
                "messages": produced,
                "readings_per_message": 100,
                "producers": PRODUCERS,
                "broker_warmup_readings": self._warmup(data).spec.readings,
                "cpu_us_per_reading_by_process": {
                    k: round(v / data.spec.readings * 1e6, 3) for k, v in cpu.items()
                },
            },
        )

    def settle(self, data: Dataset) -> dict[str, Any]:
        """The rollups of the loaded readings, at once (bench/systems/jobscope_rollups.py:
        the refreshes' own queries, instead of 10-70 s later on their schedule): their
        servers' CPU is in the ingest's; `rollup_cpu_us_per_reading` is their share."""
        assert self.admin is not None
        cpu_before, began = self.servers_cpu_s(), time.monotonic()
        jobscope_rollups.wait_noted(self.admin.command, _buckets(data))
        jobscope_rollups.roll_up_now(self.admin.command)
        seconds, cpu_s = time.monotonic() - began, self.servers_cpu_s() - cpu_before
        log.info(
            "jobscope: rollups of the ingest in %.2f s, %.3f µs CPU per reading",
            seconds,
            cpu_s / data.spec.readings * 1e6,
        )
        return {
            "rollup_cpu_us_per_reading": cpu_s / data.spec.readings * 1e6,
            "rollup_seconds": seconds,
            "rollup_readings": data.spec.readings,
        }

    def stored(self, data: Dataset) -> int:
        """Rows of `metrics`; each rollup must count every loaded reading once (FINAL)."""
        assert self.admin is not None
        counts = self.admin.query(
            "SELECT (SELECT sum(count) FROM metrics_1m FINAL WHERE bucket < {end:DateTime64(6)}), "
            "(SELECT sum(count) FROM metrics_1h FINAL WHERE bucket < {end:DateTime64(6)})",
            parameters={"end": _clickhouse_time(data.spec.end_us)},
        ).first_row
        if list(counts) != [data.spec.readings] * 2:
            raise RuntimeError(f"the rollups count {counts} readings, {data.spec.readings} sent")
        return self._count()

    def _cpu_by_process(self) -> dict[str, float]:
        """CPU seconds used so far by the broker and the ClickHouse server."""
        return {name: cpu_seconds(pid) for name, pid in self._servers().items()}

    def _produce(
        self,
        topic: str,
        parts: list[payloads.KafkaMessages],
        data: Dataset,
        per_message: int,
        arrays: bool,
    ) -> int:
        """Send every message of `parts` (one thread and one client per part); return the
        number of messages acknowledged. A message is `per_message` rows of one poll, opened
        by the count of its readings if `arrays` (the production message: one array, see
        kafka/message.py), else the rows alone (a row per reading)."""
        sent = [0] * len(parts)
        names = [n.encode() for n in data.devices]
        opening = header(per_message) if arrays else b""

        def run(i: int, part: payloads.KafkaMessages) -> None:
            producer = self._producer(topic)
            failures: list[KafkaError] = []

            def on_delivery(err: KafkaError | None, _msg: Message) -> None:
                if err is not None:
                    failures.append(err)

            with (
                open(part.body, "rb") as f,
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as body,
            ):
                for dev, a, b in part.slices(per_message):
                    _produce_one(producer, topic, opening + body[a:b], names[dev], on_delivery)
                    sent[i] += 1
            if producer.flush(TIMEOUT) or failures:
                raise RuntimeError(f"Kafka delivery failed: {failures[:3]}")

        run_parallel(run, parts, TIMEOUT)
        return sum(sent)

    def _producer(self, topic: str) -> Producer:
        """A client configured exactly as jobscope's producers configure theirs."""
        client = kafka_broker.client_settings(self.settings, "producers")
        config = producer_config(ProducerSettings(**dict(client), readings_topic=topic))
        return Producer(config)

    def _fresh_topic(self, prefix: str) -> str:
        self.topic_serial += 1
        name = f"{prefix}-{self.topic_serial}"
        spec = topics.TopicSpec(name, topics.READINGS.partitions, topics.READINGS.config)
        security = kafka_broker.client_settings(self.settings).kafka_security()
        topics.ensure_topics(self.settings.kafka_bootstrap, (spec,), security=security)
        return name

    def _migration(self, database: str, topic: str) -> MigrationSettings:
        """The schema's settings for `database` reading `topic` (else the production ones)."""
        return services.migration_settings(
            self.settings,
            clickhouse_database=database,
            readings_topic=topic,
            consumer_group=database,
            retention_days=RETENTION_DAYS,
        )

    def _fill(
        self, prefix: str, data: Dataset, per_message: int, fmt: str, arrays: bool
    ) -> tuple[str, int]:
        """A new topic holding `data` in `fmt`; return (topic, readings produced)."""
        topic = self._fresh_topic(prefix)
        parts = _messages(data, fmt)
        return topic, self._produce(topic, parts, data, per_message, arrays) * per_message

    def _drained(
        self,
        database: str,
        readings: int,
        start_consumers: Callable[[], object],
        errors: str | None = None,
    ) -> dict[str, Any]:
        """Call `start_consumers` (which creates what makes `database`'s Kafka consumers
        start) and wait until `database.metrics` holds `readings`; the figures of the drain.

        Every CHECK_INTERVAL_S one query reads the rows stored, the rows rejected into the
        `errors` table (a drain fails at once on any: every message sent is valid) and the
        messages the database's consumers have read (system.kafka_consumers).
        `consumer_start_s` is when the first poll that saw messages read was sent;
        `readings_per_s` the rate from then until every reading is queryable,
        `overall_readings_per_s` the rate from the call; `first_rows_s`: when rows were
        first queryable."""
        assert self.admin is not None
        rejected_sql = f"(SELECT count() FROM {database}.{errors})" if errors else "0"
        sql = (
            f"SELECT (SELECT count() FROM {database}.metrics), {rejected_sql}, "
            "(SELECT sum(num_messages_read) FROM system.kafka_consumers "
            "WHERE database = {db:String})"
        )
        first_read: float | None = None
        first_rows: float | None = None
        start = time.monotonic()
        start_consumers()
        while True:
            asked = time.monotonic() - start
            stored, rejected, read = self.admin.query(sql, parameters={"db": database}).first_row
            if read and first_read is None:
                first_read = asked
            if stored and first_rows is None:
                first_rows = asked
            if rejected:
                raise RuntimeError(f"{rejected} rows in {database}.{errors}: rejected")
            if stored >= readings:
                seconds = time.monotonic() - start
                break
            if asked > TIMEOUT:
                raise TimeoutError(
                    f"timed out after {TIMEOUT:.0f} s waiting for the Kafka engine to fill "
                    f"{database} ({stored:,} of {readings:,} readings)"
                )
            time.sleep(CHECK_INTERVAL_S)
        if stored != readings:
            raise RuntimeError(f"{database}.metrics holds {stored} rows, {readings} sent")
        assert first_rows is not None
        if first_read is not None:
            consumer_start, source = first_read, "system.kafka_consumers"
        else:  # no poll saw messages read: fall back on the first rows queryable
            consumer_start, source = first_rows, "first rows queryable"
        return {
            "readings": readings,
            "seconds": seconds,
            "consumer_start_s": consumer_start,
            "consumer_start_source": source,
            "first_rows_s": first_rows,
            "drain_seconds": seconds - consumer_start,
            "readings_per_s": readings / (seconds - consumer_start),
            "overall_readings_per_s": readings / seconds,
        }

    @contextlib.contextmanager
    def _drain_db(self, data: Dataset, per_message: int = 100) -> Iterator[tuple[str, dict]]:
        """Fill a new topic with production messages, then create a new database and apply
        every migration to it (the last statement starts the Kafka consumers); yield the
        database and the figures of `_drained`, timed from just before the migrations. The
        database is dropped on leaving."""
        assert self.admin is not None
        topic, readings = self._fill(
            "bench-drain", data, per_message, payloads.PRODUCTION_FORMAT, arrays=True
        )
        database = topic.replace("-", "_")
        self.admin.command(f"CREATE DATABASE {database}")
        try:
            client = self._client("jobscope", database)
            try:
                migration = self._migration(database, topic)
                figures = self._drained(
                    database,
                    readings,
                    lambda: apply_migrations(client, migration),
                    errors="ingest_errors",
                )
            finally:
                client.close()
            yield database, figures
        finally:
            self._drop(database)

    def _drain(self, data: Dataset, per_message: int = 100) -> dict[str, Any]:
        with self._drain_db(data, per_message) as (_, figures):
            return figures

    def _drain_format(self, data: Dataset, fmt: str) -> dict[str, Any]:
        """Drain `data` in format `fmt` (100 readings per message, a row per reading) through
        a bare pipeline: a Kafka table with the production settings but no error stream ->
        a plain view -> a table like `metrics`. Compares formats with each other, not with
        the production pipeline (arrays, every reading checked, fan-out to the error table).
        Timed from creating the view (which starts the consumers); the database is dropped
        afterwards."""
        admin = self.admin
        assert admin is not None
        topic, readings = self._fill(f"bench-{fmt.lower()}", data, 100, fmt, arrays=False)
        db = topic.replace("-", "_")
        admin.command(f"CREATE DATABASE {db}")
        try:
            admin.command(f"CREATE TABLE {db}.metrics AS default.metrics")
            admin.command(_bare_queue(self._migration(db, topic), f"{db}.queue", fmt))
            view = (
                f"CREATE MATERIALIZED VIEW {db}.queue_mv TO {db}.metrics "
                f"AS SELECT * FROM {db}.queue"
            )
            return self._drained(db, readings, lambda: admin.command(view))
        finally:
            self._drop(db)

    def _drop(self, database: str) -> None:
        """DROP DATABASE `database`, which stops its Kafka consumers. Not SYNC, which never
        returns in the embedded engine (the local server refuses it); a plain DROP returns
        in under 2 s and the engine removes the files later. A failure is logged, not
        raised: the figures are taken."""
        assert self.admin is not None
        began = time.monotonic()
        try:
            self.admin.command(f"DROP DATABASE IF EXISTS {database}")
        except Exception as exc:
            log.warning("jobscope: DROP DATABASE %s failed: %s", database, exc)
        else:
            log.info("jobscope: dropped %s in %.2f s", database, time.monotonic() - began)

    # -- storage ---------------------------------------------------------------------------

    def _rows(self, sql: str, parameters: dict[str, Any]) -> list[list[Any]]:
        assert self.admin is not None
        return self.admin.query(sql, parameters=parameters).result_rows

    def compact(self) -> None:
        """OPTIMIZE ... FINAL every table that holds parts (rollups included)."""
        assert self.admin is not None
        jobscope_rollups.compact(self._rows, self.admin.command, "default")

    def storage_by_table(self) -> dict[str, int]:
        """Bytes of the active parts of every table of the database (system.parts)."""
        return jobscope_rollups.bytes_by_table(self._rows, "default")

    def storage_bytes(self) -> int:
        return sum(self.storage_by_table().values())

    def storage_bytes_of(self, data: Dataset) -> int:
        """Drained into a database of its own, rolled up and compacted as the main one."""
        assert self.admin is not None
        with self._drain_db(data) as (database, figures):
            if figures["readings"] != data.spec.readings:
                raise RuntimeError(
                    f"{figures['readings']} of {data.spec.readings} readings produced"
                )
            client = self._client("jobscope", database)
            try:
                jobscope_rollups.wait_noted(client.command, _buckets(data))
                jobscope_rollups.roll_up_now(client.command)
            finally:
                client.close()
            jobscope_rollups.compact(self._rows, self.admin.command, database)
            return sum(jobscope_rollups.bytes_by_table(self._rows, database).values())

    # -- queries ---------------------------------------------------------------------------

    def prepare_fetch(
        self, data: Dataset, selection: Selection, quick: bool = False
    ) -> dict[str, Any]:
        """The API's fastest format for the shape, as a client that measured them would use:
        each format (QUICK: jobscope_api.QUICK_FORMATS) fetched FORMAT_TRIALS times (answers
        counted), the least best time kept. The API is started (records off, nothing
        computed beside the queries) if it is not."""
        if self.http is None:
            self._restart_api({"JOBSCOPE_RECORDS_INTERVAL_S": "0"})
            self.http = httpx.Client(
                base_url=self.settings.api_url, timeout=TIMEOUT, headers=IDENTITY
            )
        trials: dict[str, float] = {}
        for fmt in jobscope_api.formats(quick):
            runs = []
            for _ in range(FORMAT_TRIALS):
                began = time.perf_counter()
                fetched = self._api_fetch(data, selection, fmt)
                runs.append(time.perf_counter() - began)
                self.count(fetched)
            trials[fmt] = min(runs)
        self.formats[selection.name] = best = min(trials, key=trials.__getitem__)
        return {"format": best, "format_trials_s": trials}

    def fetch(self, data: Dataset, selection: Selection) -> tuple[str, list[bytes]]:
        """Through the API (`query_layer`), in the format `prepare_fetch` chose."""
        return self._api_fetch(data, selection, self.formats[selection.name])

    def _api_fetch(self, data: Dataset, selection: Selection, fmt: str) -> tuple[str, list[bytes]]:
        """`GET /api/metrics` of the selection's devices and window (the API's end is
        inclusive) in `fmt`, the body received completely; (format, body)."""
        assert self.http is not None
        params = {
            "devices": ",".join(selection.device_names(data)),
            "start_time": utc(selection.start_us).isoformat(),
            "end_time": utc(selection.end_us - 1).isoformat(),
            "format": fmt,
        }
        with self.http.stream("GET", "/api/metrics", params=params) as response:
            if response.status_code != 200:
                response.read()
                raise RuntimeError(f"API {fmt}: HTTP {response.status_code}: {response.text}")
            return fmt, list(response.iter_bytes())

    def query_layers(self) -> dict[str, Callable[[Dataset, Selection], Any]]:
        return {"clickhouse_direct": self._fetch_direct}

    def _fetch_direct(self, data: Dataset, selection: Selection) -> bytes:
        """As the read-only user (which reads with FINAL, as the API does): every column in
        ClickHouse's Native format, received completely by clickhouse-connect (the API
        bypassed)."""
        assert self.reader is not None
        return self.reader.raw_query(
            READINGS_SQL,
            parameters={
                "devices": selection.device_names(data),
                "start": _clickhouse_time(selection.start_us),
                "end": _clickhouse_time(selection.end_us),
            },
            fmt="Native",
        )

    def count(self, fetched: bytes | tuple[str, list[bytes]]) -> int:
        """Rows in an API answer (by its format), or in a Native result, decoded by the
        ClickHouse engine in this process."""
        if isinstance(fetched, tuple):
            return jobscope_api.rows(*fetched)
        path = self.workdir / "fetched.native"
        path.write_bytes(fetched)
        try:
            return int(chdb.query(f"SELECT count() FROM file('{path}', Native)", "CSV").bytes())
        finally:
            path.unlink()

    # -- jobscope-only figures -------------------------------------------------------------

    def extra_measurements(
        self, data: Dataset, quick: bool, only: frozenset[str] | None = None
    ) -> dict[str, Any]:
        """Each figure on its own: one that fails is recorded and the others still run
        (a step may also report failed parts of its own). `only`: these steps alone."""
        out: dict[str, Any] = {}
        failed: dict[str, str] = {}
        # The rollups' refreshes run throughout, as deployed (the loaded readings were rolled
        # up by `settle`). The API's last. Each drain drops its database (and so its
        # consumers) once its figures are taken.
        steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("freshness", lambda: self._freshness(data, quick)),
            ("abuse", lambda: self._abuse(quick)),
            ("floor", self._floor),
            ("drain", lambda: self._drain_figures(data, quick)),
            ("api", lambda: self._api(data, quick)),
        ]
        for name, step in steps:
            if only is not None and name not in only:
                continue
            log.info("jobscope: %s", name)
            try:
                figures = step()
                failed.update(figures.pop("failed_measurements", {}))
                out.update(figures)
            except Exception as exc:
                log.error("jobscope: %s failed: %s", name, exc)
                failed[name] = f"{type(exc).__name__}: {exc}"
        if failed:
            out["failed_measurements"] = failed
        return out

    def _drain_figures(self, data: Dataset, quick: bool) -> dict[str, Any]:
        """The drain of the whole data set (production schema and format), then (full runs:
        settled choices) of its first minutes by readings per message and by format."""
        whole = self._drain(data)
        _log_drain("RowBinary, 100 readings/message, whole data set", whole)
        variants, formats = {"rowbinary_100_per_message": whole}, {}
        if not quick:
            part = data.head(VARIANT_SECONDS)
            for per_message in (10, 1):
                variants[f"rowbinary_{per_message}_per_message"] = v = self._drain(
                    part, per_message
                )
                _log_drain(f"RowBinary, {per_message} readings/message", v)
            for fmt in payloads.FORMATS:
                formats[fmt] = v = self._drain_format(part, fmt)
                _log_drain(f"{fmt}, bare Kafka table", v)
        return {
            "format_variants": formats,
            "ingest_drain_readings_per_s": whole["readings_per_s"],
            "ingest_drain_overall_readings_per_s": whole["overall_readings_per_s"],
            "consumer_start_s": whole["consumer_start_s"],
            "ingest_drain_seconds": whole["seconds"],
            "drain_variants": variants,
        }

    def _api(self, data: Dataset, quick: bool) -> dict[str, Any]:
        """The job API's figures (bench/systems/jobscope_api.py), on the API started here."""
        assert self.reader is not None
        assert self.admin is not None
        self._restart_api({"JOBSCOPE_RECORDS_INTERVAL_S": "0"})
        return jobscope_api.measure(
            self.settings, self.admin, self.reader, data, quick, self._restart_api
        )

    def _restart_api(self, env: dict[str, str] | None = None) -> None:
        """The API with these settings (`env`), whatever an earlier step started."""
        services.process(self.settings, "api").stop()
        services.start_api(self.settings, env=env)

    def _floor(self) -> dict[str, Any]:
        """`query_floor_s`: the median of a one-row query (`SELECT 1`) as the query shapes
        are fetched straight from ClickHouse (clickhouse-connect through the HTTP front),
        beside the same statement in an engine of this process (`engine_select1_s`): what the
        front adds to every query."""
        assert self.reader is not None
        reader = self.reader

        def front() -> None:
            reader.raw_query("SELECT 1", fmt="Native")

        engine = chdb.connect(":memory:")  # a connection of its own, as the server keeps one
        try:
            in_engine = _median_s(lambda: engine.query("SELECT 1", "Native"))
        finally:
            engine.close()
        return {"query_floor_s": _median_s(front), "engine_select1_s": in_engine}

    def _abuse(self, quick: bool) -> dict[str, Any]:
        """Issue 12's figures (bench/systems/jobscope_abuse.py) on the API started here, a
        producer polling a live fleet throughout."""
        assert self.admin is not None
        admin = self.admin
        self._restart_api()  # its default settings (the API step changed them)
        prefix = f"ab{self.topic_serial}x{int(time.time())}"
        devices = jobscope_abuse.write_devices(self.workdir / "abuse-devices.yaml", prefix)

        def polled() -> bool:
            found = admin.command(
                "SELECT count() FROM metrics WHERE device_id = {d:String}",
                parameters={"d": f"{prefix}-0"},
            )
            return int(found) > 0  # type: ignore[arg-type]

        producer = start_producer(
            self.settings, devices, polled, "the abuse fleet's first readings stored", 60
        )
        try:
            fleet = jobscope_abuse.FLEET * jobscope_abuse.METRICS
            return jobscope_abuse.measure_on(self.settings, quick, prefix, fleet)
        finally:
            producer.stop()

    def _freshness(self, data: Dataset, quick: bool) -> dict[str, Any]:
        """Replay the fleet in real time with current timestamps on `readings`, plus a probe
        device every 100 ms; a checker sees when each probe reading becomes queryable."""
        duration = FRESHNESS_S[quick]
        stop = threading.Event()
        sent_at: dict[int, float] = {}  # probe timestamp (us) -> wall time it was produced
        seen: dict[int, float] = {}
        data = data.head(duration + data.spec.period_s)
        devices = data.devices
        topic = topics.READINGS.name
        no_labels: dict[str, str] = {}  # one object for all, as a producer shares its labels

        def fleet() -> None:
            """Each poll packed when it is due, as the producers do, stamped with the time."""
            producer = self._producer(topic)
            began = time.time()
            for tick, dev in data.poll_order():
                due = began + (data.poll_us[tick, dev] - data.spec.start_us) / US
                if stop.wait(max(0.0, due - time.time())):
                    break
                message = _pack_poll(data, tick, dev, int(time.time() * US), no_labels)
                _produce_one(producer, topic, message, devices[dev].encode())
            producer.flush(30)

        def probe() -> None:
            producer = self._producer(topic)
            while not stop.wait(PROBE_INTERVAL_S):
                now_us = int(time.time() * US)
                message = pack([Reading(now_us, PROBE_DEVICE, "bench_probe", 1.0, no_labels)])
                sent_at[now_us] = time.time()
                _produce_one(producer, topic, message.payload, PROBE_DEVICE.encode())
            producer.flush(30)

        def check() -> None:
            client = self._client("jobscope")
            try:
                while not stop.wait(CHECK_INTERVAL_S):
                    latest = client.command(
                        "SELECT toUnixTimestamp64Micro(max(timestamp)) FROM metrics "
                        "WHERE device_id = {d:String}",
                        parameters={"d": PROBE_DEVICE},
                    )
                    now = time.time()
                    for ts in [t for t in list(sent_at) if t <= int(latest) and t not in seen]:
                        seen[ts] = now - sent_at[ts]
            finally:
                client.close()

        def timer() -> None:
            stop.wait(duration)
            stop.set()

        try:
            run_parallel(lambda _i, f: f(), (fleet, probe, check, timer), duration + 60)
        finally:
            stop.set()
        warmup = min(sent_at, default=0) + 2 * US  # the first seconds include consumer start
        samples = np.array([v for k, v in seen.items() if k >= warmup])
        if len(samples) == 0:
            raise RuntimeError("no probe reading became queryable during the freshness run")
        lost = sum(
            1 for k in sent_at if k >= warmup and k not in seen and k < max(sent_at) - 5 * US
        )
        return {
            "freshness_p50_s": float(np.percentile(samples, 50)),
            "freshness_p99_s": float(np.percentile(samples, 99)),
            "freshness_max_s": float(samples.max()),
            "freshness_samples": len(samples),
            "freshness_unseen_probes": lost,
            "freshness_load_readings_per_s": data.spec.devices
            * data.spec.metrics
            / data.spec.period_s,
        }


def _produce_one(
    producer: Producer,
    topic: str,
    value: bytes,
    key: bytes,
    on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
) -> None:
    """Queue one message, waiting while the client's queue is full."""
    while True:
        try:
            if on_delivery is None:
                producer.produce(topic, value, key)
            else:
                producer.produce(topic, value, key, on_delivery=on_delivery)
            producer.poll(0)
            return
        except BufferError:
            producer.poll(0.05)


def _median_s(call: Callable[[], object], repeats: int = FLOOR_REPEATS) -> float:
    """Median seconds of `call` after as many untimed warm-up calls."""
    for _ in range(repeats):
        call()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def _log_drain(what: str, v: dict[str, Any]) -> None:
    log.info(
        "jobscope: drain, %s: %.0f readings/s after the consumer start (%.2f s), %.0f overall",
        what,
        v["readings_per_s"],
        v["consumer_start_s"],
        v["overall_readings_per_s"],
    )


def _messages(data: Dataset, fmt: str = payloads.PRODUCTION_FORMAT) -> list[payloads.KafkaMessages]:
    """The messages of each producer thread; in the production format, checked first to be
    what kafka/message.py `pack` makes of the same readings."""
    parts = [payloads.kafka_messages(data, p, PRODUCERS, fmt) for p in range(PRODUCERS)]
    if fmt == payloads.PRODUCTION_FORMAT:
        for part in parts:
            _check_format(part, data)
    return parts


def _bare_queue(production: MigrationSettings, table: str, fmt: str) -> str:
    """CREATE TABLE `table`: the production readings table of clickhouse/schema.sql with a
    row per reading in `fmt` instead of the message's array, without the error stream, and
    the broker, topic, group, consumers and flush interval of `production` instead of the
    defaults the file shows. Raises if the production table no longer has what is replaced."""
    (create,) = file_statements([PRODUCTION_QUEUE])
    create, columns = _QUEUE_COLUMNS.subn(f"CREATE TABLE {table} ({READING_STRUCTURE})\n", create)
    create, streams = _ERROR_STREAM.subn("", create)
    if (columns, streams) != (1, 1):
        raise RuntimeError(f"clickhouse/schema.sql's {PRODUCTION_QUEUE} changed shape: {create}")
    values = production.placeholders()
    for name, value in (
        ("kafka_broker_list", f"'{values['KAFKA_BROKERS']}'"),
        ("kafka_topic_list", f"'{values['READINGS_TOPIC']}'"),
        ("kafka_group_name", f"'{values['CONSUMER_GROUP']}'"),
        ("kafka_format", f"'{fmt}'"),
        ("kafka_num_consumers", values["KAFKA_CONSUMERS"]),
        ("kafka_flush_interval_ms", values["KAFKA_FLUSH_INTERVAL_MS"]),
    ):
        create = _kafka_setting(create, name, value)
    return create


def _kafka_setting(create: str, name: str, value: str) -> str:
    """`create` with its setting `name` set to `value` (SQL text); raises if it has none."""
    pattern = rf"\b({name} = )(?:'[^']*'|[^,\s]+)"
    create, found = re.subn(pattern, lambda m: m.group(1) + value, create)
    if found != 1:
        raise RuntimeError(f"{PRODUCTION_QUEUE} of clickhouse/schema.sql has no {name}")
    return create


def _pack_poll(
    data: Dataset, tick: int, dev: int, timestamp_us: int, labels: dict[str, str]
) -> bytes:
    """One poll's readings as the producers send them: kafka/message.py `pack`."""
    devices = data.devices
    values = data.values[tick, dev].tolist()
    return pack(
        Reading(timestamp_us, devices[dev], metric, value, labels)
        for metric, value in zip(data.metrics, values, strict=True)
    ).payload


def _check_format(part: payloads.KafkaMessages, data: Dataset) -> None:
    """The first and last messages of `part`, as `_produce` sends them to the production
    pipeline (the count of readings, then their rows), are byte for byte `pack`'s."""
    m, starts = data.spec.metrics, part.row_starts
    with open(part.body, "rb") as f:
        for poll in (0, len(part.polls) - 1):
            tick, dev = (int(x) for x in part.polls[poll])
            f.seek(starts[poll * m])
            got = header(m) + f.read(int(starts[(poll + 1) * m] - starts[poll * m]))
            if got != _pack_poll(data, tick, dev, int(data.poll_us[tick, dev]), {}):
                raise RuntimeError(f"bench message {poll} of {part.body} differs from `pack`")


def _buckets(data: Dataset) -> int:
    """How many (device, minute) buckets the readings of `data` fall in."""
    minutes = data.poll_us // (60 * US)
    return sum(len(np.unique(minutes[:, d])) for d in range(data.spec.devices))


def _clickhouse_time(epoch_us: int) -> str:
    """A DateTime64(6, 'UTC') query parameter: 2026-01-01 00:05:00.000000."""
    return utc(epoch_us).strftime("%Y-%m-%d %H:%M:%S.%f")
