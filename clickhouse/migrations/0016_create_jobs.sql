-- Jobs of the site's scheduler: one row per version of a job (every write is the whole job),
-- the newest version (`updated_at`) wins: readers query with FINAL (the read-only user always
-- does), so a job edited twice is one row. `nodes` hold device ids (a node's domain suffix is
-- dropped on the way in, as Kwollect does); `end_time` is NULL while the job runs.
CREATE TABLE IF NOT EXISTS jobs
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
ORDER BY job_id;
