-- Several sites in one central ClickHouse (README, "Federating sites"): MirrorMaker 2 copies
-- each site's topics into the central cluster as `<site>.readings`, `<site>.jobs` (its
-- DefaultReplicationPolicy), and the central consumer subscribes to them (JOBSCOPE_SITES).
-- A message's site is its topic's prefix, derived in one place below; a topic without one (a
-- single site's own `readings` and `jobs`) has none, and its rows are stored as before.
-- Readings of a site carry the label `_site`; a job's `site` becomes part of the jobs' key,
-- because job ids are unique per site only.
-- Statements are idempotent: a migration that fails midway runs again from the top.

-- The site of a message from `topic` when the unprefixed topic is `name`: the prefix of
-- `<site>.<name>`, '' for `name` itself.
CREATE OR REPLACE FUNCTION jobscope_topic_site AS (topic, name) ->
    if(endsWith(topic, concat('.', name)),
       substring(topic, 1, length(topic) - length(name) - 1),
       '');

-- A Kafka table consumes while any view reads it: with its errors view alone in place, the
-- valid readings (or jobs) it consumed would be committed and lost. So each errors view is
-- dropped first and created again last (as 0015 and 0017 left it): in between, either the
-- valid rows' view alone is in place, or no view and nothing is consumed; consumption then
-- resumes from the committed offsets.

-- Readings: the view of 0015 with the site's label added (a producer's own `_site` yields
-- to the topic's).
DROP VIEW IF EXISTS readings_queue_errors_mv;

DROP VIEW IF EXISTS readings_queue_metrics_mv;

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

-- As 0015.
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

-- Jobs: the table of 0016 keyed by (site, job_id), rebuilt (a key cannot take an existing
-- column in place), with the view of 0017 taking the topic's site over the message's.
DROP VIEW IF EXISTS jobs_queue_errors_mv;

DROP VIEW IF EXISTS jobs_queue_mv;

CREATE TABLE IF NOT EXISTS jobs_rebuilt
(
    job_id String,
    user String,
    project String,
    queue LowCardinality(String),
    nodes Array(String),
    start_time Nullable(DateTime64(6, 'UTC')),
    end_time Nullable(DateTime64(6, 'UTC')),
    state LowCardinality(String),
    site LowCardinality(String),
    labels Map(String, String),
    updated_at DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (site, job_id);

-- Should this file run again after a failure: copies of a job version are one row under
-- FINAL, and a run that stopped between the DROP and the RENAME finds an empty `jobs` here.
CREATE TABLE IF NOT EXISTS jobs AS jobs_rebuilt;

INSERT INTO jobs_rebuilt SELECT * FROM jobs;

DROP TABLE IF EXISTS jobs;

RENAME TABLE jobs_rebuilt TO jobs;

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
    coalesce(jobscope_job_time(updated_at), now64(6)) AS updated_at
FROM jobs_queue
WHERE _error = '' AND jobscope_job_problem(job_id, state, start, end) = '';

-- As 0017.
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
