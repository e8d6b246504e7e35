-- Allocations (issue 31): what a job was given inside each node (CPU ids or a count, GPU
-- indexes and UUIDs, memory), as the jobs topic's optional field `allocations`
-- (kafka/allocations.py), kept as its JSON text: '' (or '{}') for a whole-node job, which
-- every job written before this field is. The API reads it and scopes per-GPU and per-CPU
-- readings by it; nothing here interprets it.
-- The Kafka engine refuses ALTER: `jobs_queue` is re-created with the column, and its two
-- views as 0018 left them plus the column. The consumer group stays; consumption stops
-- between the statements and resumes from the committed offsets. As in 0021, the errors view
-- goes first and comes back last, so no valid job is consumed while only it is in place.
-- Statements are idempotent: a migration that fails midway runs again from the top.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS allocations String DEFAULT '' CODEC(ZSTD(1));

DROP VIEW IF EXISTS jobs_queue_errors_mv;

DROP VIEW IF EXISTS jobs_queue_mv;

DROP TABLE IF EXISTS jobs_queue;

-- An object read into a String column is its JSON text (set here, whatever the server's
-- default); a message without the field reads ''.
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
    updated_at Nullable(String),
    allocations String
)
ENGINE = Kafka
SETTINGS
    kafka_broker_list = '${KAFKA_BROKERS}',
    kafka_topic_list = '${JOBS_TOPIC}',
    kafka_group_name = '${CONSUMER_GROUP}-jobs',
    kafka_format = 'JSONEachRow',
    kafka_handle_error_mode = 'stream',
    kafka_num_consumers = 1,
    kafka_flush_interval_ms = ${KAFKA_FLUSH_INTERVAL_MS},
    input_format_json_read_objects_as_strings = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS jobs_queue_mv TO jobs AS
WITH jobscope_topic_site(_topic, '${JOBS_TOPIC_NAME}') AS topic_site
SELECT
    job_id,
    user,
    project,
    queue,
    arrayMap(n -> splitByChar('.', n)[1], nodes) AS nodes,
    jobscope_job_time(start) AS start_time,
    jobscope_job_time(end) AS end_time,
    state,
    if(topic_site = '', site, topic_site) AS site,
    labels,
    coalesce(jobscope_job_time(updated_at), now64(6)) AS updated_at,
    allocations
FROM jobs_queue
WHERE _error = '' AND jobscope_job_problem(job_id, state, start, end) = '';

CREATE MATERIALIZED VIEW IF NOT EXISTS jobs_queue_errors_mv TO ingest_errors AS
SELECT
    now64(3) AS received_at,
    _topic AS topic,
    _partition AS partition,
    _offset AS offset,
    _key AS key,
    if(_error != '', _raw_message,
       formatRowNoNewline('JSONEachRow', job_id, user, project, queue, nodes, start, end,
           state, site, labels, updated_at, allocations)) AS raw_message,
    if(_error != '', _error, jobscope_job_problem(job_id, state, start, end)) AS error
FROM jobs_queue
WHERE _error != '' OR jobscope_job_problem(job_id, state, start, end) != '';
