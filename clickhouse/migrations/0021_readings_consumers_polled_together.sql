-- Every consumer of the readings topic is polled at every turn, so a lone reading on a quiet
-- topic is stored within about a second instead of waiting up to ~25 s (issue 16's report).
-- With kafka_thread_per_consumer = 1 (0008) each of the table's threads takes, at each turn,
-- the first consumer of the pool not in use, not a consumer of its own. When the two
-- threads' turns (a poll of kafka_poll_timeout_ms, then a pause of
-- kafka_consumer_reschedule_ms) stop overlapping, both take consumer 0, and the partitions
-- assigned to consumer 1 are not polled until the turns drift back into overlap: on an idle
-- topic, consumer 1's last poll was up to 14 s old in 90 s of watching (system.kafka_consumers),
-- and a reading on one of its partitions waited that long. Under steady traffic the turns
-- overlap and both consumers work, which hid it.
-- With kafka_thread_per_consumer = 0 one turn polls all consumers in parallel (as many
-- threads as consumers), so none is skipped. Measured on the reference machine (2 cores,
-- shared): a lone reading on a partition of the consumer polled least recently, after 5-15 s
-- of idle topic, was queryable after 0.07-1.5 s (median 0.7 s, 15 rounds), against 0.07-13.4 s
-- (median 1.1 s, 3 of 15 over 5 s) before; the server's idle CPU is unchanged (0.012 against
-- 0.013 cores over 60 s); a backlog of 10 M readings (100 per message) drained at 0.77, 0.86
-- and 1.07 M readings/s, against 0.61, 0.98 and 0.62 M/s before.
-- The Kafka engine refuses ALTER ... MODIFY SETTING: the table is re-created with its two views
-- exactly as 0015 (errors) and 0018 (metrics, with the topic's site) left them. The consumer
-- group stays; consumption stops between the statements and resumes from the committed
-- offsets. Statements are idempotent: a migration that fails midway runs again from the top.
-- The errors view goes first and comes back last: while only the metrics view is in place
-- the engine goes on consuming, and every valid reading is stored (the other way round,
-- valid readings consumed then would be committed and lost).
DROP VIEW IF EXISTS readings_queue_errors_mv;
DROP VIEW IF EXISTS readings_queue_metrics_mv;
DROP TABLE IF EXISTS readings_queue;

CREATE TABLE IF NOT EXISTS readings_queue
(
    readings Array(Tuple(
        timestamp DateTime64(6, 'UTC'),
        device_id String,
        metric_id String,
        value Float64,
        labels Map(String, String)))
)
ENGINE = Kafka
SETTINGS
    kafka_broker_list = '${KAFKA_BROKERS}',
    kafka_topic_list = '${READINGS_TOPIC}',
    kafka_group_name = '${CONSUMER_GROUP}',
    kafka_format = 'RowBinary',
    kafka_handle_error_mode = 'stream',
    kafka_num_consumers = ${KAFKA_CONSUMERS},
    kafka_thread_per_consumer = 0,
    kafka_flush_interval_ms = ${KAFKA_FLUSH_INTERVAL_MS},
    kafka_max_block_size = 65536;

-- As 0018; created first (see above).
CREATE MATERIALIZED VIEW IF NOT EXISTS readings_queue_metrics_mv TO metrics AS
WITH jobscope_topic_site(_topic, '${READINGS_TOPIC_NAME}') AS site
SELECT
    r.timestamp AS timestamp,
    r.device_id AS device_id,
    r.metric_id AS metric_id,
    r.value AS value,
    if(site = '', r.labels, mapUpdate(r.labels, map('_site', site))) AS labels
FROM readings_queue
ARRAY JOIN readings AS r
WHERE jobscope_reading_problem(r) = '';

-- As 0015: messages the parser rejected, raw, and readings that parsed but cannot be stored,
-- as JSON: one row each in ingest_errors.
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
