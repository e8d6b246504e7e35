-- Created last: consumption starts only once every destination exists.
CREATE MATERIALIZED VIEW IF NOT EXISTS readings_queue_mv TO readings_stream AS
SELECT
    timestamp, device_id, metric_id, value, labels,
    _topic AS topic, _partition AS partition, _offset AS offset, _key AS key,
    _raw_message AS raw_message, _error AS error
FROM readings_queue
