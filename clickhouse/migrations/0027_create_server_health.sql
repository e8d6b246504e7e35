-- The ClickHouse server's own health, as its /metrics computes it (stack/clickhouse_server/
-- monitoring.py), recorded once a minute by the server (`health_record_interval_s`) so that
-- SQL readers see what the shipped alert rules watch (monitoring/alerts.yml): the Kafka
-- tables' consumer lag, each rollup's refresh (age, how overdue, failed), the disk (data
-- bytes, free bytes, days left at the last day's growth), the server's start time (a restart).
-- The Devices dashboard draws it. One row per figure and subject (a Kafka table, a view; ''
-- for the server itself) and minute; kept 30 days.
CREATE TABLE IF NOT EXISTS server_health
(
    time DateTime('UTC') CODEC(DoubleDelta, ZSTD(1)),
    figure LowCardinality(String),
    subject LowCardinality(String),
    value Float64 CODEC(Gorilla, ZSTD(1))
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(time)
ORDER BY (figure, subject, time)
TTL time + INTERVAL 30 DAY;
