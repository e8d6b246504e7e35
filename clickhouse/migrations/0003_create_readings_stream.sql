-- Fan-out point between the Kafka table and its destinations: rows pass through (Null
-- engine stores nothing) to the views of 0004 and 0005.
CREATE TABLE IF NOT EXISTS readings_stream
(
    timestamp DateTime64(6, 'UTC'),
    device_id String,
    metric_id String,
    value Float64,
    labels Map(String, String),
    topic LowCardinality(String),
    partition UInt32,
    offset UInt64,
    key String,
    raw_message String,
    error String
)
ENGINE = Null
