-- Which devices measure which node: a reading labelled `_device_alias=<node>` (a PDU outlet,
-- a switch port, a wattmeter channel) belongs to that node's jobs. Kept from the readings
-- themselves (through the rows of metrics_1m as they are inserted), so an alias is known
-- without the producers' configuration, with the time span over which it was seen, to the
-- minute before (an outlet moved to another node counts for each in its own time). The job
-- scope reads it to find the few devices whose readings it must filter by label; the
-- readings' own times and labels decide.
CREATE TABLE IF NOT EXISTS device_aliases
(
    alias String,
    device_id String,
    first_seen SimpleAggregateFunction(min, DateTime64(6, 'UTC')),
    last_seen SimpleAggregateFunction(max, DateTime64(6, 'UTC'))
)
ENGINE = AggregatingMergeTree
ORDER BY (alias, device_id);

CREATE MATERIALIZED VIEW IF NOT EXISTS device_aliases_mv TO device_aliases AS
SELECT
    m.labels['_device_alias'] AS alias,
    device_id,
    min(toDateTime64(m.bucket, 6, 'UTC')) AS first_seen,
    max(m.last_time) AS last_seen
FROM metrics_1m AS m
WHERE m.labels['_device_alias'] != ''
GROUP BY alias, device_id;

-- Emptied first: ingestion is stopped from 0010 to 0015, so a run again is exact.
TRUNCATE TABLE device_aliases;

INSERT INTO device_aliases
SELECT m.labels['_device_alias'] AS alias, device_id, min(toDateTime64(m.bucket, 6, 'UTC')),
    max(m.last_time)
FROM metrics_1m AS m
WHERE m.labels['_device_alias'] != ''
GROUP BY alias, device_id;
