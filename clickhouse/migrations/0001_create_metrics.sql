-- Raw readings, one row each. ReplacingMergeTree on the sort key: delivery is
-- at-least-once, and a reading delivered twice (same device, metric, timestamp) is one
-- row for every reader that queries with FINAL (the read-only user always does).
-- Sorted for the job-scoped read: one device's metric over a time range.
CREATE TABLE IF NOT EXISTS metrics
(
    timestamp DateTime64(6, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    device_id LowCardinality(String) CODEC(ZSTD(1)),
    metric_id LowCardinality(String) CODEC(ZSTD(1)),
    value Float64 CODEC(Gorilla, ZSTD(1)),
    labels Map(String, String) CODEC(ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(timestamp)
ORDER BY (device_id, metric_id, timestamp)
TTL toDateTime(timestamp) + INTERVAL ${RETENTION_DAYS} DAY
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1
