-- The newest reading of every series (`GET /api/devices/{id}/latest`, `GET /api/devices`),
-- kept by a view instead of a scan of raw data. Fed from the rows of metrics_1m as they are
-- inserted (each holds its minute's last reading and time): each insert adds the newest
-- reading per series, and the ReplacingMergeTree keeps the newest of those (version: the
-- reading's time) once merged or read with FINAL.
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
    labels_hash,
    max(m.last_time) AS timestamp,
    argMaxMerge(m.last) AS value,
    any(m.labels) AS labels
FROM metrics_1m AS m
GROUP BY device_id, metric_id, labels_hash;

-- Emptied first: ingestion is stopped from 0010 to 0015, so a run again is exact.
TRUNCATE TABLE metrics_latest;

INSERT INTO metrics_latest
SELECT device_id, metric_id, labels_hash, max(m.last_time), argMaxMerge(m.last), any(m.labels)
FROM metrics_1m AS m
GROUP BY device_id, metric_id, labels_hash;
