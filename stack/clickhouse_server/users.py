"""Users of the local server and how a request proves who it is."""

from __future__ import annotations

import base64
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import SecretStr

from stack.clickhouse_server.config import ServerSettings
from stack.clickhouse_server.errors import AUTHENTICATION_FAILED, ClickHouseError


@dataclass(frozen=True)
class User:
    name: str
    password: str = field(repr=False)
    readonly: bool
    profile: str | None = None
    """The settings profile of its engine connections (Engine.profiles): set on the connection
    with `readonly=1` last, so nothing the user sends can lift it. None: the read-write user."""
    max_concurrent_queries: int = 0
    """Its queries running at once; one more is refused (code 202). 0: no limit."""


SQL_PROFILE = "sql"
API_PROFILE = "api"
# FINAL hides readings delivered twice. A reading's copies always share a partition (the day
# of its timestamp, which is in the dedup key), so FINAL need not merge across partitions,
# and a partition of one part is read without merging at all.
_DEDUPLICATED = {"final": "1", "do_not_merge_across_partitions_select_final": "1"}


def sql_user_limits(settings: ServerSettings) -> dict[str, str]:
    """The settings profile of SQL users: time, memory, rows read, threads, and a lower
    scheduling priority for their engine threads (a nice value) than ingestion's and the API's."""
    return {
        "max_execution_time": str(settings.sql_max_execution_time_s),
        "max_memory_usage": str(settings.sql_max_memory_usage),
        "max_rows_to_read": str(settings.sql_max_rows_to_read),
        "max_threads": str(settings.sql_max_threads),
        "os_thread_priority": str(settings.sql_os_thread_priority),
    }


def api_limits(settings: ServerSettings) -> dict[str, str]:
    """The settings profile of the API's user: time and memory of a query (the size of its
    answers is bounded by the API, which streams them)."""
    return {
        "max_execution_time": str(settings.api_max_execution_time_s),
        "max_memory_usage": str(settings.api_max_memory_usage),
    }


def profiles(settings: ServerSettings) -> dict[str, tuple[dict[str, str], int]]:
    """The read-only users' settings profiles by name, with the engine connections each may
    use at once; a profile is applied to a connection once, `readonly=1` last (engine.py)."""
    return {
        SQL_PROFILE: ({**_DEDUPLICATED, **sql_user_limits(settings)}, settings.sql_connections),
        API_PROFILE: ({**_DEDUPLICATED, **api_limits(settings)}, settings.api_connections),
    }


def sql_users_enabled(settings: ServerSettings) -> bool:
    """Whether the SQL user `reader` exists. The engine has no access control of its own: a
    SQL user reads every row of every table, so under the `jobs` read policy it is off unless
    an admin grants it (sql_users). Superset's user stays: Superset filters rows itself."""
    if settings.sql_users is not None:
        return settings.sql_users
    return settings.read_policy != "jobs"


def users_from_settings(settings: ServerSettings) -> dict[str, User]:
    def sql_user(name: str, password: SecretStr) -> User:
        return User(
            name,
            password.get_secret_value(),
            readonly=True,
            profile=SQL_PROFILE,
            max_concurrent_queries=settings.sql_max_concurrent_queries_per_user,
        )

    users = [User(settings.admin_user, settings.admin_password.get_secret_value(), readonly=False)]
    if sql_users_enabled(settings):
        users.append(sql_user(settings.reader_user, settings.reader_password))
    if settings.api_password is not None:
        users.append(
            User(
                settings.api_user,
                settings.api_password.get_secret_value(),
                readonly=True,
                profile=API_PROFILE,
            )
        )
    if settings.superset_password is not None:  # Superset's own: SQL Lab, dashboards
        users.append(sql_user(settings.superset_user, settings.superset_password))
    return {user.name: user for user in users}


def credentials(headers: Mapping[str, str], params: Mapping[str, str]) -> tuple[str, str]:
    """User and password from ClickHouse's headers, HTTP Basic auth or URL parameters."""
    if "X-ClickHouse-User" in headers:
        return headers["X-ClickHouse-User"], headers.get("X-ClickHouse-Key", "")
    auth = headers.get("Authorization", "")
    if auth.lower().startswith("basic "):
        try:
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            user, password = "", ""
        return user, password
    return params.get("user", "default"), params.get("password", "")


def authenticate(users: Mapping[str, User], name: str, password: str) -> User:
    user = users.get(name)
    if user is None or not hmac.compare_digest(user.password.encode(), password.encode()):
        raise ClickHouseError(
            AUTHENTICATION_FAILED,
            f"{name}: Authentication failed: password is incorrect, or there is no user "
            "with such name",
        )
    return user
