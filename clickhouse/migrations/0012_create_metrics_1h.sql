-- One-hour rollup of every series, built like metrics_1m (0011): a month at `step=1h` or
-- coarser reads one row per series and hour. Kept without a TTL: a year of a 1,000-device
-- fleet of 100 metrics is under 10^9 rows, a few GB.
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
    quantiles AggregateFunction(quantilesTDigest(0.5, 0.95), Float64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYear(bucket)
ORDER BY (device_id, metric_id, labels_hash, bucket);

CREATE MATERIALIZED VIEW IF NOT EXISTS metrics_1h_mv TO metrics_1h AS
SELECT
    toStartOfHour(timestamp) AS bucket,
    device_id,
    metric_id,
    sipHash64(metrics.labels) AS labels_hash,
    any(labels) AS labels,
    count() AS count,
    sum(value) AS sum,
    min(value) AS min,
    max(value) AS max,
    argMinState(value, timestamp) AS first,
    argMaxState(value, timestamp) AS last,
    quantilesTDigestState(0.5, 0.95)(value) AS quantiles
FROM metrics
GROUP BY bucket, device_id, metric_id, labels_hash;

-- Readings stored before this view existed (ingestion is stopped from 0010 to 0015).
INSERT INTO metrics_1h
SELECT
    toStartOfHour(timestamp) AS bucket, device_id, metric_id, sipHash64(metrics.labels) AS labels_hash,
    any(labels), count(), sum(value), min(value), max(value),
    argMinState(value, timestamp), argMaxState(value, timestamp),
    quantilesTDigestState(0.5, 0.95)(value)
FROM metrics
WHERE (SELECT count() FROM metrics_1h) = 0
GROUP BY bucket, device_id, metric_id, labels_hash;
