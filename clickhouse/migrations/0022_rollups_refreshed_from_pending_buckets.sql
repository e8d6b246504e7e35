-- The rollups (metrics_1m, metrics_1h, and metrics_latest fed from metrics_1m) are computed
-- from stored readings by refreshable views, for the (device, minute) buckets that received
-- readings, instead of by views on every insert into `metrics`.
--
-- Why: a view on every insert aggregates each insert block on its own. At a site's steady
-- rate a block holds about one reading per series, so metrics_1m got one row per reading
-- and the views after it as many. Measured with bench/ingest_levers.py --block-polls 200
-- (inserts of 20,000 readings, as the Kafka table delivers them at a steady rate), µs of
-- CPU per reading: 8.6 with 0011-0014's views; 1.8 now (1.65 with no rollups at all), the
-- notes costing ~0.1-0.2, plus 1.9 for the refreshes over the same readings (merges
-- stopped: FINAL reads every inserted part); the bench's refresh of 2.4 M loaded readings
-- costs 1.0-1.2.
--
-- Exact: the rollups are computed from `metrics` FINAL, so a reading Kafka delivered twice
-- counts once (0011's view counted it twice), and a bucket is computed again, replacing its
-- rows (ReplacingMergeTree, version `noted_until`), whenever readings arrive for it later.
--
-- How a refresh knows what to compute: every insert into `metrics` notes its buckets with
-- the time (`noted_at`); `rollup_marks` holds, per rollup and host, the `noted_until` of its
-- last refresh: every note before it is reflected in the rollup. A 1-minute refresh takes
-- the notes from its mark up to the start of the current minute (less 10 s, so that every
-- note before it is committed): on-time readings then lie in closed minutes, computed once.
-- The 1-hour refresh takes the notes the 1-minute rollup has reflected, for closed hours
-- only; when an hour closes, every note of it is taken again from the hour's start (an hour
-- early, for clocks running ahead), so an hour is computed once it is whole.
-- Readers (the API) read a bucket from a rollup only if no note of it is newer than the
-- mark (and for the hourly rollup, its hour was closed at the mark); the others from raw
-- readings: answers are exact at any time, and rollup tables lag by up to a minute and
-- 20 s (metrics_1h: until the hour closes).
--
-- The device aliases are kept from the readings themselves (a cheap view: only readings
-- with an alias are grouped), so a new alias is known at once, with exact first/last times.
--
-- Applied with the readings topic's consumer detached (as 0020); the rollups are copied
-- into their new tables. Statements are idempotent: a run that fails midway runs again
-- from the top (a run that stopped between a DROP and its RENAME finds an empty table).
DETACH TABLE IF EXISTS readings_queue;

CREATE TABLE IF NOT EXISTS rollup_pending
(
    device_id LowCardinality(String),
    bucket DateTime('UTC'),
    noted_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
PARTITION BY toDate(noted_at)
ORDER BY (noted_at, device_id)
TTL toDateTime(noted_at) + INTERVAL 7 DAY
SETTINGS ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_pending_mv TO rollup_pending AS
SELECT device_id, toStartOfMinute(timestamp) AS bucket, now64(3) AS noted_at
FROM metrics
GROUP BY device_id, bucket;

CREATE TABLE IF NOT EXISTS rollup_marks
(
    rollup LowCardinality(String),
    host LowCardinality(String),
    noted_until SimpleAggregateFunction(max, DateTime64(3, 'UTC'))
)
ENGINE = AggregatingMergeTree
ORDER BY (rollup, host);

DROP VIEW IF EXISTS metrics_1m_mv;
DROP VIEW IF EXISTS metrics_1h_mv;
DROP VIEW IF EXISTS metrics_latest_mv;
DROP VIEW IF EXISTS device_aliases_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS device_aliases_mv TO device_aliases AS
SELECT
    metrics.labels['_device_alias'] AS alias,
    device_id,
    min(metrics.timestamp) AS first_seen,
    max(metrics.timestamp) AS last_seen
FROM metrics
WHERE alias != ''
GROUP BY alias, device_id;

CREATE TABLE IF NOT EXISTS metrics_1m_rebuilt
(
    bucket DateTime('UTC') CODEC(Delta, ZSTD(3)),
    device_id LowCardinality(String),
    metric_id LowCardinality(String),
    labels_hash UInt64,
    labels Map(String, String),
    count UInt64,
    sum Float64,
    min Float64,
    max Float64,
    first AggregateFunction(argMin, Float64, DateTime64(6, 'UTC')),
    last AggregateFunction(argMax, Float64, DateTime64(6, 'UTC')),
    last_time DateTime64(6, 'UTC'),
    quantiles AggregateFunction(quantilesTDigest(0.5, 0.95), Float64),
    noted_until DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(noted_until)
PARTITION BY toYYYYMM(bucket)
ORDER BY (device_id, metric_id, labels_hash, bucket)
TTL bucket + INTERVAL ${RETENTION_DAYS} DAY;

CREATE TABLE IF NOT EXISTS metrics_1m AS metrics_1m_rebuilt;

INSERT INTO metrics_1m_rebuilt
SELECT bucket, device_id, metric_id, labels_hash, labels, count, sum, min, max, first, last,
    last_time, quantiles, toDateTime64(0, 3, 'UTC')
FROM metrics_1m FINAL;

DROP TABLE IF EXISTS metrics_1m;

RENAME TABLE metrics_1m_rebuilt TO metrics_1m;

-- The columns of the new metrics_1m; no TTL: kept as long as 0012's.
CREATE TABLE IF NOT EXISTS metrics_1h_rebuilt AS metrics_1m
ENGINE = ReplacingMergeTree(noted_until)
PARTITION BY toYear(bucket)
ORDER BY (device_id, metric_id, labels_hash, bucket);

CREATE TABLE IF NOT EXISTS metrics_1h AS metrics_1h_rebuilt;

INSERT INTO metrics_1h_rebuilt
SELECT bucket, device_id, metric_id, labels_hash, labels, count, sum, min, max, first, last,
    last_time, quantiles, toDateTime64(0, 3, 'UTC')
FROM metrics_1h FINAL;

DROP TABLE IF EXISTS metrics_1h;

RENAME TABLE metrics_1h_rebuilt TO metrics_1h;

-- As 0013, from the new metrics_1m: each refresh adds the newest reading of the series it
-- computed; the ReplacingMergeTree keeps the newest.
CREATE MATERIALIZED VIEW IF NOT EXISTS metrics_latest_mv TO metrics_latest AS
SELECT
    device_id,
    metric_id,
    labels_hash,
    max(m.last_time) AS timestamp,
    argMaxMerge(m.last) AS value,
    any(m.labels) AS labels
FROM metrics_1m AS m
GROUP BY device_id, metric_id, labels_hash;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_marks_1m_mv TO rollup_marks AS
SELECT '1m' AS rollup, hostName() AS host, max(m.noted_until) AS noted_until
FROM metrics_1m AS m;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_marks_1h_mv TO rollup_marks AS
SELECT '1h' AS rollup, hostName() AS host, max(h.noted_until) AS noted_until
FROM metrics_1h AS h;

CREATE MATERIALIZED VIEW IF NOT EXISTS metrics_1m_refresh
REFRESH EVERY 10 SECOND APPEND TO metrics_1m AS
WITH
    (SELECT max(noted_until) FROM rollup_marks WHERE rollup = '1m' AND host = hostName())
        AS since,
    toDateTime64(toStartOfMinute(now() - INTERVAL 10 SECOND), 3, 'UTC') AS until,
    pending AS (
        SELECT DISTINCT device_id, bucket FROM rollup_pending
        WHERE noted_at >= since AND noted_at < until
    )
SELECT
    toStartOfMinute(metrics.timestamp) AS bucket,
    device_id,
    metric_id,
    sipHash64(metrics.labels) AS labels_hash,
    any(metrics.labels) AS labels,
    count() AS count,
    sum(value) AS sum,
    min(value) AS min,
    max(value) AS max,
    argMinState(value, metrics.timestamp) AS first,
    argMaxState(value, metrics.timestamp) AS last,
    max(metrics.timestamp) AS last_time,
    quantilesTDigestState(0.5, 0.95)(value) AS quantiles,
    until AS noted_until
FROM metrics FINAL
WHERE device_id IN (SELECT device_id FROM pending)
    AND metrics.timestamp >= (SELECT min(bucket) FROM pending)
    AND metrics.timestamp < (SELECT max(bucket) FROM pending) + INTERVAL 1 MINUTE
    AND (device_id, toStartOfMinute(metrics.timestamp)) IN (SELECT device_id, bucket FROM pending)
GROUP BY bucket, device_id, metric_id, labels_hash
SETTINGS do_not_merge_across_partitions_select_final = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS metrics_1h_refresh
REFRESH EVERY 10 SECOND APPEND TO metrics_1h AS
WITH
    (SELECT max(noted_until) FROM rollup_marks WHERE rollup = '1h' AND host = hostName())
        AS since,
    (SELECT max(noted_until) FROM rollup_marks WHERE rollup = '1m' AND host = hostName())
        AS until,
    -- (not before 1970: the primary key's analysis finds no row after a negative time)
    if(toStartOfHour(since) < toStartOfHour(until),
       greatest(toDateTime64(toStartOfHour(since), 3, 'UTC') - INTERVAL 1 HOUR,
                toDateTime64(0, 3, 'UTC')),
       since) AS taken_from,
    pending AS (
        SELECT DISTINCT device_id, toStartOfHour(bucket) AS hour FROM rollup_pending
        WHERE noted_at >= taken_from AND noted_at < until
            AND toStartOfHour(bucket) < toStartOfHour(until)
            AND (noted_at >= since OR toStartOfHour(bucket) >= toStartOfHour(since))
    )
SELECT
    toStartOfHour(m.bucket) AS bucket,
    device_id,
    metric_id,
    labels_hash,
    any(m.labels) AS labels,
    sum(m.count) AS count,
    sum(m.sum) AS sum,
    min(m.min) AS min,
    max(m.max) AS max,
    argMinMergeState(m.first) AS first,
    argMaxMergeState(m.last) AS last,
    max(m.last_time) AS last_time,
    quantilesTDigestMergeState(0.5, 0.95)(m.quantiles) AS quantiles,
    until AS noted_until
FROM metrics_1m AS m FINAL
WHERE device_id IN (SELECT device_id FROM pending)
    AND m.bucket >= (SELECT min(hour) FROM pending)
    AND m.bucket < (SELECT max(hour) FROM pending) + INTERVAL 1 HOUR
    AND (device_id, toStartOfHour(m.bucket)) IN (SELECT device_id, hour FROM pending)
GROUP BY bucket, device_id, metric_id, labels_hash;

-- What readers use (the API, Superset): the buckets each rollup does not hold whole yet
-- (read those from `metrics`), and the newest reading of every series.
CREATE OR REPLACE VIEW rollup_pending_1m AS
WITH (SELECT max(noted_until) FROM rollup_marks WHERE rollup = '1m' AND host = hostName())
    AS mark
SELECT DISTINCT device_id, bucket FROM rollup_pending WHERE noted_at >= mark;

-- Also the hours still open at the mark (noted at most an hour early: clocks ahead).
CREATE OR REPLACE VIEW rollup_pending_1h AS
WITH (SELECT max(noted_until) FROM rollup_marks WHERE rollup = '1h' AND host = hostName())
    AS mark
SELECT DISTINCT device_id, toStartOfHour(bucket) AS bucket FROM rollup_pending
WHERE noted_at >= mark
    OR (noted_at >= mark - INTERVAL 2 HOUR AND toStartOfHour(bucket) >= toStartOfHour(mark));

CREATE OR REPLACE VIEW metrics_newest AS
SELECT
    device_id,
    metric_id,
    labels_hash,
    max(n.timestamp) AS timestamp,
    argMax(n.value, n.timestamp) AS value,
    argMax(n.labels, n.timestamp) AS labels
FROM
(
    SELECT device_id, metric_id, labels_hash, timestamp, value, labels FROM metrics_latest FINAL
    UNION ALL
    SELECT device_id, metric_id, sipHash64(metrics.labels), timestamp, value, labels
    FROM metrics
    WHERE (device_id, toStartOfMinute(metrics.timestamp)) IN (SELECT * FROM rollup_pending_1m)
) AS n
GROUP BY device_id, metric_id, labels_hash;

ATTACH TABLE IF NOT EXISTS readings_queue;
