-- Allocations (issue 31) from OAR's CDC (0019): what an OAR job holds inside each node, built
-- from its assigned resources' properties as OAR's cpuset manager uses them: `cpuset` (a core
-- column of OAR's `resources`: the CPU ids of the resource, `0` or `6,38`) and the GPU index
-- property, which connectors/oar-jobs.json renames to `gpu_index` whatever the site calls it
-- (JOBSCOPE_CONNECT_OAR_GPU_PROPERTY: `gpudevice` by default). Only resources of type
-- `default` (OAR's compute resources; not a site's `disk` ones) count. A node's CPU ids are
-- left out when one of its resources' cpuset is not a CPU list, its GPUs when one GPU value is
-- not an index: the job then holds that part of the node whole. Written to `jobs.allocations`
-- (0025) as the jobs topic carries it, node names without their domain, as `nodes`.
-- Resources captured before this migration have no cpuset or GPU until their row changes
-- again (or the connector snapshots anew: connectors/README.md).
-- The Kafka engine refuses ALTER: the views reading `oar_changes_queue` go, it is re-created
-- with the columns, and they come back; the consumer group stays, so consumption resumes from
-- the committed offsets (a change consumed in the moments between the views' statements reaches
-- only those already there, as when 0019 created them: migrate while OAR is quiet). Statements
-- are idempotent: a migration that fails midway runs again.
DROP VIEW IF EXISTS oar_jobs_mv;

DROP VIEW IF EXISTS oar_resources_mv;

DROP VIEW IF EXISTS oar_assigned_resources_mv;

DROP TABLE IF EXISTS oar_changes_queue;

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
    network_address String,
    type String,
    cpuset String,
    gpu_index String
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

ALTER TABLE oar_resources
    ADD COLUMN IF NOT EXISTS type String DEFAULT 'default',
    ADD COLUMN IF NOT EXISTS cpuset String DEFAULT '',
    ADD COLUMN IF NOT EXISTS gpu_index String DEFAULT '';

-- A moldable job's nodes (network addresses), and its allocations as JSON text: per node
-- (short name) its resources' CPU ids and GPU indexes, nodes with neither left out.
CREATE OR REPLACE VIEW oar_moldable_job_nodes AS
SELECT
    site,
    moldable_job_id,
    arraySort(groupArray(network_address)) AS nodes,
    toJSONString(mapFromArrays(
        groupArrayIf(splitByChar('.', network_address)[1], cpus IS NOT NULL OR notEmpty(gpus)),
        groupArrayIf(
            CAST((cpus, gpus), 'Tuple(cpus Nullable(String), gpus Array(String))'),
            cpus IS NOT NULL OR notEmpty(gpus)))) AS allocations
FROM
(
    SELECT
        a.site AS site,
        a.moldable_job_id AS moldable_job_id,
        r.network_address AS network_address,
        groupArrayIf(r.cpuset, r.type IN ('', 'default')) AS cpusets,
        groupArrayIf(r.gpu_index, r.type IN ('', 'default') AND r.gpu_index != '') AS indexes,
        if(notEmpty(cpusets) AND arrayAll(
                c -> match(c, '^[0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?)*$'), cpusets),
            arrayStringConcat(arrayDistinct(cpusets), ','), NULL) AS cpus,
        if(arrayAll(g -> match(g, '^[0-9]{1,4}$'), indexes),
            arraySort(g -> toUInt32(g), arrayDistinct(indexes)), []) AS gpus
    FROM oar_assigned_resources AS a FINAL
    INNER JOIN oar_resources AS r FINAL ON r.site = a.site AND r.resource_id = a.resource_id
    WHERE NOT a.deleted
    GROUP BY a.site, a.moldable_job_id, r.network_address
)
GROUP BY site, moldable_job_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS oar_assigned_resources_mv TO oar_assigned_resources AS
SELECT
    jobscope_topic_site(_topic, '${OAR_CHANGES_TOPIC_NAME}') AS site,
    moldable_job_id,
    resource_id,
    `__deleted` = 'true' AS deleted,
    `__lsn` AS lsn
FROM oar_changes_queue
WHERE `__table` = 'assigned_resources';

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
    fromUnixTimestamp64Milli(change.`__source_ts_ms`, 'UTC') AS updated_at,
    assigned.allocations AS allocations
FROM oar_changes_queue AS change
LEFT JOIN oar_moldable_job_nodes AS assigned
    ON assigned.site = change_site AND assigned.moldable_job_id = change.assigned_moldable_job
WHERE change.`__table` = 'jobs' AND change.`__deleted` != 'true';

CREATE MATERIALIZED VIEW IF NOT EXISTS oar_resources_mv TO oar_resources AS
SELECT
    jobscope_topic_site(_topic, '${OAR_CHANGES_TOPIC_NAME}') AS site,
    resource_id,
    network_address,
    `__lsn` AS lsn,
    if(type = '', 'default', type) AS type,
    cpuset,
    gpu_index
FROM oar_changes_queue
WHERE `__table` = 'resources' AND `__deleted` != 'true';
