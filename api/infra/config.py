"""API settings (env vars `JOBSCOPE_<NAME>`), validated once at start."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import hostlist
from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from kafka import topics
from kafka.security import KafkaClientSettings

MIN_TOKEN_CHARS = 16
"""Static tokens shorter than this are refused at start (16 random URL-safe characters:
96 bits; `make up` generates 16)."""
MIN_TOKEN_SECRET_CHARS = 32
"""The HS256 signing key is refused at start below this (RFC 7518: a key of 256 bits)."""
MAX_NODE_CPUS = 65_536
MAX_MAPPED_NODES = 100_000
"""Nodes that JOBSCOPE_NODE_CPUS's object may name, its expressions expanded."""


def _cpu_count(where: str, value: int, zero: bool = False) -> int:
    low = 0 if zero else 1
    if isinstance(value, bool) or not low <= value <= MAX_NODE_CPUS:
        raise ValueError(f"{where}: a CPU count from {low} to {MAX_NODE_CPUS} is required")
    return value


def node_cpus_map(value: dict[str, int]) -> dict[str, int]:
    """`{"node-[1-8]": 64}` as one count per node name (domain suffix dropped, as the API
    names nodes); ValueError naming the key for a bad expression, count or a node given twice."""
    out: dict[str, int] = {}
    for key, count in value.items():
        where = f"node_cpus[{key[:64]!r}]"
        try:
            names = hostlist.expand_hostlist(key)
        except hostlist.BadHostlist as exc:
            raise ValueError(f"{where}: not a node or hostlist expression: {exc}") from None
        for name in names:
            node = name.strip().split(".", 1)[0]
            if not node or node in out:
                raise ValueError(f"{where}: {node!r} is empty or named twice")
            out[node] = _cpu_count(where, count)
            if len(out) > MAX_MAPPED_NODES:
                raise ValueError(f"node_cpus: more than {MAX_MAPPED_NODES} nodes")
    return out


class ApiSettings(KafkaClientSettings):
    """Kafka's address and credentials: kafka/security.py."""

    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_", extra="ignore")

    api_host: str = Field("127.0.0.1", description="address the API binds to")
    api_port: int = Field(8000, description="the API's port")
    clickhouse_host: str = Field("127.0.0.1", description="ClickHouse server the API reads")
    clickhouse_port: int = Field(8123, description="its HTTP port")
    clickhouse_api_user: str = Field("api", description="the API's read-only ClickHouse user")
    clickhouse_api_password: SecretStr = Field(
        description="the API reads as its own read-only ClickHouse user (not the SQL users')"
    )
    clickhouse_database: str = Field("default", description="database of jobscope's tables")
    jobs_topic: str = Field(topics.JOBS.name, description="job writes are published here")
    ondemand_topic: str = Field(
        topics.ON_DEMAND.name, description="on-demand activations are published here (compacted)"
    )
    kafka_write_timeout_s: float = Field(
        5.0, gt=0, description="a write Kafka has not acknowledged by then fails (503), for good"
    )
    admin_token: SecretStr | None = Field(None, description="bearer token with every role")
    scheduler_token: SecretStr | None = Field(
        None, description="bearer token of the scheduler hooks: writes jobs"
    )
    token_secret: SecretStr | None = Field(
        None,
        description="HS256 key of the signed tokens (api/infra/tokens.py); unset: none accepted",
    )
    reads_need_token: bool = Field(
        False,
        description="reads need a valid token of any role: the same as read_policy="
        "authenticated (kept for older settings; read_policy=jobs prevails)",
    )
    read_policy: Literal["open", "authenticated", "jobs"] = Field(
        "open",
        description="who reads what (docs/access.md): open, anyone reads everything; "
        "authenticated, any valid token; jobs, each user their own jobs (and a project "
        "manager its projects'), support, admin and scheduler everything",
    )
    members_read_project: bool = Field(
        False,
        description="under read_policy=jobs, every role that reads its own jobs also reads "
        "the jobs of its projects",
    )
    audit_topic: str = Field(
        topics.AUDIT.name, description="reads of a job by others than its owner are recorded here"
    )
    records_topic: str = Field(
        topics.JOB_RECORDS.name,
        description="job records (api/records.py) are published here; ClickHouse stores them",
    )
    records_interval_s: float = Field(
        60.0,
        ge=0,
        description="how often the API looks for ended, edited or late-fed jobs whose record "
        "to compute (docs/jobs.md); 0: never (another replica does it)",
    )
    records_max_bytes: int = Field(
        16 * 1024 * 1024,
        ge=64 * 1024,
        le=topics.JOB_RECORD_MAX_BYTES - topics.BATCH_OVERHEAD_BYTES,
        description="a job record whose message is larger is stored without its per-series "
        "rows (the summary's `metrics`, `truncated` says so), then without its per-node rows",
    )
    retention_days: int = Field(
        90,
        ge=1,
        description="days raw readings are kept (the schema's JOBSCOPE_RETENTION_DAYS): a job "
        "that started longer ago keeps the summary of its record when it is edited",
    )
    oidc_issuer: str = Field(
        "",
        description="the site's OpenID Connect provider (its issuer URL): its access tokens "
        "are accepted too; empty: only jobscope's own tokens",
    )
    oidc_audience: str = Field(
        "jobscope", description="an OIDC access token must name this audience (`aud`)"
    )
    oidc_cli_client_id: str = Field(
        "jobscope-cli",
        description="the provider's public client that `jobscope login` uses (device grant)",
    )
    oidc_jwks_url: str = Field(
        "", description="the provider's signing keys; empty: its discovery document's jwks_uri"
    )
    oidc_algorithms: list[str] = Field(
        ["RS256", "RS384", "RS512", "PS256", "ES256", "ES384"],
        description="signature algorithms accepted (never none, nor HS*: a public key is no "
        "secret)",
    )
    oidc_leeway_s: float = Field(
        30, ge=0, le=300, description="clock skew allowed on exp, nbf and iat"
    )
    oidc_jwks_cache_s: float = Field(
        300,
        gt=0,
        description="the provider's keys are read again when this old: a key it retired is "
        "refused at the latest then",
    )
    oidc_jwks_refresh_min_s: float = Field(
        10,
        ge=0,
        description="a token signed by an unknown key reads the keys again, at most "
        "this often (a rotation is picked up without restart)",
    )
    oidc_timeout_s: float = Field(5, gt=0, description="the wait for the provider's keys")
    oidc_user_claim: str = Field(
        "preferred_username", description="the claim naming the user (as jobs name it)"
    )
    oidc_projects_claim: str = Field(
        "groups", description="the claim listing the user's projects (a leading / is dropped)"
    )
    oidc_roles_claim: str = Field(
        "realm_access.roles",
        description="the claim listing the user's roles (dotted: a path into the token)",
    )
    oidc_role_map: dict[str, str] = Field(
        {},
        description="provider role -> jobscope role (JSON), besides the roles named as "
        "jobscope's; several: the strongest wins; none: user",
    )
    token_max_ttl_days: float = Field(
        365, gt=0, description="longest lifetime of a signed token: longer ones are refused"
    )
    revocations_topic: str = Field(
        topics.TOKEN_REVOCATIONS.name,
        description="revoked tokens' ids (compacted), read by every replica",
    )
    revocations_load_timeout_s: float = Field(
        10.0,
        gt=0,
        description="at start, the wait for the revocation list; signed tokens: 503 until",
    )
    auth_max_failures: int = Field(
        10, gt=0, description="failed authentications of one client address per window; more: 429"
    )
    auth_failure_window_s: float = Field(
        60.0, gt=0, description="the window of auth_max_failures (and the longest 429 wait)"
    )
    auth_tracked_clients: int = Field(
        10_000, gt=0, description="client addresses whose failures are counted (the oldest go)"
    )
    forwarded_allow_ips: str = Field(
        "127.0.0.1",
        description="proxies whose X-Forwarded-For names the client (comma-separated, or *): "
        "failures are counted per client",
    )
    readings_topic: str = Field(
        topics.READINGS.name, description="pushed readings are published here"
    )
    json_topic: str = Field(
        "", description="pushed readings are also published here as JSON lines; empty: off"
    )
    push_max_readings: int = Field(10_000, gt=0, description="a larger push is refused (413)")
    push_max_body_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="a larger push body is refused (413)"
    )
    push_max_age_s: float = Field(7 * 86400, ge=0, description="pushed readings this old: 400")
    push_max_ahead_s: float = Field(
        30, ge=0, description="pushed readings this far ahead of now (or of a running job): 400"
    )
    push_max_labels: int = Field(32, ge=0, description="labels per pushed reading")
    push_max_label_chars: int = Field(256, gt=0, description="length of a pushed label key/value")
    push_max_device_id_chars: int = Field(128, gt=0, description="longer pushed device ids: 400")
    push_max_metric_id_chars: int = Field(128, gt=0, description="longer pushed metric ids: 400")
    push_rate_readings_per_s: float = Field(
        5000, gt=0, description="readings a pusher token may push per second, sustained; more: 429"
    )
    push_rate_burst: int = Field(
        50_000, gt=0, description="... and at once (at least push_max_readings is allowed)"
    )
    push_max_new_series: int = Field(
        10_000, gt=0, description="new series (device, metric, labels) per token and window: 429"
    )
    push_series_window_s: float = Field(
        3600, gt=0, description="the window of push_max_new_series; a series idle this long is new"
    )
    push_tracked_tokens: int = Field(
        200, gt=0, description="pusher tokens whose rate and series are tracked (idle ones go)"
    )
    push_devices: Path | None = Field(
        None,
        description="the site's map of a sender's `instance` (or `host`) label to a device id "
        "and alias, for the standard push protocols (api/push_devices.py); validated at start",
    )
    push_device_from_instance: bool = Field(
        True,
        description="a sender's `instance` (or `host`) not in push_devices names its device by "
        "its host name, port and domain dropped (an IP address names none: 400)",
    )
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
    metric_registry: Path = Field(
        Path(__file__).parents[1] / "registry.yaml",
        description="the metric registry (docs/metrics-registry.md): units, kinds, energy roles, "
        "scales; validated at start (`python -m api.registry check FILE`)",
    )
    energy_sharing: Literal["exclusive", "cores", "gpus"] = Field(
        "exclusive",
        description="how much of a node's energy is a job's that holds part of it (its "
        "allocations, docs/jobs.md): exclusive, the node's whole; cores, node energy x its "
        "CPUs / node_cpus; gpus, its GPUs' measured energy + (node energy - all the node's "
        "GPUs') x its CPUs / node_cpus. A node without the job's CPUs, or with node_cpus 0, "
        "is exclusive",
    )
    node_cpus: int | dict[str, int] = Field(
        0,
        description="CPUs of the nodes, for energy_sharing: one count for every node (`64`), "
        "or a JSON object of node names or hostlist expressions to counts "
        '(`{"node-[1-8]": 64, "gpu-[1-4]": 128}`, a domain suffix dropped); 0, or a node '
        "the object does not name: unknown, that node exclusive",
    )
    compare_max_jobs: int = Field(10, gt=1, description="jobs in one GET /api/jobs/compare")
    note_rules: Path = Field(
        Path(__file__).parents[1] / "notes.yaml",
        description="the rules turning a job's footprint, silences, energy and metadata into "
        "notes (docs/jobs.md); validated at start (`python -m api.notes check FILE`)",
    )
    superset_url: str = Field(
        "http://127.0.0.1:8088",
        description="Superset (`make superset`): /api/metrics/dashboard redirects to it",
    )
    health_timeout_s: float = Field(
        2.0, gt=0, description="/health answers within this, whatever ClickHouse or Kafka do"
    )
    broker_metrics_cache_s: float = Field(
        10.0,
        ge=0,
        description="/metrics reads the Kafka cluster's state (partitions, consumer group lag) "
        "at most this often; scrapes in between get the last figures",
    )
    # Limits (api/infra/limits.py, api/infra/server.py): no request, client or query holds the API.
    max_devices: int = Field(1000, gt=0, description="devices (and nodes) named in one request")
    max_metrics: int = Field(1000, gt=0, description="metric names or globs in one request")
    max_globs: int = Field(
        32, gt=0, description="metric globs (names with * or ?) in one request; more: 400"
    )
    max_glob_chars: int = Field(256, gt=0, description="a longer metric glob: 400")
    ondemand_max_pattern_chars: int = Field(
        4096, gt=0, description="a longer on-demand metrics regex (body or monitor= type): 400"
    )
    json_max_span_s: int = Field(
        86400, gt=0, description="a JSON answer over more (s, or buckets) is counted first"
    )
    json_max_readings: int = Field(
        1_000_000, gt=0, description="... and refused past this many readings (400)"
    )
    columnar_max_readings: int = Field(
        20_000_000,
        gt=0,
        description="a Parquet or Arrow answer (built whole by the engine) over more than "
        "json_max_span_s is counted first, and refused past this many readings (400)",
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
    max_body_bytes: int = Field(
        1024 * 1024, gt=0, description="a request body over this: 413 (pushes: push_max_body_bytes)"
    )

    @property
    def effective_read_policy(self) -> str:
        """The read policy, the older reads_need_token counting as `authenticated`."""
        if self.reads_need_token and self.read_policy == "open":
            return "authenticated"
        return self.read_policy

    @field_validator("node_cpus")
    @classmethod
    def _node_cpus(cls, value: int | dict[str, int]) -> int | dict[str, int]:
        """A count, or the object expanded to one count per node."""
        if isinstance(value, int):
            return _cpu_count("node_cpus", value, zero=True)
        return node_cpus_map(value)

    @field_validator("admin_token", "scheduler_token", "token_secret", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("admin_token", "scheduler_token", "token_secret")
    @classmethod
    def _long_enough(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        """Short static tokens and keys can be guessed: refused at start, naming the variable."""
        least = MIN_TOKEN_SECRET_CHARS if info.field_name == "token_secret" else MIN_TOKEN_CHARS
        if value is not None and len(value.get_secret_value()) < least:
            name = f"JOBSCOPE_{str(info.field_name).upper()}"
            raise ValueError(
                f"{name} has {len(value.get_secret_value())} characters, at least {least} "
                "are needed (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return value
