"""A ClickHouse HTTP interface in front of the real engine running in-process (chdb).

One process owns the data directory (chdb allows no second process on it) and answers
ClickHouse's HTTP protocol, so clickhouse-connect, Superset and curl work against it as
against a ClickHouse server.
"""
