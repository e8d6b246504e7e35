-- The newest reading of every series (`GET /api/devices/{id}/latest`, `GET /api/devices`),
-- kept by a view on every insert into `metrics` instead of a scan of raw data: each insert
-- adds its newest reading per series, and the ReplacingMergeTree keeps the newest of those
-- (version: the reading's time) once merged or read with FINAL.
CREATE TABLE IF NOT EXISTS metrics_latest
(
    device_id LowCardinality(String),
    metric_id LowCardinality(String),
    labels_hash UInt64,
    timestamp DateTime64(6, 'UTC'),
    value Float64,
    labels Map(String, String)
)
ENGINE = ReplacingMergeTree(timestamp)
ORDER BY (device_id, metric_id, labels_hash);

CREATE MATERIALIZED VIEW IF NOT EXISTS metrics_latest_mv TO metrics_latest AS
SELECT
    device_id,
    metric_id,
    sipHash64(metrics.labels) AS labels_hash,
    max(metrics.timestamp) AS timestamp,
    argMax(metrics.value, metrics.timestamp) AS value,
    any(metrics.labels) AS labels
FROM metrics
GROUP BY device_id, metric_id, labels_hash;

INSERT INTO metrics_latest
SELECT device_id, metric_id, sipHash64(metrics.labels) AS labels_hash, max(timestamp),
    argMax(value, timestamp), any(labels)
FROM metrics
WHERE (SELECT count() FROM metrics_latest) = 0
GROUP BY device_id, metric_id, labels_hash;
