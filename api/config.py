"""API settings (env vars `JOBSCOPE_<NAME>`), validated once at start."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_", extra="ignore")

    api_host: str = "127.0.0.1"
    api_port: int = 8000
    clickhouse_host: str = "127.0.0.1"
    clickhouse_port: int = 8123
    clickhouse_api_user: str = "api"
    clickhouse_api_password: SecretStr = Field(
        description="the API reads as its own read-only ClickHouse user (not the SQL users')"
    )
    clickhouse_database: str = "default"
    kafka_bootstrap: str = "127.0.0.1:9092"
    jobs_topic: str = Field("jobs", description="job writes are published here")
    ondemand_topic: str = Field(
        "ondemand", description="on-demand activations are published here (compacted)"
    )
    kafka_write_timeout_s: float = Field(
        5.0, gt=0, description="a write Kafka has not acknowledged by then fails (503), for good"
    )
    admin_token: SecretStr | None = Field(None, description="bearer token with every role")
    scheduler_token: SecretStr | None = Field(
        None, description="bearer token of the scheduler hooks: writes jobs"
    )
    token_secret: SecretStr | None = Field(
        None, description="HS256 key of the signed tokens (api/tokens.py); unset: none accepted"
    )
    reads_need_token: bool = Field(False, description="reads need a valid token of any role")
    readings_topic: str = Field("readings", description="pushed readings are published here")
    json_topic: str = Field(
        "", description="pushed readings are also published here as JSON lines; empty: off"
    )
    push_max_readings: int = Field(10_000, gt=0, description="a larger push is refused (413)")
    push_max_body_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="a larger push body is refused (413)"
    )
    push_max_age_s: float = Field(7 * 86400, ge=0, description="pushed readings this old: 400")
    push_max_ahead_s: float = Field(300, ge=0, description="pushed readings this far ahead: 400")
    push_max_labels: int = Field(32, ge=0, description="labels per pushed reading")
    push_max_label_chars: int = Field(256, gt=0, description="length of a pushed label key/value")
    job_visible_timeout_s: float = Field(
        5.0, ge=0, description="a job write waits this long to be queryable (201), else 202"
    )
    consumer_group: str = Field(
        "jobscope-clickhouse",
        description="ClickHouse's Kafka consumer group: a live replay waits for its offsets",
    )
    live_max_clients: int = Field(200, ge=0, description="live streams at once; more: 503")
    live_buffer_bytes: int = Field(
        8 * 1024 * 1024, gt=0, description="messages a live stream may hold unsent; more: dropped"
    )
    live_send_timeout_s: float = Field(
        30.0, gt=0, description="a live client taking no event for this long is disconnected"
    )
    live_flush_s: float = Field(0.1, ge=0, description="least time between two readings events")
    live_heartbeat_s: float = Field(15.0, gt=0, description="a comment when nothing else is sent")
    live_job_check_s: float = Field(2.0, gt=0, description="how often a live stream reads its job")
    live_end_grace_s: float = Field(
        5.0, ge=0, description="a live stream ends this long after its job's end"
    )
    live_seam_timeout_s: float = Field(
        30.0, gt=0, description="a since= replay waits this long for ClickHouse to catch up"
    )
    default_window_s: int = Field(300, gt=0, description="start_time defaults to end_time - this")
    superset_url: str = Field(
        "http://127.0.0.1:8088",
        description="Superset (`make superset`): /api/metrics/dashboard redirects to it",
    )
    health_timeout_s: float = Field(
        2.0, gt=0, description="/health answers within this, whatever ClickHouse or Kafka do"
    )
    # Limits (api/limits.py, api/server.py): no request, client or query holds the API.
    max_devices: int = Field(1000, gt=0, description="devices (and nodes) named in one request")
    max_metrics: int = Field(1000, gt=0, description="metric names or globs in one request")
    json_max_span_s: int = Field(
        86400, gt=0, description="a JSON answer over more (s, or buckets) is counted first"
    )
    json_max_readings: int = Field(
        1_000_000, gt=0, description="... and refused past this many readings (400)"
    )
    max_exports: int = Field(8, gt=0, description="readings answers streaming at once")
    export_queue: int = Field(
        64, ge=0, description="requests waiting for a free answer slot; more: 503 at once"
    )
    export_wait_s: float = Field(
        10.0, ge=0, description="longest wait for a free answer slot; then 503"
    )
    export_send_timeout_s: float = Field(
        60.0, gt=0, description="a client taking no bytes of an answer for this long is dropped"
    )
    retry_after_s: int = Field(5, ge=0, description="Retry-After of a 503 when a limit is reached")
    query_timeout_s: float = Field(
        60.0, gt=0, description="ClickHouse silent this long on a query (or an export): 504"
    )
    threads: int = Field(
        100, gt=0, description="worker threads of the blocking routes (exports waiting included)"
    )
    max_connections: int = Field(
        1000, gt=0, description="open connections and requests; more: 503 (uvicorn)"
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="a request line and headers not complete by then: closed"
    )
    body_timeout_s: float = Field(
        60.0, gt=0, description="a request body not complete this long after its headers: closed"
    )
    shutdown_timeout_s: float = Field(
        3.0, gt=0, description="on stop, open requests (live streams) get this long to end"
    )
