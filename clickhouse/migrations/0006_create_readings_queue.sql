-- Kafka consumer of the readings topic: RowBinary rows (producers/message.py), the
-- readings of one device and tick per message. 'stream' error mode: a message that cannot
-- be parsed becomes a row with _error and _raw_message instead of stopping the consumer.
-- One consumer thread per consumer, so that parsing and inserting use every core.
CREATE TABLE IF NOT EXISTS readings_queue
(
    timestamp DateTime64(6, 'UTC'),
    device_id String,
    metric_id String,
    value Float64,
    labels Map(String, String)
)
ENGINE = Kafka
SETTINGS
    kafka_broker_list = '${KAFKA_BROKERS}',
    kafka_topic_list = '${READINGS_TOPIC}',
    kafka_group_name = '${CONSUMER_GROUP}',
    kafka_format = 'RowBinary',
    kafka_handle_error_mode = 'stream',
    kafka_num_consumers = ${KAFKA_CONSUMERS},
    kafka_thread_per_consumer = 1,
    kafka_flush_interval_ms = ${KAFKA_FLUSH_INTERVAL_MS},
    kafka_max_block_size = 1048576
