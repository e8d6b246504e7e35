-- Well-formed readings go to `metrics`.
CREATE MATERIALIZED VIEW IF NOT EXISTS readings_metrics_mv TO metrics AS
SELECT timestamp, device_id, metric_id, value, labels
FROM readings_stream
WHERE error = ''
