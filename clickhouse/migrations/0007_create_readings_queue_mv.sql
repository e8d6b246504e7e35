-- Created last: consumption starts only once every destination exists.
-- A row that parsed but cannot be a reading (what garbage that happens to parse as
-- RowBinary would give: empty ids, a time outside 2000-2100, a value that is not finite)
-- becomes an error row carrying that reading.
CREATE MATERIALIZED VIEW IF NOT EXISTS readings_queue_mv TO readings_stream AS
WITH multiIf(
    _error != '', _error,
    device_id = '' OR metric_id = '', 'empty device_id or metric_id',
    NOT isFinite(value), 'value is not finite',
    toYear(timestamp) NOT BETWEEN 2000 AND 2100, 'timestamp outside 2000-2100',
    NOT (isValidUTF8(device_id) AND isValidUTF8(metric_id)), 'ids are not UTF-8',
    '') AS problem
SELECT
    timestamp, device_id, metric_id, value, labels,
    _topic AS topic, _partition AS partition, _offset AS offset, _key AS key,
    if(_error = '' AND problem != '',
       formatRowNoNewline('JSONEachRow', timestamp, device_id, metric_id, value, labels),
       _raw_message) AS raw_message,
    problem AS error
FROM readings_queue
