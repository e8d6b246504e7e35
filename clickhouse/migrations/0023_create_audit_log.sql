-- The audit of reads (api/audit.py): every read of a job through the API by another than its
-- owner (support, admin, a scheduler, a project's manager) arrives on the `audit` topic as a
-- JSON object: at (ISO 8601), user, role (of the reader), route, job_id, site, job_user,
-- job_project. Stored in `audit_log` for the admin user alone: the embedded server refuses
-- it to read-only users (clickhouse/server/sql_policy.py: PRIVATE_TABLES), a real server's
-- grants leave it out.
CREATE TABLE IF NOT EXISTS audit_log
(
    at DateTime64(6, 'UTC'),
    user String,
    role LowCardinality(String),
    route LowCardinality(String),
    job_id String,
    site LowCardinality(String),
    job_user String,
    job_project String
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(at)
ORDER BY (at, user);

CREATE TABLE IF NOT EXISTS audit_queue
(
    at String,
    user String,
    role String,
    route String,
    job_id String,
    site String,
    job_user String,
    job_project String
)
ENGINE = Kafka
SETTINGS
    kafka_broker_list = '${KAFKA_BROKERS}',
    kafka_topic_list = '${AUDIT_TOPIC}',
    kafka_group_name = '${CONSUMER_GROUP}-audit',
    kafka_format = 'JSONEachRow',
    kafka_handle_error_mode = 'stream',
    kafka_num_consumers = 1,
    kafka_flush_interval_ms = ${KAFKA_FLUSH_INTERVAL_MS};

-- The records' view first, the errors' view last: a Kafka table consumes (and commits) as
-- soon as one view reads it, and records are never consumed with nowhere to go.
CREATE MATERIALIZED VIEW IF NOT EXISTS audit_queue_mv TO audit_log AS
SELECT
    coalesce(parseDateTime64BestEffortOrNull(at, 6, 'UTC'), now64(6)) AS at,
    user,
    role,
    route,
    job_id,
    site,
    job_user,
    job_project
FROM audit_queue
WHERE _error = '';

CREATE MATERIALIZED VIEW IF NOT EXISTS audit_queue_errors_mv TO ingest_errors AS
SELECT
    now64(3) AS received_at,
    _topic AS topic,
    _partition AS partition,
    _offset AS offset,
    _key AS key,
    _raw_message AS raw_message,
    _error AS error
FROM audit_queue
WHERE _error != '';
