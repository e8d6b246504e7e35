"""What each lever of issue 14 buys, measured in-process with chdb (no Kafka, no HTTP).

A lab notebook of one issue, kept out of `make bench`: it chose the message layout (0008),
the rollups refreshed from pending buckets (0022) and the layout of `metrics` (0020); its
figures are quoted in docs/data-flow.md and docs/kubernetes.md.

`python -m bench.experiments.ingest_levers` prints two tables (about 15 minutes on 2 busy cores):

- Ingest: CPU seconds (all threads of this process: `time.process_time`) per reading of the
  INSERTs of the bench's messages (one, or blocks of `--block-polls` messages as the Kafka
  table delivers them) into a stand-in of the readings topic's Kafka table, through the
  views of the migrations (every file as `clickhouse.migrate` applies it to a fresh
  database, each Kafka table replaced by a Null table with the engine's virtual columns as
  defaults, so that the views run on INSERT as they run on a consumed block), then of the
  rollups' refreshes over them (`refresh`). `VARIANTS`: the current chain, the chain before
  0022 (rollups by views on every insert), then with one lever changed each (validity
  function a constant, no t-digest, `optimize_on_insert = 0`, `metrics` ordered time first,
  fewer rollups), a message shape with the time, device and labels hoisted out of the
  readings (`HOISTED_*`), and rows straight into `metrics` (and bare: the floor). Merges are
  stopped; a fresh database per run; every variant once per round; the best round counts.
- Queries: engine time (chdb's elapsed, median of the runs) of the bench's query shapes
  with the read-only users' FINAL, on a day of readings, per storage layout of `metrics`
  (`LAYOUTS`), after OPTIMIZE FINAL, with rows read and bytes per reading (per column too).

The data are the bench's (bench/dataset.py, cached under state/bench/data like the bench's),
the current messages its RowBinary rows (bench/payloads.py) each opened by
kafka/message.py `header`, as the bench sends them.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import chdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench import payloads
from bench.dataset import Dataset, DatasetSpec, load_or_generate
from bench.profiles import selections
from bench.systems.base import Selection
from bench.systems.jobscope import READINGS_SQL, _clickhouse_time
from clickhouse import rollups
from clickhouse.migrate import MIGRATIONS_DIR, MigrationSettings, render, statements, superseded
from kafka.message import header

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_ROOT = REPO_ROOT / "state" / "bench" / "data"

# The Kafka engine's virtual columns (those the migrations' views read), as a Null table's
# defaults: a consumed message without a parse error has these values.
KAFKA_VIRTUAL_COLUMNS = (
    "_topic LowCardinality(String) DEFAULT 'readings'",
    "_partition UInt64 DEFAULT 0",
    "_offset UInt64 DEFAULT 0",
    "_key String DEFAULT ''",
    "_error String DEFAULT ''",
    "_raw_message String DEFAULT ''",
)
_KAFKA_ENGINE = re.compile(r"\)\s*ENGINE\s*=\s*Kafka\b.*\Z", re.S)

# The hoisted message: per message one time, one device, one labels map, then the readings'
# (metric, value) pairs. RowBinary: Int64 LE microseconds, varint length + device id, varint
# count + (key, value) strings, varint count + (varint length + metric id, Float64 LE) each.
HOISTED_STRUCTURE = (
    "timestamp DateTime64(6, 'UTC'), device_id String, labels Map(String, String), "
    "readings Array(Tuple(metric_id String, value Float64))"
)
# The checks of jobscope_reading_problem, once per message for what a message shares.
HOISTED_SCHEMA = (
    """CREATE OR REPLACE FUNCTION jobscope_message_problem AS (timestamp, device_id, readings) ->
multiIf(
    device_id = '' OR has(tupleElement(readings, 'metric_id'), ''),
        'empty device_id or metric_id',
    NOT arrayAll(v -> isFinite(v), tupleElement(readings, 'value')), 'value is not finite',
    timestamp < toDateTime64('2000-01-01 00:00:00', 6, 'UTC')
        OR timestamp >= toDateTime64('2101-01-01 00:00:00', 6, 'UTC'),
        'timestamp outside 2000-2100',
    NOT (isValidUTF8(device_id)
         AND arrayAll(m -> isValidUTF8(m), tupleElement(readings, 'metric_id'))),
        'ids are not UTF-8',
    '')""",
    "DROP VIEW IF EXISTS readings_queue_metrics_mv",
    "DROP VIEW IF EXISTS readings_queue_errors_mv",
    "DROP TABLE IF EXISTS readings_queue",
    f"CREATE TABLE readings_queue ({HOISTED_STRUCTURE}, {', '.join(KAFKA_VIRTUAL_COLUMNS)}) "
    "ENGINE = Null",
    """CREATE MATERIALIZED VIEW readings_queue_errors_mv TO ingest_errors AS
WITH jobscope_message_problem(timestamp, device_id, readings) AS problem
SELECT now64(3) AS received_at, _topic AS topic, _partition AS partition, _offset AS offset,
    _key AS key,
    if(_error != '', _raw_message,
       formatRowNoNewline('JSONEachRow', timestamp, device_id, labels, readings)) AS raw_message,
    if(_error != '', _error, problem) AS error
FROM readings_queue
WHERE _error != '' OR problem != ''""",
    """CREATE MATERIALIZED VIEW readings_queue_metrics_mv TO metrics AS
SELECT timestamp, device_id, r.metric_id AS metric_id, r.value AS value, labels
FROM readings_queue
ARRAY JOIN readings AS r
WHERE jobscope_message_problem(timestamp, device_id, readings) = ''""",
)
NO_CHECK = "CREATE OR REPLACE FUNCTION jobscope_reading_problem AS (r) -> ''"
TDIGEST_COLUMN = ",\n    quantilesTDigestState(0.5, 0.95)(value) AS quantiles"
# The rollups fed by views on every insert (0011-0014), and their replacement by refreshes
# of the buckets inserts note (0022).
INCREMENTAL_ROLLUPS = ("0011_", "0012_", "0013_", "0014_")
REFRESHED_ROLLUPS = ("0022_",)
NO_ROLLUPS = INCREMENTAL_ROLLUPS + REFRESHED_ROLLUPS
# A device's readings by time, then series: a short window of a few devices is a few ranges
# (the dedup key holds the same columns). Series are interleaved, so values' deltas grow.
TIME_FIRST = "(device_id, timestamp, metric_id, sipHash64(labels))"
SERIES_ORDER = "ORDER BY (device_id, metric_id, sipHash64(labels), timestamp)"  # of 0010
# A device's ten minutes together, by series within them. ClickHouse 26.1 does not prune such
# a key by a condition on `timestamp` alone (measured: every granule of the device is read),
# so the queries add the same condition on the bucket, or a minmax index on the time prunes.
BUCKETED = "(device_id, toStartOfTenMinutes(timestamp), metric_id, sipHash64(labels), timestamp)"
BY_TIME_INDEX = "INDEX by_time timestamp TYPE minmax GRANULARITY 1"
_TABLE_END = re.compile(r"\)\s*ENGINE = ReplacingMergeTree")


def bucketed(statement: str) -> str:
    """0010's `metrics` in 10-minute buckets with a minmax index on the time."""
    if SERIES_ORDER not in statement:
        return statement
    statement = statement.replace(SERIES_ORDER, f"ORDER BY {BUCKETED}")
    return _TABLE_END.sub(f",\n    {BY_TIME_INDEX}\n) ENGINE = ReplacingMergeTree", statement, 1)


def without_tdigest(statement: str) -> str:
    """The 1-minute view without its t-digest column (the table's stays, empty states)."""
    return statement.replace(TDIGEST_COLUMN, "") if "MATERIALIZED VIEW" in statement else statement


def stand_in(statement: str) -> str:
    """A CREATE TABLE of the Kafka engine as a Null table with the engine's virtual columns."""
    if not _KAFKA_ENGINE.search(statement):
        return statement
    virtual = ",\n    ".join(KAFKA_VIRTUAL_COLUMNS)
    return _KAFKA_ENGINE.sub(f",\n    {virtual}\n) ENGINE = Null", statement)


def schema(
    edit: Callable[[str], str] = lambda s: s,
    skip: tuple[str, ...] = (),
    directory: Path = MIGRATIONS_DIR,
) -> Iterator[tuple[str, str]]:
    """(migration, statement) of every migration of `directory` as a fresh database gets
    them, Kafka tables stood in for, each passed through `edit`; files starting with one of
    `skip` left out."""
    texts = {p.name: p.read_text() for p in sorted(directory.glob("*.sql"))}
    replaced = {old for text in texts.values() for old in superseded(text)}
    values = MigrationSettings(clickhouse_admin_password="unused").placeholders()  # type: ignore[arg-type]
    for name, text in texts.items():
        if name in replaced or name.startswith(skip):
            continue
        for statement in statements(render(text, values)):
            yield name, edit(stand_in(statement))


class Engine:
    """One chdb connection to a data directory of its own."""

    def __init__(self, path: Path) -> None:
        self.conn = chdb.connect(f"file:{path}")

    def run(self, sql: str, fmt: str = "TSV", params: dict[str, str] | None = None) -> object:
        result = self.conn.query(sql, fmt, params=params or {})
        if result.has_error():
            raise RuntimeError(f"{result.error_message()}\n{sql[:300]}")
        return result

    def value(self, sql: str) -> str:
        return self.run(sql).bytes().decode().strip()  # type: ignore[attr-defined]

    def fresh(self, database: str) -> None:
        self.run(f"DROP DATABASE IF EXISTS {database}")
        self.run(f"CREATE DATABASE {database}")
        self.run(f"USE {database}")


# -- ingest -----------------------------------------------------------------------------------


CURRENT_QUEUE = "readings_queue (readings)"
HOISTED_QUEUE = "readings_queue (timestamp, device_id, labels, readings)"


@dataclass(frozen=True)
class Variant:
    """One ingest chain: the schema, then the insert that is timed."""

    name: str
    what: str
    target: str  # INSERT INTO this
    payload: str  # key of the payload file (current, hoisted, rows)
    edit: Callable[[str], str] = lambda s: s
    skip: tuple[str, ...] = ()
    after: tuple[str, ...] = ()  # statements run after the migrations
    must_contain: str = ""  # a text the edited schema must hold (the edit took)
    settings: str = ""  # of the insert (which its views' inserts inherit)

    def statements(self, migrations: Path) -> list[str]:
        stmts = [s for _, s in schema(self.edit, self.skip, migrations)] + list(self.after)
        if self.must_contain and not any(self.must_contain in s for s in stmts):
            raise RuntimeError(f"{self.name}: the migrations no longer hold what it edits")
        return stmts

    def insert(self, file: Path | str) -> str:
        settings = f" SETTINGS {self.settings}" if self.settings else ""
        return f"INSERT INTO {self.target} FROM INFILE '{file}'{settings} FORMAT RowBinary"

    @property
    def table(self) -> str:
        """Where its readings are stored."""
        return "metrics_floor" if self.target.startswith("metrics_floor") else "metrics"


VARIANTS = (
    Variant(
        "current",
        "current chain (errors view, metrics view, pending buckets, aliases; the rollups "
        "refreshed after it: column refresh)",
        CURRENT_QUEUE,
        "current",
    ),
    Variant(
        "incremental",
        "the chain before 0022 (1m/1h/latest/aliases views on every insert)",
        CURRENT_QUEUE,
        "current",
        skip=REFRESHED_ROLLUPS,
    ),
    Variant(
        "no_check",
        "current, jobscope_reading_problem a constant ''",
        CURRENT_QUEUE,
        "current",
        edit=lambda s: NO_CHECK if "FUNCTION jobscope_reading_problem" in s else s,
        must_contain=NO_CHECK,
    ),
    Variant(
        "incremental_no_tdigest",
        "incremental, 1m view without its t-digest state",
        CURRENT_QUEUE,
        "current",
        edit=without_tdigest,
        skip=REFRESHED_ROLLUPS,
        must_contain="CREATE MATERIALIZED VIEW IF NOT EXISTS metrics_1m_mv",
    ),
    Variant(
        "no_optimize_on_insert",
        "current, optimize_on_insert = 0 (no merge pass of each new part)",
        CURRENT_QUEUE,
        "current",
        settings="optimize_on_insert = 0",
    ),
    Variant(
        "time_first",
        f"current, metrics ordered by {TIME_FIRST}",
        CURRENT_QUEUE,
        "current",
        edit=lambda s: s.replace(SERIES_ORDER, f"ORDER BY {TIME_FIRST}"),
        must_contain=f"ORDER BY {TIME_FIRST}",
    ),
    Variant(
        "bucket_minmax",
        "current, metrics in 10-minute buckets with a minmax index on the time",
        CURRENT_QUEUE,
        "current",
        edit=bucketed,
        must_contain=BY_TIME_INDEX,
    ),
    Variant(
        "only_1m",
        "incremental, without 0012-0014 (1m rollup only)",
        CURRENT_QUEUE,
        "current",
        skip=INCREMENTAL_ROLLUPS[1:] + REFRESHED_ROLLUPS,
    ),
    Variant(
        "no_rollups",
        "without 0011-0014 and 0022 (no rollups, latest values, aliases)",
        CURRENT_QUEUE,
        "current",
        skip=NO_ROLLUPS,
    ),
    Variant(
        "hoisted",
        "hoisted message (time, device, labels once), checks once per message",
        HOISTED_QUEUE,
        "hoisted",
        after=HOISTED_SCHEMA,
    ),
    Variant(
        "hoisted_lean",
        "hoisted, optimize_on_insert = 0",
        HOISTED_QUEUE,
        "hoisted",
        after=HOISTED_SCHEMA,
        settings="optimize_on_insert = 0",
    ),
    Variant(
        "hoisted_no_rollups",
        "hoisted, without 0011-0014 and 0022",
        HOISTED_QUEUE,
        "hoisted",
        skip=NO_ROLLUPS,
        after=HOISTED_SCHEMA,
    ),
    Variant(
        "rows_into_metrics",
        "rows (RowBinary) into metrics, its rollup views on",
        "metrics",
        "rows",
    ),
    Variant(
        "floor",
        "rows (RowBinary) into a bare copy of metrics (no views)",
        "metrics_floor",
        "rows",
        after=("CREATE TABLE metrics_floor AS metrics",),
    ),
)


def write_payloads(data: Dataset, folder: Path, block_polls: int) -> dict[str, list[Path]]:
    """The data set as the files each variant inserts, one INSERT each: `rows` (the bench's
    RowBinary rows, a row per reading), `current` (those rows opened per poll by the count:
    the production messages, as the bench sends them), `hoisted` (HOISTED_STRUCTURE, one row
    per poll); the polls of each cut in blocks of `block_polls` (0: one block)."""
    part = payloads.kafka_messages(data)
    body = np.fromfile(part.body, np.uint8)
    per_poll = data.spec.metrics
    poll_starts = part.row_starts[:-1:per_poll]
    opening = np.frombuffer(header(per_poll), np.uint8)
    current = np.insert(
        body, np.repeat(poll_starts, len(opening)), np.tile(opening, len(poll_starts))
    )
    one_per_poll = hoisted(data, part.polls)
    polls = len(poll_starts)
    starts = {
        "rows": (body, poll_starts),
        "current": (current, poll_starts + np.arange(polls) * len(opening)),
        "hoisted": (one_per_poll, np.arange(polls) * (len(one_per_poll) // polls)),
    }
    files: dict[str, list[Path]] = {}
    for name, (payload, poll_at) in starts.items():
        cuts = [*poll_at[:: block_polls or polls], len(payload)]
        files[name] = []
        for i, (a, b) in enumerate(itertools.pairwise(cuts)):
            files[name].append(folder / f"{name}-{i}.rowbinary")
            payload[a:b].tofile(files[name][-1])
    return files


def _field(text: str) -> bytes:
    return header(len(text.encode())) + text.encode()


def hoisted(data: Dataset, polls: np.ndarray) -> np.ndarray:
    """The readings of `polls` (tick, device) in HOISTED_STRUCTURE's RowBinary, one message
    per poll, no labels; built as a template per message with times, devices and values
    scattered into it."""
    devices = [_field(d) for d in data.devices]
    if len({len(d) for d in devices}) != 1:
        raise ValueError("the hoisted encoder expects device names of one length")
    dev_len, m = len(devices[0]), data.spec.metrics
    metric_fields = [_field(name) for name in data.metrics]
    head = 8 + dev_len + 1  # timestamp, device, empty labels
    prefix = header(m)
    template = bytearray(b"\x00" * head + prefix)
    value_at = []
    for field in metric_fields:
        template += field
        value_at.append(len(template))
        template += b"\x00" * 8
    tick, dev = polls[:, 0], polls[:, 1]
    out = np.tile(np.frombuffer(bytes(template), np.uint8), (len(polls), 1))
    out[:, :8] = data.poll_us[tick, dev].astype("<i8").view(np.uint8).reshape(-1, 8)
    names = np.array([np.frombuffer(d, np.uint8) for d in devices])
    out[:, 8 : 8 + dev_len] = names[dev]
    values = np.ascontiguousarray(data.values[tick, dev], "<f8").view(np.uint8)
    columns = (np.array(value_at)[:, None] + np.arange(8)).reshape(-1)
    out[:, columns] = values.reshape(len(polls), -1)
    return out.reshape(-1)


def ingest_run(
    engine: Engine, variant: Variant, files: list[Path], migrations: Path
) -> tuple[float, float, float | None, str]:
    """CPU and wall seconds of the variant's inserts into a fresh database, the CPU of the
    rollups' refreshes after them (None without refreshes), and what it stored (the count
    and an order-free hash of the rows: equal across variants)."""
    database = f"lever_{variant.name}"
    engine.fresh(database)
    for statement in variant.statements(migrations):
        engine.run(statement)
    refreshed = engine.value(
        "SELECT count() FROM system.view_refreshes WHERE database = currentDatabase()"
    ) == str(len(rollups.REFRESHES))
    if refreshed:
        rollups.switch(engine.run, "STOP")
    engine.run("SYSTEM STOP MERGES")
    began_cpu, began = time.process_time(), time.perf_counter()
    for file in files:
        engine.run(variant.insert(file))
    cpu, wall = time.process_time() - began_cpu, time.perf_counter() - began
    refresh_cpu = refresh(engine) if refreshed else None
    contents = engine.value(
        "SELECT count(), groupBitXor(cityHash64(timestamp, device_id, metric_id, value, "
        f"labels)) FROM {variant.table}"
    )
    if variant.target.startswith("readings_queue"):
        rejected = int(engine.value("SELECT count() FROM ingest_errors"))
        if rejected:
            raise RuntimeError(f"{variant.name}: {rejected} readings rejected")
    engine.run("SYSTEM START MERGES")
    engine.run(f"DROP DATABASE {database}")
    return cpu, wall, refresh_cpu, contents


def refresh(engine: Engine) -> float:
    """CPU seconds of the 1-minute, then the 1-hour refresh over every reading inserted
    (merges stopped, as during the insert: FINAL reads the parts as inserted). A refresh
    takes the buckets noted before the current minute: the notes are copied 2 minutes back
    (each bucket is then noted twice, computed once)."""
    engine.run(
        "INSERT INTO rollup_pending SELECT device_id, bucket, noted_at - INTERVAL 2 MINUTE "
        "FROM rollup_pending"
    )
    began = time.process_time()
    rollups.refresh_now(engine.run)
    cpu = time.process_time() - began
    counts = engine.value(
        "SELECT (SELECT sum(count) FROM metrics_1m FINAL), (SELECT sum(count) FROM metrics_1h "
        "FINAL), (SELECT count() FROM metrics FINAL)"
    ).split()
    if len(set(counts)) != 1:
        raise RuntimeError(f"the rollups count 1m, 1h, raw: {counts}")
    return cpu


def check_rejects(engine: Engine, migrations: Path) -> None:
    """A message with an empty device id lands in ingest_errors, not in metrics, in the
    current and the hoisted chain alike (the hoisted checks do reject)."""
    time_device = (0).to_bytes(8, "little") + _field("")
    samples = {
        "current": header(1) + time_device + _field("m") + b"\x00" * 8 + b"\x00",
        "hoisted": time_device + b"\x00" + header(1) + _field("m") + b"\x00" * 8,
    }
    for variant in VARIANTS:
        if variant.name not in samples:
            continue
        engine.fresh("lever_reject")
        for statement in variant.statements(migrations):
            engine.run(statement)
        with tempfile.NamedTemporaryFile(suffix=".rowbinary") as f:
            f.write(samples[variant.name])
            f.flush()
            engine.run(variant.insert(f.name))
        got = engine.value(
            "SELECT (SELECT count() FROM metrics), (SELECT count() FROM ingest_errors)"
        )
        if got.split() != ["0", "1"]:
            raise RuntimeError(f"{variant.name}: a bad message gave metrics, errors = {got}")
        engine.run("DROP DATABASE lever_reject")


# -- queries ----------------------------------------------------------------------------------

SERIES_KEY = "device_id, metric_id, sipHash64(labels)"
# The read-only users' profile (stack/clickhouse_server/users.py), which the API's reader shares.
AS_READER = " SETTINGS final = 1, do_not_merge_across_partitions_select_final = 1"


BUCKET_WHERE = (
    " AND toStartOfTenMinutes(timestamp) >= toStartOfTenMinutes({start:DateTime64(6, 'UTC')})"
    " AND toStartOfTenMinutes(timestamp) <= toStartOfTenMinutes({end:DateTime64(6, 'UTC')})"
)


@dataclass(frozen=True)
class Layout:
    name: str
    order_by: str
    granularity: int = 8192
    addition: str = ""  # a PROJECTION or INDEX added to the table, if any
    where: str = ""  # added to the queries' conditions


LAYOUTS = (
    Layout("g8192 (now)", f"({SERIES_KEY}, timestamp)"),
    Layout("g1024", f"({SERIES_KEY}, timestamp)", 1024),
    Layout("g256", f"({SERIES_KEY}, timestamp)", 256),
    Layout("time first g8192", TIME_FIRST),
    Layout("time first g1024", TIME_FIRST, 1024),
    Layout("10min bucket g8192, bucket in WHERE", BUCKETED, where=BUCKET_WHERE),
    Layout(
        "10min bucket g8192, minmax index on time",
        BUCKETED,
        addition=BY_TIME_INDEX,
    ),
    Layout(
        "g8192 + projection by time",
        f"({SERIES_KEY}, timestamp)",
        addition="PROJECTION by_time (SELECT * ORDER BY device_id, timestamp)",
    ),
)


def query_data(data: Dataset, folder: Path) -> str:
    """The data set in a Parquet file (device by device, no labels); returns its path."""
    path = folder / "queries.parquet"
    devices, metrics = pa.array(data.devices), pa.array(list(data.metrics))
    ticks, m = data.spec.ticks, data.spec.metrics
    schema_ = pa.schema(
        [
            ("timestamp", pa.timestamp("us", "UTC")),
            ("device_id", pa.string()),
            ("metric_id", pa.string()),
            ("value", pa.float64()),
        ]
    )
    with pq.ParquetWriter(path, schema_) as writer:
        for dev in range(data.spec.devices):
            writer.write_table(
                pa.table(
                    [
                        pa.array(np.repeat(data.poll_us[:, dev], m), pa.timestamp("us", "UTC")),
                        devices.take(pa.array(np.full(ticks * m, dev))),
                        metrics.take(pa.array(np.tile(np.arange(m), ticks))),
                        pa.array(data.values[:, dev].reshape(-1)),
                    ],
                    schema=schema_,
                )
            )
    return str(path)


def build_layout(engine: Engine, layout: Layout, parquet: str, index: int, migrations: Path) -> str:
    """A database holding `metrics` in `layout`, filled and merged; returns its name."""
    database = f"layout_{index}"
    engine.fresh(database)
    for name, statement in schema(directory=migrations):
        if name.startswith(("0001", "0009", "0010")):
            engine.run(statement)
    # a projection of a ReplacingMergeTree must be rebuilt by merges (ClickHouse refuses it
    # otherwise)
    projection = layout.addition.startswith("PROJECTION")
    rebuild = ", deduplicate_merge_projection_mode = 'rebuild'" if projection else ""
    engine.run(
        f"CREATE TABLE metrics_layout AS metrics ENGINE = ReplacingMergeTree "
        f"PARTITION BY toDate(timestamp) ORDER BY {layout.order_by} "
        f"SETTINGS index_granularity = {layout.granularity}{rebuild}"
    )
    if layout.addition:
        engine.run(f"ALTER TABLE metrics_layout ADD {layout.addition}")
    engine.run("DROP TABLE metrics")
    engine.run("RENAME TABLE metrics_layout TO metrics")
    engine.run(
        "INSERT INTO metrics (timestamp, device_id, metric_id, value) "
        f"SELECT * FROM file('{parquet}', Parquet)"
    )
    engine.run("OPTIMIZE TABLE metrics FINAL")
    return database


@dataclass(frozen=True)
class Query:
    name: str
    sql: str
    params: dict[str, str]


def queries(data: Dataset) -> list[Query]:
    """The bench's query shapes that fit the data (bench/profiles.py), the API's reader
    setting (FINAL), and one device's one metric over the whole range (a dashboard panel)."""
    by_devices, by_window = selections(data.spec)
    unique = {s.name: s for s in by_devices + by_window}  # 10 devices x 10 min is in both
    chosen: list[Selection] = [s for s in unique.values() if len(set(s.devices)) == len(s.devices)]
    out = [
        Query(
            s.name,
            READINGS_SQL,
            {
                "devices": "[" + ",".join(f"'{d}'" for d in s.device_names(data)) + "]",
                "start": _clickhouse_time(s.start_us),
                "end": _clickhouse_time(s.end_us),
            },
        )
        for s in chosen
    ]
    out.append(
        Query(
            "devices=1,metrics=1,window=all",
            READINGS_SQL + " AND metric_id = {metric:String}",
            {
                "devices": f"['{data.devices[0]}']",
                "start": _clickhouse_time(data.spec.start_us),
                "end": _clickhouse_time(data.spec.end_us),
                "metric": data.metrics[0],
            },
        )
    )
    return out


def time_query(engine: Engine, query: Query, where: str, repeats: int) -> tuple[float, int, int]:
    """(median engine seconds, rows returned, rows read) of `query` with the conditions
    `where` added, in Native."""
    elapsed, rows_read, returned = [], 0, 0
    sql = query.sql + where
    for _ in range(repeats):
        result = engine.run(sql + AS_READER, "Native", query.params)
        elapsed.append(result.elapsed())  # type: ignore[attr-defined]
        rows_read = result.storage_rows_read()  # type: ignore[attr-defined]
    count = engine.run(f"SELECT count() FROM ({sql}){AS_READER}", "TSV", query.params)
    returned = int(count.bytes())  # type: ignore[attr-defined]
    return statistics.median(elapsed), returned, rows_read


def layout_bytes(engine: Engine, database: str) -> tuple[float, float, str]:
    """(data_compressed_bytes, bytes_on_disk) per row of `database.metrics`' active parts,
    and the compressed bytes per row of each column."""
    row = engine.value(
        "SELECT sum(data_compressed_bytes) / sum(rows), sum(bytes_on_disk) / sum(rows) "
        f"FROM system.parts WHERE active AND database = '{database}' AND table = 'metrics'"
    )
    compressed, on_disk = row.split()
    columns = engine.value(
        "SELECT arrayStringConcat(groupArray(concat(column, ' ', "
        "toString(round(bytes / rows, 2)))), ', ') FROM (SELECT column, "
        "sum(column_data_compressed_bytes) AS bytes, sum(rows) AS rows "
        "FROM system.parts_columns WHERE active "
        f"AND database = '{database}' AND table = 'metrics' GROUP BY column ORDER BY column)"
    )
    return float(compressed), float(on_disk), columns


# -- the run ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.experiments.ingest_levers", description=__doc__
    )
    parser.add_argument("--devices", type=int, default=1000, help="ingest: devices")
    parser.add_argument("--seconds", type=int, default=60, help="ingest: seconds at 5 s")
    parser.add_argument("--repeats", type=int, default=3, help="runs per ingest variant")
    parser.add_argument(
        "--block-polls",
        type=int,
        default=0,
        help="ingest: polls (messages) per INSERT, as the Kafka table delivers blocks (0: all "
        "in one; a fleet's steady load comes in blocks of about its readings per flush "
        "interval, e.g. 200 polls = 20,000 readings)",
    )
    parser.add_argument("--query-devices", type=int, default=12, help="queries: devices")
    parser.add_argument("--query-hours", type=int, default=24, help="queries: hours at 5 s")
    parser.add_argument("--query-repeats", type=int, default=5, help="runs per query")
    parser.add_argument(
        "--migrations",
        type=Path,
        default=MIGRATIONS_DIR,
        help="the migrations to measure (default: the working tree's; e.g. a commit's, "
        "extracted with git archive)",
    )
    parser.add_argument(
        "--variants",
        default=",".join(v.name for v in VARIANTS),
        help="comma-separated ingest variants (default: all)",
    )
    parser.add_argument("--skip-ingest", action="store_true")
    parser.add_argument("--skip-queries", action="store_true")
    args = parser.parse_args(argv)
    print(f"load before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="ingest-levers-") as tmp:
        folder = Path(tmp)
        engine = Engine(folder / "engine")
        if not args.skip_ingest:
            data = load_or_generate(DatasetSpec(args.devices, args.seconds), DATA_ROOT)
            chosen = tuple(v for v in VARIANTS if v.name in args.variants.split(","))
            print_ingest(
                engine, data, folder, args.repeats, args.migrations, chosen, args.block_polls
            )
        if not args.skip_queries:
            spec = DatasetSpec(args.query_devices, args.query_hours * 3600)
            data = load_or_generate(spec, DATA_ROOT)
            print_queries(engine, data, folder, args.query_repeats, args.migrations)
    print(f"load after: {os.getloadavg()}")
    return 0


def print_ingest(
    engine: Engine,
    data: Dataset,
    folder: Path,
    repeats: int,
    migrations: Path,
    variants: tuple[Variant, ...],
    block_polls: int,
) -> None:
    """Every variant once per round (so that the machine's load falls on all alike), the best
    of the rounds."""
    files = write_payloads(data, folder, block_polls)
    check_rejects(engine, migrations)
    cpu: dict[str, list[float]] = {v.name: [] for v in variants}
    wall: dict[str, list[float]] = {v.name: [] for v in variants}
    refresh_cpu: dict[str, list[float]] = {v.name: [] for v in variants}
    reference = ""
    for _ in range(repeats):
        for variant in variants:
            seconds, elapsed, refreshed, contents = ingest_run(
                engine, variant, files[variant.payload], migrations
            )
            reference = reference or contents
            if contents != reference:
                raise RuntimeError(f"{variant.name} stored {contents}, current {reference}")
            cpu[variant.name].append(seconds)
            wall[variant.name].append(elapsed)
            if refreshed is not None:
                refresh_cpu[variant.name].append(refreshed)
    readings = data.spec.readings
    blocks = f"INSERTs of {block_polls} polls" if block_polls else "one INSERT"
    print(f"\nIngest: {data.spec.describe()}; CPU of {blocks}, best of {repeats}")
    print(
        "| variant | what | CPU µs/reading | runs, CPU s | wall s | refresh µs/reading |\n"
        f"|{'---|' * 6}"
    )
    for variant in variants:
        runs, refreshes = cpu[variant.name], refresh_cpu[variant.name]
        refreshed = f"{min(refreshes) / readings * 1e6:.3f}" if refreshes else "-"
        print(
            f"| {variant.name} | {variant.what} | {min(runs) / readings * 1e6:.3f} "
            f"| {', '.join(f'{c:.2f}' for c in runs)} | {min(wall[variant.name]):.2f} "
            f"| {refreshed} |"
        )


def print_queries(
    engine: Engine, data: Dataset, folder: Path, repeats: int, migrations: Path
) -> None:
    parquet = query_data(data, folder)
    shapes = queries(data)
    print(f"\nQueries: {data.spec.describe()}; engine ms, median of {repeats}, FINAL")
    print(
        "| layout | B/reading compressed | on disk | "
        + " | ".join(f"{q.name} ms (rows read)" for q in shapes)
        + f" |\n|{'---|' * (3 + len(shapes))}"
    )
    for index, layout in enumerate(LAYOUTS):
        began = time.perf_counter()
        database = build_layout(engine, layout, parquet, index, migrations)
        built = time.perf_counter() - began
        compressed, on_disk, columns = layout_bytes(engine, database)
        cells = []
        for query in shapes:
            seconds, returned, rows_read = time_query(engine, query, layout.where, repeats)
            cells.append(f"{seconds * 1000:.1f} ({rows_read:,}; {returned:,} returned)")
        print(
            f"| {layout.name} (built in {built:.0f} s) | {compressed:.2f} ({columns}) "
            f"| {on_disk:.2f} | " + " | ".join(cells) + " |"
        )
        engine.run(f"DROP DATABASE {database}")
    one = [engine.run("SELECT 1", "TSV").elapsed() for _ in range(20)]  # type: ignore[attr-defined]
    print(f"\nSELECT 1 in the engine: {statistics.median(one) * 1000:.2f} ms (median of 20)")


if __name__ == "__main__":
    raise SystemExit(main())
