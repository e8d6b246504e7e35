"""Settings of the local ClickHouse server (env vars `JOBSCOPE_CLICKHOUSE_<NAME>`); the SQL
users' limits are clickhouse/sql_limits.py's, shared with a real server's access control."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from clickhouse.sql_limits import ReadPolicy, SqlLimitSettings
from kafka.security import KafkaClientSettings


class ServerSettings(SqlLimitSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_CLICKHOUSE_", extra="ignore")

    host: str = Field("127.0.0.1", description="address the HTTP and Native interfaces bind to")
    port: int = Field(8123, description="HTTP interface's port")
    data_dir: Path = Field(description="the engine's data directory, owned by this process")
    tmp_dir: Path | None = Field(
        None, description="spool for insert bodies; default <data_dir>-tmp"
    )
    pool_size: int = Field(8, ge=1, description="engine connections = queries running at once")
    queue_timeout_s: float = Field(30.0, gt=0, description="wait for a free connection, then 503")
    admin_user: str = Field(
        "jobscope", description="the read-write user (migrations, the stack's tools)"
    )
    admin_password: SecretStr = Field(description="password of the read-write user")
    reader_user: str = Field("reader", description="the read-only SQL user of power users")
    reader_password: SecretStr = Field(description="password of the read-only user")
    api_user: str = Field("api", description="the API's read-only user")
    api_password: SecretStr | None = Field(
        None, description="password of the API's read-only user; unset: no such user"
    )
    superset_user: str = Field("superset", description="Superset's read-only user")
    superset_password: SecretStr | None = Field(
        None, description="password of Superset's read-only user; unset: no such user"
    )
    read_policy: ReadPolicy = Field(
        "open",
        validation_alias="JOBSCOPE_READ_POLICY",
        description="the site's read policy (as the API's): the engine has no access control "
        "of its own, so under `jobs` the SQL user `reader` (who would see everything) exists "
        "only when sql_users is set",
    )
    sql_users: bool | None = Field(
        None,
        description="the SQL user `reader`, a power user an admin grants: it reads every "
        "table; unset: on, except under read_policy=jobs",
    )
    sql_connections: int = Field(
        4, ge=1, description="engine connections SQL users share; the rest: API and ingestion"
    )
    api_max_execution_time_s: float = Field(
        120.0, gt=0, description="a longer query of the API's user is stopped"
    )
    api_max_memory_usage: int = Field(
        4 << 30, gt=0, description="bytes of memory per query of the API's user"
    )
    api_connections: int = Field(
        8, ge=1, description="engine connections of the API's user (queries at once)"
    )
    session_timeout_s: float = Field(60.0, gt=0, description="idle HTTP sessions are forgotten")
    max_session_connections: int = Field(
        16, ge=0, description="sessions holding temporary tables (each on an engine connection)"
    )
    receive_timeout_s: float = Field(
        30.0, gt=0, description="a client silent this long while sending, or idle, is dropped"
    )
    max_connections: int = Field(
        1024, ge=1, description="open client connections (one thread each); more are closed"
    )
    max_query_size: int = Field(1 << 20, description="bytes of statement text accepted")
    # Request bodies are read only once the request is authenticated, and then in slices:
    # no body, however it is compressed or chunked, is held whole in memory.
    body_slice_bytes: int = Field(
        1 << 20,
        ge=4096,
        description="a request body is read from the socket, and decompressed, this many "
        "bytes at a time (memory per request, whatever the compression ratio)",
    )
    max_body_bytes: int = Field(
        4 << 30,
        gt=0,
        description="decompressed bytes of one request body; insert data is spooled to disk up "
        "to this. More: code 290 (LIMIT_EXCEEDED), HTTP 413",
    )
    max_form_bytes: int = Field(
        64 << 20,
        gt=0,
        description="decompressed bytes of a multipart/form-data body (query, parameters, "
        "external tables: held in memory). More: code 290 (LIMIT_EXCEEDED), HTTP 413",
    )
    max_chunk_size: int = Field(
        1 << 30,
        gt=0,
        description="largest chunk of a chunked request body (ClickHouse's http_max_chunk_size); "
        "larger: code 69 (ARGUMENT_OUT_OF_BOUND), HTTP 400",
    )
    zstd_max_window_bytes: int = Field(
        8 << 20,
        ge=1 << 17,
        description="largest zstd window a request body may need (the decoder allocates it; "
        "8 MiB covers levels 1-19 without --long). More: code 271 (CANNOT_DECOMPRESS)",
    )
    engine_log_file: Path | None = Field(
        None,
        description="the engine's own log (Kafka consumers among others); default "
        "<data_dir>-engine.log",
    )
    engine_log_level: Literal["trace", "debug", "information", "warning", "error"] = Field(
        "error", description="engine log level ('warning' adds chdb's frequent scheduler notices)"
    )
    uncompressed_cache_bytes: int = Field(
        256 << 20, ge=0, description="decompressed blocks kept for repeated reads (0: none)"
    )
    backup_path: Path = Field(
        Path("/"),
        description="the folder under which the admin user's `BACKUP ... TO File(...)` may "
        "write and `RESTORE ... FROM File(...)` read (the engine's backups.allowed_path; "
        "`python -m stack backup DIR` writes to DIR/clickhouse); the read-only users can "
        "run neither",
    )
    kafka_session_timeout_ms: int = Field(
        6000, ge=6000, description="a killed server's consumers leave the group after this"
    )
    kafka_heartbeat_interval_ms: int = Field(
        250, gt=0, description="how soon a consumer hears of a rebalance"
    )
    metrics_cache_s: float = Field(
        15.0,
        ge=0,
        description="/metrics reads Kafka lag, refreshes, disk use and free space at most this "
        "often (a scrape in between gets the last figures: scrapes add no load to queries)",
    )
    growth_min_window_s: float = Field(
        3600.0,
        gt=0,
        description="/metrics estimates the data's growth per day, and the days the free disk "
        "space holds, once it has watched the data directory this long (up to a day)",
    )
    health_record_interval_s: float = Field(
        60.0,
        ge=0,
        description="the /metrics figures and the server's start time are written to the table "
        "server_health this often, for SQL readers and the Devices dashboard (0: never)",
    )
    kafka: KafkaClientSettings = Field(
        default_factory=KafkaClientSettings,
        description="the Kafka tables' credentials, from JOBSCOPE_KAFKA_* (kafka/security.py): "
        "in the engine's configuration file, never in a table's DDL",
    )

    @property
    def engine_log(self) -> Path:
        return self.engine_log_file or self.data_dir.with_name(self.data_dir.name + "-engine.log")

    @property
    def spool_dir(self) -> Path:
        return self.tmp_dir or self.data_dir.with_name(self.data_dir.name + "-tmp")
