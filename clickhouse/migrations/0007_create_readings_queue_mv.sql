-- Created last: consumption starts only once every destination exists.
-- A reading whose value is not a number becomes an error row carrying that reading.
CREATE MATERIALIZED VIEW IF NOT EXISTS readings_queue_mv TO readings_stream AS
WITH JSONExtract(readings_queue.value, 'Nullable(Float64)') AS parsed
SELECT
    timestamp, device_id, metric_id, ifNull(parsed, 0) AS value, labels,
    _topic AS topic, _partition AS partition, _offset AS offset, _key AS key,
    if(_error = '' AND parsed IS NULL,
       formatRowNoNewline('JSONEachRow', timestamp, device_id, metric_id,
                          readings_queue.value, labels),
       _raw_message) AS raw_message,
    multiIf(_error != '', _error,
            parsed IS NULL, concat('value is not a number: ', readings_queue.value),
            '') AS error
FROM readings_queue
