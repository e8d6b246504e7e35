"""Apply the ordered SQL migrations of clickhouse/migrations/ idempotently.

`python -m clickhouse.migrate` connects over ClickHouse's HTTP interface (the local server
of the embedded default, or a real cluster), applies each file not yet recorded in
`schema_migrations`, in name order, after substituting `${NAME}` placeholders from
settings, and refuses to go on if a recorded file was edited after it was applied.
Retention is the one setting that may change later: it is re-applied as a TTL change.

A Kafka-engine table consumes whenever any view reads it, and commits what it consumed.
A migration that replaces the views of such a table (readings_queue, jobs_queue) drops its
errors view first and creates it again last, so that its other view is never missing while
it consumes (0018, 0021); a rebuild of a table those views write to detaches the Kafka
table meanwhile (0020).
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
from pathlib import Path
from typing import Annotated

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from pydantic import BeforeValidator, Field, SecretStr, StringConstraints
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from clickhouse.access import AccessControl, ReadPolicy, apply_access_control
from clickhouse.cluster import ClusterLayout
from kafka import topics

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def comma_separated(value: object) -> object:
    """A list setting given as `a,b,c` in its environment variable (with NoDecode, which
    keeps pydantic-settings from reading it as JSON): `Annotated[list[X], NoDecode,
    BeforeValidator(comma_separated)]`."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


log = logging.getLogger("clickhouse.migrate")
SiteName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]+$")]
"""A site's name (its MirrorMaker 2 cluster alias): the prefix of its mirrored topics."""


class MigrationSettings(BaseSettings):
    """Env vars `JOBSCOPE_<NAME>`; the Kafka values are baked into the Kafka table."""

    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_", extra="ignore")

    clickhouse_host: str = Field(
        "127.0.0.1", description="ClickHouse server the schema is created on"
    )
    clickhouse_port: int = Field(8123, description="its HTTP port")
    clickhouse_admin_user: str = Field(
        "jobscope", description="a user allowed to create tables and views"
    )
    clickhouse_admin_password: SecretStr = Field(description="its password")
    clickhouse_database: str = Field("default", description="database the schema is created in")
    kafka_bootstrap: str = Field(
        "127.0.0.1:9092",
        description="Kafka bootstrap baked into the Kafka-engine tables when they are created",
    )
    readings_topic: str = Field(
        topics.READINGS.name,
        description="readings topic the Kafka table consumes (baked in when created)",
    )
    jobs_topic: str = Field(
        topics.JOBS.name,
        description="jobs topic the jobs Kafka table consumes (baked in when created)",
    )
    audit_topic: str = Field(
        topics.AUDIT.name, description="reads of jobs by others than their owners (api/audit.py)"
    )
    records_topic: str = Field(
        topics.JOB_RECORDS.name,
        description="job records the API computes (api/records.py), stored in job_records",
    )
    sites: Annotated[list[SiteName], NoDecode, BeforeValidator(comma_separated)] = Field(
        default_factory=list,
        description="a central ClickHouse of several sites: the sites whose mirrored topics "
        "(`<site>.<readings_topic>`, `<site>.<jobs_topic>`, `<site>.oar-changes`) it consumes, "
        "comma-separated; empty: one site, consuming its own topics",
    )
    consumer_group: str = Field(
        "jobscope-clickhouse",
        description="ClickHouse's Kafka consumer group (baked in when created)",
    )
    kafka_consumers: int = Field(2, ge=1, description="Kafka engine consumers (<= partitions)")
    kafka_flush_interval_ms: int = Field(
        500, ge=10, description="max wait before a block is written"
    )
    statement_timeout_s: int = Field(
        6 * 3600, gt=0, description="how long the runner waits for one statement"
    )
    retention_days: int = Field(
        90,
        ge=1,
        le=20000,
        # Bounded: past the year 2106 the TTL date wraps around and every row would expire.
        description="TTL of raw readings in days",
    )
    rollup_1m_retention_days: int | None = Field(
        None,
        ge=1,
        le=20000,
        description="TTL of the 1-minute rollups (metrics_1m) in days; unset: as long as raw "
        "readings (a 5 s series has 12 readings a minute, so its minute rollup weighs about a "
        "tenth of them; 400 keeps last year's jobs plotted by the minute). 1-hour rollups and "
        "job records are kept for ever (docs/jobs.md)",
    )
    clickhouse_cluster: str = Field(
        "", description="ClickHouse cluster to create the schema ON CLUSTER; empty: one server"
    )
    clickhouse_replicated: bool = Field(
        True, description="on a cluster: Replicated*MergeTree tables (needs Keeper)"
    )
    clickhouse_keeper_path: str = Field(
        "/clickhouse/tables/{uuid}/{shard}", description="Keeper path of a replicated table"
    )
    clickhouse_local_suffix: str = Field(
        "_local", description="on a cluster: suffix of the tables behind the Distributed ones"
    )
    read_policy: ReadPolicy = Field(
        "open",
        description="the site's read policy (as the API's): under `jobs`, SQL users of a real "
        "server read only their own jobs and their projects' (row policies) and no readings "
        "(docs/sql-users.md)",
    )
    clickhouse_access_control: bool = Field(
        True,
        description="create the SQL users' settings profile, quota, roles, grants and row "
        "policies (clickhouse/access.py) on a server with a writable access storage; the "
        "embedded engine has none and is skipped",
    )
    clickhouse_sql_readers: Annotated[list[str], NoDecode, BeforeValidator(comma_separated)] = (
        Field(
            default_factory=list,
            description="existing ClickHouse users (created by SQL) given the role "
            "jobscope_sql_reader and the profile jobscope_sql, comma-separated",
        )
    )
    clickhouse_sql_services: Annotated[list[str], NoDecode, BeforeValidator(comma_separated)] = (
        Field(
            default_factory=list,
            description="existing ClickHouse users of services that apply the read policy "
            "themselves (Superset's) given the role jobscope_sql_service: every row, the same "
            "profile; comma-separated",
        )
    )

    def subscribed(self, topic: str) -> list[str]:
        """The topics the consumer of `topic` reads: the sites' mirrored copies, or `topic`."""
        return [f"{site}.{topic}" for site in self.sites] if self.sites else [topic]

    def layout(self) -> ClusterLayout:
        return ClusterLayout(
            cluster=self.clickhouse_cluster,
            replicated=self.clickhouse_replicated,
            keeper_path=self.clickhouse_keeper_path,
            local_suffix=self.clickhouse_local_suffix,
        )

    def access_control(self) -> AccessControl:
        return AccessControl(
            database=self.clickhouse_database,
            read_policy=self.read_policy,
            layout=self.layout(),
            readers=tuple(self.clickhouse_sql_readers),
            services=tuple(self.clickhouse_sql_services),
        )

    def retention(self) -> dict[str, int]:
        """Days each retained table keeps (RETAINED's tables)."""
        rollup = self.rollup_1m_retention_days or self.retention_days
        return {"metrics": self.retention_days, "metrics_1m": rollup}

    def placeholders(self) -> dict[str, str]:
        return {
            "KAFKA_BROKERS": self.kafka_bootstrap,
            "READINGS_TOPIC": ",".join(self.subscribed(self.readings_topic)),
            "JOBS_TOPIC": ",".join(self.subscribed(self.jobs_topic)),
            "READINGS_TOPIC_NAME": self.readings_topic,
            "JOBS_TOPIC_NAME": self.jobs_topic,
            "AUDIT_TOPIC": self.audit_topic,
            "RECORDS_TOPIC": self.records_topic,
            "OAR_CHANGES_TOPIC": ",".join(self.subscribed(topics.OAR_CHANGES.name)),
            "OAR_CHANGES_TOPIC_NAME": topics.OAR_CHANGES.name,
            "CONSUMER_GROUP": self.consumer_group,
            "KAFKA_CONSUMERS": str(self.kafka_consumers),
            "KAFKA_FLUSH_INTERVAL_MS": str(self.kafka_flush_interval_ms),
            "RETENTION_DAYS": str(self.retention_days),
        }


def render(sql: str, values: dict[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise KeyError(f"unknown placeholder ${{{name}}}")
        return values[name]

    return re.sub(r"\$\{([A-Z_]+)\}", substitute, sql)


def statements(sql: str) -> list[str]:
    """The statements of a migration file: each ends with `;` at the end of a line (a file of
    one statement may omit it). A file that fails midway is run again from its start, so
    every statement of a file with several must be idempotent (IF [NOT] EXISTS)."""
    parts = (part.strip() for part in re.split(r";[ \t]*$", sql, flags=re.M))
    return [p for p in parts if re.sub(r"--[^\n]*", "", p).strip()]


def superseded(sql: str) -> list[str]:
    """Migrations a file replaces, from its `-- supersedes: <file> <file>...` lines."""
    return [
        name
        for line in re.findall(r"^--\s*supersedes:(.*)$", sql, flags=re.M)
        for name in line.split()
    ]


def connect(settings: MigrationSettings) -> Client:
    return clickhouse_connect.get_client(
        host=settings.clickhouse_host,
        port=settings.clickhouse_port,
        username=settings.clickhouse_admin_user,
        password=settings.clickhouse_admin_password.get_secret_value(),
        database=settings.clickhouse_database,
        # a migration that copies a large table runs long; a client that gave up would run
        # it again while the server still copies
        send_receive_timeout=settings.statement_timeout_s,
    )


def apply_migrations(
    client: Client, settings: MigrationSettings, directory: Path = MIGRATIONS_DIR
) -> list[str]:
    """Apply pending migrations in order; return the names applied by this call. One that a
    later file supersedes is recorded without running when it is still pending (a fresh
    database): it would only create what the later one drops."""
    client.command(
        "CREATE TABLE IF NOT EXISTS schema_migrations (name String, checksum String, "
        "applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) ENGINE = MergeTree ORDER BY name"
    )
    recorded = dict(client.query("SELECT name, checksum FROM schema_migrations").result_rows)
    texts = {path.name: path.read_text() for path in sorted(directory.glob("*.sql"))}
    replaced_by = {old: name for name, text in texts.items() for old in superseded(text)}
    applied = []
    placeholders, layout = settings.placeholders(), settings.layout()
    for name, text in texts.items():
        checksum = hashlib.sha256(text.encode()).hexdigest()
        if name in recorded:
            if recorded[name] != checksum:
                raise RuntimeError(
                    f"{name} changed after it was applied: add a new migration instead"
                )
            continue
        if name in replaced_by:  # a later file replaces what this one would create: skip it
            log.info("skipped %s (superseded by %s)", name, replaced_by[name])
        else:
            for statement in statements(render(text, placeholders)):
                run_statement(client, layout, statement)
            applied.append(name)
            log.info("applied %s", name)
        client.insert("schema_migrations", [[name, checksum]], column_names=["name", "checksum"])
    ensure_retention(client, settings.retention(), layout)
    if settings.clickhouse_access_control:
        apply_access_control(client, settings.access_control())
    return applied


def run_statement(client: Client, layout: ClusterLayout, statement: str) -> None:
    """Run `statement` as the layout renders it (on a cluster: several statements)."""
    for part in layout.render(statement):
        client.command(part)


# The tables whose TTL follows a configured retention, with the time their TTL counts from.
RETAINED = {"metrics": "toDateTime(timestamp)", "metrics_1m": "bucket"}


def ensure_retention(client: Client, retention: dict[str, int], layout: ClusterLayout) -> None:
    """Re-apply the TTL of raw readings and of their 1-minute rollup when the configured
    retention changed (on a cluster: of the local tables, on every host)."""
    for table, since in RETAINED.items():
        days = retention[table]
        create = client.command(
            "SELECT create_table_query FROM system.tables "
            "WHERE database = currentDatabase() AND name = {table:String}",
            parameters={"table": layout.local(table)},
        )
        if not create:  # a later migration creates it (a directory of older migrations)
            continue
        match = re.search(r"toIntervalDay\((\d+)\)", str(create))  # how ClickHouse stores it
        if match is None:
            raise RuntimeError(f"{table} has no TTL in days: cannot check the retention")
        if int(match.group(1)) != days:
            alter = f"ALTER TABLE {table} MODIFY TTL {since} + INTERVAL {days:d} DAY"
            run_statement(client, layout, alter)
            log.info("retention of %s changed to %d days", table, days)


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = MigrationSettings()  # type: ignore[call-arg]
    applied = apply_migrations(connect(settings), settings)
    log.info("schema up to date (%d migration(s) applied now)", len(applied))
    return 0


if __name__ == "__main__":
    sys.exit(main())
