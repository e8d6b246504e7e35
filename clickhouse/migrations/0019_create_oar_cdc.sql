-- Jobs from OAR's PostgreSQL by change data capture (connectors/README.md): the Debezium
-- connector connectors/oar-jobs.json streams every change of OAR's tables jobs,
-- assigned_resources and resources, as the new row flattened to JSON plus `__table`,
-- `__lsn`, `__source_ts_ms` (commit time) and `__deleted`, into ONE single-partition topic,
-- `oar-changes`, so that changes arrive in commit order. This file is the whole mapping from
-- OAR's rows to jobscope's jobs. Columns are OAR's (connectors/oar/schema.sql); a field of
-- another table is absent from a row and read as its default.
-- One change per block (kafka_max_block_size = 1): a job's row then reads the resources
-- assigned by an earlier change, even one consumed in the same poll (the views of one block
-- would not see each other's rows). A scheduler's change rate is far below what this
-- consumes (tests/connectors/test_oar_cdc.py streams 40 jobs, 240 changes, in ~25 s across a
-- worker restart).
-- A central jobscope of several sites (0018) consumes each site's mirrored `<site>.oar-changes`:
-- every row then carries its site, and a site's jobs, resources and assignments stay its own.
CREATE TABLE IF NOT EXISTS oar_changes_queue
(
    `__table` String,
    `__lsn` UInt64,
    `__source_ts_ms` Int64,
    `__deleted` String,
    job_id Int64,
    job_name String,
    job_type String,
    state String,
    job_user String,
    project String,
    queue_name String,
    start_time Int64,
    stop_time Int64,
    assigned_moldable_job Int64,
    moldable_job_id Int64,
    resource_id Int64,
    network_address String
)
ENGINE = Kafka
SETTINGS
    kafka_broker_list = '${KAFKA_BROKERS}',
    kafka_topic_list = '${OAR_CHANGES_TOPIC}',
    kafka_group_name = '${CONSUMER_GROUP}-oar',
    kafka_format = 'JSONEachRow',
    kafka_num_consumers = 1,
    kafka_max_block_size = 1,
    kafka_flush_interval_ms = ${KAFKA_FLUSH_INTERVAL_MS},
    input_format_skip_unknown_fields = 1;

-- OAR's resources and its jobs' assigned resources, as they are now (newest LSN wins).
CREATE TABLE IF NOT EXISTS oar_resources
(
    site LowCardinality(String),
    resource_id Int64,
    network_address String,
    lsn UInt64
)
ENGINE = ReplacingMergeTree(lsn)
ORDER BY (site, resource_id);

CREATE TABLE IF NOT EXISTS oar_assigned_resources
(
    site LowCardinality(String),
    moldable_job_id Int64,
    resource_id Int64,
    deleted Bool,
    lsn UInt64
)
ENGINE = ReplacingMergeTree(lsn)
ORDER BY (site, moldable_job_id, resource_id);

-- A moldable job's nodes: the network addresses of its assigned resources.
CREATE VIEW IF NOT EXISTS oar_moldable_job_nodes AS
SELECT
    a.site AS site,
    a.moldable_job_id AS moldable_job_id,
    arraySort(groupUniqArray(r.network_address)) AS nodes
FROM oar_assigned_resources AS a FINAL
INNER JOIN oar_resources AS r FINAL ON r.site = a.site AND r.resource_id = a.resource_id
WHERE NOT a.deleted
GROUP BY a.site, a.moldable_job_id;

-- OAR's job states as jobscope's; the others (Waiting, Hold, toLaunch, toAckReservation,
-- Launching) are waiting.
CREATE OR REPLACE FUNCTION jobscope_oar_state AS (state) -> multiIf(
    state IN ('Running', 'Suspended', 'Resuming', 'Finishing'), 'running',
    state = 'Terminated', 'terminated',
    state IN ('Error', 'toError'), 'error',
    'waiting');

-- A change's site: its topic's prefix (0018), '' on a site's own topic.
CREATE MATERIALIZED VIEW IF NOT EXISTS oar_resources_mv TO oar_resources AS
SELECT
    jobscope_topic_site(_topic, '${OAR_CHANGES_TOPIC_NAME}') AS site,
    resource_id,
    network_address,
    `__lsn` AS lsn
FROM oar_changes_queue
WHERE `__table` = 'resources' AND `__deleted` != 'true';

CREATE MATERIALIZED VIEW IF NOT EXISTS oar_assigned_resources_mv TO oar_assigned_resources AS
SELECT
    jobscope_topic_site(_topic, '${OAR_CHANGES_TOPIC_NAME}') AS site,
    moldable_job_id,
    resource_id,
    `__deleted` = 'true' AS deleted,
    `__lsn` AS lsn
FROM oar_changes_queue
WHERE `__table` = 'assigned_resources';

-- Every change of a job is a new version of the whole job (the newest commit wins in
-- `jobs`). Its nodes are read when the job's row changes: OAR inserts the assigned resources
-- before it sets the job's assigned moldable job (toLaunch), in the same transaction or an
-- earlier one, and every later change (Launching, Running, Terminated) reads them again.
CREATE MATERIALIZED VIEW IF NOT EXISTS oar_jobs_mv TO jobs AS
WITH jobscope_topic_site(change._topic, '${OAR_CHANGES_TOPIC_NAME}') AS change_site
SELECT
    toString(change.job_id) AS job_id,
    change.job_user AS user,
    change.project AS project,
    change.queue_name AS queue,
    arrayMap(n -> splitByChar('.', n)[1], assigned.nodes) AS nodes,
    if(change.start_time > 0, toDateTime64(change.start_time, 6, 'UTC'), NULL) AS start_time,
    if(change.stop_time > 0, toDateTime64(change.stop_time, 6, 'UTC'), NULL) AS end_time,
    jobscope_oar_state(change.state) AS state,
    change_site AS site,
    map('oar_state', change.state, 'job_name', change.job_name, 'job_type', change.job_type)
        AS labels,
    fromUnixTimestamp64Milli(change.`__source_ts_ms`, 'UTC') AS updated_at
FROM oar_changes_queue AS change
LEFT JOIN oar_moldable_job_nodes AS assigned
    ON assigned.site = change_site AND assigned.moldable_job_id = change.assigned_moldable_job
WHERE change.`__table` = 'jobs' AND change.`__deleted` != 'true';
