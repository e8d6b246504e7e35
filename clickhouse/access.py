"""SQL users' access control on a real ClickHouse server (the chart, or
JOBSCOPE_CLICKHOUSE_HOST pointing at one), with the server's own: a settings profile whose
constraints hold the limits the local server enforces, a quota, roles with grants on
jobscope's tables only and, under the `jobs` read policy, row policies by user and project.

It is a step of `python -m clickhouse.migrate` run after the migrations every time, not a
migration file: the read policy and the users to grant are settings that may change after a
migration landed (a file runs once and is never edited), and the embedded engine has no
writable access storage (chdb keeps its users in read-only XML: CREATE ROLE fails with code
514), so the step is skipped there. Every statement is idempotent (CREATE ... OR REPLACE,
GRANT, REVOKE).

Roles:
- `jobscope_sql_reader`: people writing SQL. Under `open` and `authenticated` it reads the
  readings, rollups, latest values, jobs, job records and device aliases. Under `jobs` it
  reads `jobs` and `job_records` (a job's summary, kept after its readings expired) through
  row policies (`user = currentUser()`, or a project whose role
  `jobscope_project_<project>` the admin granted the user) and device aliases, and no
  readings at all: a row policy cannot say "devices and times inside one of the user's
  jobs" without a correlated subquery, and a policy by device alone would show other users'
  jobs on the same node.
- `jobscope_sql_service`: services that apply the read policy themselves (Superset's own
  user, with its row-level security): every jobscope table, no row policy, the same profile.

A table with a row policy shows nothing to a user no policy names (on servers where
`users_without_row_policies_can_read_rows` is off), so every row-policied table also gets a
policy `USING 1` for everyone without `jobscope_sql_reader` (the admin, the API's user,
services). On a cluster every statement runs ON CLUSTER (each host's local access storage),
grants and policies name both the Distributed table and the local one behind it, and the
cluster needs an inter-server `<secret>` so shards run a query as its initial user.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from clickhouse_connect.driver.client import Client

from clickhouse.cluster import ClusterLayout
from clickhouse.sql_limits import ReadPolicy, SqlLimitSettings

log = logging.getLogger("clickhouse.access")

PROFILE = "jobscope_sql"
QUOTA = "jobscope_sql"
READER_ROLE = "jobscope_sql_reader"
SERVICE_ROLE = "jobscope_sql_service"
PROJECT_ROLE_PREFIX = "jobscope_project_"
USER_POLICY = "jobscope_own_jobs"
OTHERS_POLICY = "jobscope_unrestricted"

READINGS = ("metrics", "metrics_1m", "metrics_1h", "metrics_latest", "metrics_newest")
# Never granted: the Kafka-engine queues, ingest_errors (whole raw messages), the audit log,
# the rollups' bookkeeping, the OAR connector's tables, schema_migrations, system tables.
ALWAYS = ("jobs", "job_records", "device_aliases")
# job_records holds what `jobs` does of a job (user, project) and its summary: the same rules.
ROW_POLICIED = ("jobs", "job_records")

# A query's result rows, read rows and run time per user and hour, and its queries: a person
# at a SQL prompt or a notebook, not a dashboard refreshed by the second (that is a service).
QUOTA_LIMITS = {
    "queries": 1_000,
    "result_rows": 100_000_000,
    "read_rows": 1_000_000_000_000,
    "execution_time": 3_600,
}


@dataclass(frozen=True)
class SqlUserLimits:
    """The limits of SQL users: those the local server enforces (sql_limits.py)."""

    max_execution_time_s: int
    max_memory_usage: int
    max_rows_to_read: int
    max_threads: int
    nice: int
    max_concurrent_queries: int

    @classmethod
    def of(cls, settings: SqlLimitSettings) -> SqlUserLimits:
        return cls(
            max_execution_time_s=int(settings.sql_max_execution_time_s),
            max_memory_usage=settings.sql_max_memory_usage,
            max_rows_to_read=settings.sql_max_rows_to_read,
            max_threads=settings.sql_max_threads,
            nice=settings.sql_os_thread_priority,
            max_concurrent_queries=settings.sql_max_concurrent_queries_per_user,
        )


ONE_SERVER = ClusterLayout()
# The local server's defaults, never the environment: a real server's profile does not
# follow the local server's JOBSCOPE_CLICKHOUSE_SQL_* variables.
DEFAULT_LIMITS = SqlUserLimits.of(SqlLimitSettings.model_construct())


def profile_settings(limits: SqlUserLimits) -> list[str]:
    """The profile's settings with their constraints. A limit of 0 means none in ClickHouse,
    so each limit has MIN 1 as well as MAX; readonly=1 CONST forbids changing any setting (2
    would open every setting the server has to the user); FINAL hides a job's older versions
    and the row policy is applied after it, so an older version (another owner or project)
    never shows."""
    bounded = {  # name: (value, min, max)
        "max_execution_time": (limits.max_execution_time_s, 1, limits.max_execution_time_s),
        "max_memory_usage": (limits.max_memory_usage, 1, limits.max_memory_usage),
        "max_rows_to_read": (limits.max_rows_to_read, 1, limits.max_rows_to_read),
        "max_threads": (limits.max_threads, 1, limits.max_threads),
        "os_thread_priority": (limits.nice, limits.nice, 19),
        "priority": (limits.nice, limits.nice, None),
        "max_concurrent_queries_for_user": (
            limits.max_concurrent_queries,
            1,
            limits.max_concurrent_queries,
        ),
    }
    fixed = {
        "final": 1,
        "do_not_merge_across_partitions_select_final": 1,
        "apply_row_policy_after_final": 1,
        "allow_introspection_functions": 0,
        "allow_ddl": 0,
        "readonly": 1,
    }
    return [
        f"{name} = {value} MIN {low}" + ("" if high is None else f" MAX {high}")
        for name, (value, low, high) in bounded.items()
    ] + [f"{name} = {value} CONST" for name, value in fixed.items()]


@dataclass(frozen=True)
class AccessControl:
    """The access-control statements of one server or cluster."""

    database: str
    read_policy: ReadPolicy
    layout: ClusterLayout = ONE_SERVER
    readers: tuple[str, ...] = ()
    services: tuple[str, ...] = ()
    limits: SqlUserLimits = DEFAULT_LIMITS

    def statements(self) -> list[str]:
        return [
            *self._profile_and_roles(),
            *self._row_policies(),
            *self._grants(),
            *self._users(),
        ]

    def _on(self) -> str:
        return f" ON CLUSTER {self.layout.cluster}" if self.layout.cluster else ""

    def _tables(self, names: Iterable[str]) -> list[str]:
        """`db.name` of each table, and of the local table behind it on a cluster."""
        stored = {n: [n, self.layout.local(n)] for n in names}
        return [
            f"{_quoted(self.database)}.{_quoted(t)}"
            for tables in stored.values()
            for t in dict.fromkeys(tables)
        ]

    def _profile_and_roles(self) -> list[str]:
        on, roles = self._on(), f"{READER_ROLE}, {SERVICE_ROLE}"
        limits = ", ".join(f"{k} = {v}" for k, v in QUOTA_LIMITS.items())
        return [
            f"CREATE ROLE IF NOT EXISTS {READER_ROLE}{on}",
            f"CREATE ROLE IF NOT EXISTS {SERVICE_ROLE}{on}",
            f"CREATE SETTINGS PROFILE OR REPLACE {PROFILE}{on} SETTINGS "
            + ", ".join(profile_settings(self.limits))
            + f" TO {roles}",
            f"CREATE QUOTA OR REPLACE {QUOTA}{on} KEYED BY user_name "
            f"FOR INTERVAL 1 hour MAX {limits} TO {READER_ROLE}",
        ]

    def _grants(self) -> list[str]:
        """What each role reads: its grants are revoked first, so a table dropped from its
        list (readings when the policy becomes `jobs`) is no longer readable."""
        on = self._on()
        reader = ALWAYS if self.read_policy == "jobs" else (*ALWAYS, *READINGS)
        grants = ((READER_ROLE, reader), (SERVICE_ROLE, (*ALWAYS, *READINGS)))
        return [f"REVOKE{on} ALL ON *.* FROM {READER_ROLE}, {SERVICE_ROLE}"] + [
            f"GRANT{on} SELECT ON {table} TO {role}"
            for role, tables in grants
            for table in self._tables(tables)
        ]

    def _row_policies(self) -> list[str]:
        """Under `jobs`, people read the jobs they own or of their projects; everyone
        else (the admin, the API, services) keeps every row. Otherwise: no row policy."""
        on, tables = self._on(), self._tables(ROW_POLICIED)
        if self.read_policy != "jobs":
            return [
                f"DROP ROW POLICY IF EXISTS {name} ON {table}{on}"
                for table in tables
                for name in (USER_POLICY, OTHERS_POLICY)
            ]
        own = (
            f"user = currentUser() OR has(enabledRoles(), concat('{PROJECT_ROLE_PREFIX}', project))"
        )
        return [
            statement
            for table in tables
            for statement in (
                f"CREATE ROW POLICY OR REPLACE {USER_POLICY} ON {table}{on} "
                f"AS PERMISSIVE FOR SELECT USING {own} TO {READER_ROLE}",
                f"CREATE ROW POLICY OR REPLACE {OTHERS_POLICY} ON {table}{on} "
                f"AS PERMISSIVE FOR SELECT USING 1 TO ALL EXCEPT {READER_ROLE}",
            )
        ]

    def _users(self) -> list[str]:
        """The users the deployment names (the chart's) get their role and the profile."""
        on = self._on()
        return [
            statement
            for role, users in ((READER_ROLE, self.readers), (SERVICE_ROLE, self.services))
            for user in users
            for statement in (
                f"GRANT{on} {role} TO {_quoted(user)}",
                f"ALTER USER {_quoted(user)}{on} DEFAULT ROLE {role} SETTINGS PROFILE '{PROFILE}'",
            )
        ]


def _quoted(name: str) -> str:
    """An identifier in backquotes (a user or project name may hold any character)."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def has_access_storage(client: Client) -> bool:
    """Whether the server keeps users, roles and policies created by SQL (a real server's
    local or replicated directory; the embedded engine has read-only XML users only)."""
    query = "SELECT count() FROM system.user_directories WHERE type != 'users_xml'"
    return int(client.command(query)) > 0  # type: ignore[arg-type]


def apply_access_control(client: Client, access: AccessControl) -> bool:
    """Run the statements when the server can hold them; False (nothing done) when it cannot.
    Users to grant on a server that cannot hold roles is an error, never a silent skip."""
    if not has_access_storage(client):
        if access.readers or access.services:
            raise RuntimeError(
                "SQL users to grant, but the server has no writable access storage "
                "(user_directories: local_directory or replicated)"
            )
        log.info("no access storage on this server (the embedded engine): SQL access skipped")
        return False
    for statement in access.statements():
        client.command(statement)
    log.info("SQL users' access control applied (read policy %s)", access.read_policy)
    return True
