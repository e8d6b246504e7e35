-- Job records (api/records.py): what a job's summary said once the job ended, kept for ever
-- (no TTL), so that a job answers after its raw readings expired. One row per version; the
-- newest version wins: readers query with FINAL. A version is the newest of the job's
-- `updated_at` and of the ingest time of the readings the record counted (`last_received`),
-- so two API replicas computing the same record write the same version (one row after
-- FINAL), and a record recomputed after late readings or an edit of the job replaces it.
-- `summary` holds the whole JSON answer of GET /api/jobs/{id}/summary; the other columns are
-- the figures that jobs are filtered and sorted by. The API's ClickHouse user is read-only:
-- it publishes records to the `job-records` topic, which this table consumes (as 0023).
CREATE TABLE IF NOT EXISTS job_records
(
    site LowCardinality(String),
    job_id String,
    user String,
    project String,
    start_time DateTime64(6, 'UTC'),
    end_time DateTime64(6, 'UTC'),
    nodes Array(String),
    devices Array(String),
    version UInt64,
    job_updated_at DateTime64(6, 'UTC'),
    computed_at DateTime64(6, 'UTC'),
    last_received DateTime64(6, 'UTC'),
    energy_j Float64,
    energy_role LowCardinality(String),
    coverage Float64,
    notes Array(String),
    severity LowCardinality(String),
    footprint Map(String, Float64),
    summary String CODEC(ZSTD(3))
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (site, job_id);

CREATE TABLE IF NOT EXISTS job_records_queue
(
    site String,
    job_id String,
    user String,
    project String,
    start_time String,
    end_time String,
    nodes Array(String),
    devices Array(String),
    version UInt64,
    job_updated_at String,
    computed_at String,
    last_received String,
    energy_j Float64,
    energy_role String,
    coverage Float64,
    notes Array(String),
    severity String,
    footprint Map(String, Float64),
    summary String
)
ENGINE = Kafka
SETTINGS
    kafka_broker_list = '${KAFKA_BROKERS}',
    kafka_topic_list = '${RECORDS_TOPIC}',
    kafka_group_name = '${CONSUMER_GROUP}-records',
    kafka_format = 'JSONEachRow',
    kafka_handle_error_mode = 'stream',
    kafka_num_consumers = 1,
    kafka_flush_interval_ms = ${KAFKA_FLUSH_INTERVAL_MS};

-- The records' view first, the errors' view last (as 0023).
CREATE MATERIALIZED VIEW IF NOT EXISTS job_records_queue_mv TO job_records AS
SELECT
    site,
    job_id,
    user,
    project,
    parseDateTime64BestEffort(start_time, 6, 'UTC') AS start_time,
    parseDateTime64BestEffort(end_time, 6, 'UTC') AS end_time,
    nodes,
    devices,
    version,
    parseDateTime64BestEffort(job_updated_at, 6, 'UTC') AS job_updated_at,
    parseDateTime64BestEffort(computed_at, 6, 'UTC') AS computed_at,
    parseDateTime64BestEffort(last_received, 6, 'UTC') AS last_received,
    energy_j,
    energy_role,
    coverage,
    notes,
    severity,
    footprint,
    summary
FROM job_records_queue
WHERE _error = '';

CREATE MATERIALIZED VIEW IF NOT EXISTS job_records_queue_errors_mv TO ingest_errors AS
SELECT
    now64(3) AS received_at,
    _topic AS topic,
    _partition AS partition,
    _offset AS offset,
    _key AS key,
    _raw_message AS raw_message,
    _error AS error
FROM job_records_queue
WHERE _error != '';
