-- Ingestion resumes: the two views of 0008 that consume the readings topic, as they were,
-- now that `metrics` has its series key (0010) and its derived tables (0011-0014) exist.
-- Consumption continues from the offsets committed before 0010.
-- Messages the parser rejected, raw, and readings that parsed but cannot be stored, as
-- JSON: one row each in ingest_errors.
CREATE MATERIALIZED VIEW IF NOT EXISTS readings_queue_errors_mv TO ingest_errors AS
SELECT
    now64(3) AS received_at,
    _topic AS topic,
    _partition AS partition,
    _offset AS offset,
    _key AS key,
    if(_error != '', _raw_message,
       formatRowNoNewline('JSONEachRow',
           r.timestamp AS timestamp, r.device_id AS device_id, r.metric_id AS metric_id,
           r.value AS value, r.labels AS labels)) AS raw_message,
    if(_error != '', _error, jobscope_reading_problem(r)) AS error
FROM readings_queue
ARRAY JOIN if(_error != '', arrayResize(readings, 1),
              arrayFilter(x -> jobscope_reading_problem(x) != '', readings)) AS r;

-- Created last: consumption starts once both destinations exist.
CREATE MATERIALIZED VIEW IF NOT EXISTS readings_queue_metrics_mv TO metrics AS
SELECT
    r.timestamp AS timestamp,
    r.device_id AS device_id,
    r.metric_id AS metric_id,
    r.value AS value,
    r.labels AS labels
FROM readings_queue
ARRAY JOIN readings AS r
WHERE jobscope_reading_problem(r) = '';
