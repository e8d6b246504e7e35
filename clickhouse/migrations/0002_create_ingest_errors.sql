-- Kafka messages that could not be parsed, kept whole with the parser's error so that
-- nothing accepted by Kafka vanishes and an operator can see and replay it.
CREATE TABLE IF NOT EXISTS ingest_errors
(
    received_at DateTime64(3, 'UTC'),
    topic LowCardinality(String),
    partition UInt32,
    offset UInt64,
    key String,
    raw_message String CODEC(ZSTD(3)),
    error String
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(received_at)
ORDER BY (received_at, topic, partition, offset)
TTL toDateTime(received_at) + INTERVAL ${RETENTION_DAYS} DAY
