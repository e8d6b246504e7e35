-- Jobs arrive on the compacted `jobs` topic (keyed by job id) as JSON objects, one per
-- message, whoever writes them: the API (`POST/PATCH /api/jobs`, which the scheduler hooks
-- call) or any Kafka producer. Fields: job_id, user, project, queue, site (strings), nodes
-- (array of names), start, end (ISO 8601 or Unix seconds, null or absent while unknown),
-- state (waiting, running, terminated, error), labels (object of strings), updated_at
-- (optional, as start; the time of ingestion when absent). Times are read as text and
-- parsed here so that a bad one is reported instead of becoming 1970.
CREATE OR REPLACE FUNCTION jobscope_job_time AS (t) ->
    if(t IS NULL OR t = '', NULL, parseDateTime64BestEffortOrNull(t, 6, 'UTC'));

-- Why a job message cannot be stored ('' if it can). One definition for both views.
CREATE OR REPLACE FUNCTION jobscope_job_problem AS (job_id, state, start, end) -> multiIf(
    job_id = '' OR NOT isValidUTF8(job_id), 'empty or non-UTF-8 job_id',
    state NOT IN ('waiting', 'running', 'terminated', 'error'),
        concat('state "', state, '" is not waiting, running, terminated or error'),
    start IS NOT NULL AND start != '' AND jobscope_job_time(start) IS NULL,
        concat('start "', start, '" is not a time'),
    end IS NOT NULL AND end != '' AND jobscope_job_time(end) IS NULL,
        concat('end "', end, '" is not a time'),
    ifNull(jobscope_job_time(end) < jobscope_job_time(start), 0), 'end is before start',
    '');

CREATE TABLE IF NOT EXISTS jobs_queue
(
    job_id String,
    user String,
    project String,
    queue String,
    nodes Array(String),
    start Nullable(String),
    end Nullable(String),
    state String,
    site String,
    labels Map(String, String),
    updated_at Nullable(String)
)
ENGINE = Kafka
SETTINGS
    kafka_broker_list = '${KAFKA_BROKERS}',
    kafka_topic_list = '${JOBS_TOPIC}',
    kafka_group_name = '${CONSUMER_GROUP}-jobs',
    kafka_format = 'JSONEachRow',
    kafka_handle_error_mode = 'stream',
    kafka_num_consumers = 1,
    kafka_flush_interval_ms = ${KAFKA_FLUSH_INTERVAL_MS};

CREATE MATERIALIZED VIEW IF NOT EXISTS jobs_queue_errors_mv TO ingest_errors AS
SELECT
    now64(3) AS received_at,
    _topic AS topic,
    _partition AS partition,
    _offset AS offset,
    _key AS key,
    if(_error != '', _raw_message,
       formatRowNoNewline('JSONEachRow', job_id, user, project, queue, nodes, start, end,
           state, site, labels, updated_at)) AS raw_message,
    if(_error != '', _error, jobscope_job_problem(job_id, state, start, end)) AS error
FROM jobs_queue
WHERE _error != '' OR jobscope_job_problem(job_id, state, start, end) != '';

-- Created last: consumption starts once both destinations exist.
CREATE MATERIALIZED VIEW IF NOT EXISTS jobs_queue_mv TO jobs AS
SELECT
    job_id,
    user,
    project,
    queue,
    arrayMap(n -> splitByChar('.', n)[1], nodes) AS nodes,
    jobscope_job_time(start) AS start_time,
    jobscope_job_time(end) AS end_time,
    state,
    site,
    labels,
    coalesce(jobscope_job_time(updated_at), now64(6)) AS updated_at
FROM jobs_queue
WHERE _error = '' AND jobscope_job_problem(job_id, state, start, end) = '';
