-- A reading is identified by its series (device, metric, labels) and its time: a PDU polled
-- once reports the same metric for 24 outlets at one timestamp, told apart by their labels
-- (`outlet`, `_device_alias`), and the key of 0001 (device, metric, time) merged them into
-- one row. The key cannot be changed in place (ClickHouse only lets a key grow by columns
-- added in the same ALTER, and those cannot be computed from `labels`), so the table is
-- rebuilt with (device, metric, hash of labels, time): one series' readings stay together,
-- which also keeps the value deltas small. A reading delivered twice carries the same labels
-- and is still one row under FINAL.
-- Ingestion stops while the rows are copied: the views that consume the readings topic are
-- dropped here and created again by 0015, once the tables derived from `metrics` exist
-- (what arrives meanwhile waits in Kafka).
DROP VIEW IF EXISTS readings_queue_metrics_mv;
DROP VIEW IF EXISTS readings_queue_errors_mv;

CREATE TABLE IF NOT EXISTS metrics_rebuilt
(
    timestamp DateTime64(6, 'UTC') CODEC(Delta, ZSTD(3)),
    device_id LowCardinality(String) CODEC(ZSTD(1)),
    metric_id LowCardinality(String) CODEC(ZSTD(1)),
    value Float64 CODEC(Delta, ZSTD(3)),
    labels Map(String, String) CODEC(ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(timestamp)
ORDER BY (device_id, metric_id, sipHash64(labels), timestamp)
TTL toDateTime(timestamp) + INTERVAL ${RETENTION_DAYS} DAY
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1;

-- Should this file run again after a failure: copies of a row are one row under FINAL, and
-- a run that stopped between the DROP and the RENAME below finds an empty `metrics` here.
CREATE TABLE IF NOT EXISTS metrics AS metrics_rebuilt;
INSERT INTO metrics_rebuilt SELECT timestamp, device_id, metric_id, value, labels FROM metrics;

DROP TABLE IF EXISTS metrics;

RENAME TABLE metrics_rebuilt TO metrics;
