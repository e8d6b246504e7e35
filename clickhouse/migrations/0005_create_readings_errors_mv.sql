-- Messages the parser rejected go to `ingest_errors`, raw.
CREATE MATERIALIZED VIEW IF NOT EXISTS readings_errors_mv TO ingest_errors AS
SELECT now64(3) AS received_at, topic, partition, offset, key, raw_message, error
FROM readings_stream
WHERE error != ''
