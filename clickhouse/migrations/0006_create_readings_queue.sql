-- Kafka consumer of the readings topic: newline-delimited JSON rows, many per message.
-- 'stream' error mode: a malformed message becomes a row with _error and _raw_message
-- instead of stopping the consumer. `value` is read as the number's text: the JSON input
-- format's float parser is off by 1-2 ULP on some 17-digit values, JSONExtract is exact.
CREATE TABLE IF NOT EXISTS readings_queue
(
    timestamp DateTime64(6, 'UTC'),
    device_id String,
    metric_id String,
    value String,
    labels Map(String, String)
)
ENGINE = Kafka
SETTINGS
    kafka_broker_list = '${KAFKA_BROKERS}',
    kafka_topic_list = '${READINGS_TOPIC}',
    kafka_group_name = '${CONSUMER_GROUP}',
    kafka_format = 'JSONEachRow',
    kafka_handle_error_mode = 'stream',
    kafka_num_consumers = ${KAFKA_CONSUMERS},
    kafka_flush_interval_ms = ${KAFKA_FLUSH_INTERVAL_MS},
    kafka_max_block_size = 1048576
