-- One-hour rollup of every series, as metrics_1m (0011) and fed from its rows as they are
-- inserted (states merged into hourly ones): a month at `step=1h` or coarser reads one row
-- per series and hour. Kept without a TTL: a year of a 1,000-device fleet of 100 metrics is
-- under 10^9 rows, a few GB.
CREATE TABLE IF NOT EXISTS metrics_1h
(
    bucket DateTime('UTC') CODEC(Delta, ZSTD(3)),
    device_id LowCardinality(String),
    metric_id LowCardinality(String),
    labels_hash UInt64,
    labels SimpleAggregateFunction(any, Map(String, String)),
    count SimpleAggregateFunction(sum, UInt64),
    sum SimpleAggregateFunction(sum, Float64),
    min SimpleAggregateFunction(min, Float64),
    max SimpleAggregateFunction(max, Float64),
    first AggregateFunction(argMin, Float64, DateTime64(6, 'UTC')),
    last AggregateFunction(argMax, Float64, DateTime64(6, 'UTC')),
    last_time SimpleAggregateFunction(max, DateTime64(6, 'UTC')),
    quantiles AggregateFunction(quantilesTDigest(0.5, 0.95), Float64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYear(bucket)
ORDER BY (device_id, metric_id, labels_hash, bucket);

CREATE MATERIALIZED VIEW IF NOT EXISTS metrics_1h_mv TO metrics_1h AS
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
    quantilesTDigestMergeState(0.5, 0.95)(m.quantiles) AS quantiles
FROM metrics_1m AS m
GROUP BY bucket, device_id, metric_id, labels_hash;

-- Rollups stored before this view existed. Emptied first: ingestion is stopped from 0010 to
-- 0015, so a run again after a failure midway is exact.
TRUNCATE TABLE metrics_1h;

INSERT INTO metrics_1h
SELECT
    toStartOfHour(m.bucket) AS bucket, device_id, metric_id, labels_hash,
    any(m.labels), sum(m.count), sum(m.sum), min(m.min), max(m.max),
    argMinMergeState(m.first), argMaxMergeState(m.last), max(m.last_time),
    quantilesTDigestMergeState(0.5, 0.95)(m.quantiles)
FROM metrics_1m AS m
GROUP BY bucket, device_id, metric_id, labels_hash;
