"""The rollups' refreshes (clickhouse/schema.sql `metrics_1m_refresh`, `metrics_1h_refresh`)
run at once for everything noted so far, and the bytes of every table of a database.

A scheduled refresh takes the buckets noted before the last whole minute closed 10 s ago, so
the readings of a timed ingest are rolled up 10 to 70 s after it. The bench does not idle
that long with the CPU window open (the servers' idle CPU would count as the rollups'): it
runs each view's own query at once, as the view's APPEND would, with one change, its
`until` (the 1-minute view's) being now instead of that minute. The schedules stay on; the
marks these inserts leave are where the next scheduled refresh starts, so nothing is rolled
up twice or missed. The text is derived from schema.sql, never copied, and a view whose
shape changed fails here instead of being measured wrongly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from clickhouse import rollups
from clickhouse.schema import file_statements
from stack.processes import wait_until

# CREATE MATERIALIZED VIEW <view> REFRESH ... APPEND TO <target> (<columns>) AS <query>
_REFRESH = re.compile(
    r"\ACREATE MATERIALIZED VIEW (?P<view>\w+)\s+REFRESH EVERY [^\n]* APPEND TO "
    r"(?P<target>\w+)\s*\((?P<columns>.*?)\n\)\s*AS (?P<query>WITH\b.*)\Z",
    re.S,
)
_COLUMN = re.compile(r"^\s*`(\w+)`", re.M)
# The 1-minute view's end of what it takes: the last whole minute closed 10 s ago.
_UNTIL_CLOSED_MINUTE = (
    "toDateTime64(toStartOfMinute(now() - toIntervalSecond(10)), 3, 'UTC') AS until"
)
_UNTIL_NOW = "now64(3, 'UTC') AS until"


def insert_now(create: str) -> str:
    """The INSERT a refreshable view's `create` appends on a refresh, taking everything noted
    until now. Raises ValueError if the statement no longer has the shape this relies on."""
    found = _REFRESH.match(create)
    if found is None:
        raise ValueError(f"not a refreshable APPEND view of the expected shape: {create[:200]}")
    query = found["query"]
    if found["view"] == rollups.REFRESHES[0]:
        replaced = query.count(_UNTIL_CLOSED_MINUTE)
        query = query.replace(_UNTIL_CLOSED_MINUTE, _UNTIL_NOW)
        if replaced != 1:
            raise ValueError(f"{found['view']} no longer ends at a closed minute: {query[:400]}")
    columns = ", ".join(_COLUMN.findall(found["columns"]))
    return f"INSERT INTO {found['target']} ({columns}) {query}"


def inserts_now() -> list[str]:
    """The refreshes' inserts, in the order they feed (the hourly reads the 1-minute)."""
    return [insert_now(create) for create in file_statements(rollups.REFRESHES)]


# (device, minute) buckets noted since the 1-minute rollup's mark: what its refresh would take.
NOTED_SQL = "SELECT count() FROM rollup_pending_1m"


def wait_noted(run: Callable[[str], object], buckets: int, timeout: float = 60.0) -> None:
    """Wait until `buckets` (device, minute) buckets are noted. A reading is queryable in
    `metrics` a moment before the view that notes its bucket has committed; a refresh that
    ran in between would move its mark past a bucket it never saw. The scheduled refresh's
    10 s of delay covers that; at once, this wait does."""
    wait_until(
        lambda: int(str(run(NOTED_SQL)).strip()) >= buckets,
        timeout,
        f"{buckets:,} (device, minute) buckets noted for the rollups",
        interval=0.05,
    )


def roll_up_now(run: Callable[[str], object]) -> None:
    """Roll up everything noted so far (`run` executes one statement in the database)."""
    for statement in inserts_now():
        run(statement)


# Runs a SELECT with bound parameters, returns its rows.
Query = Callable[[str, dict[str, Any]], Sequence[Sequence[Any]]]
# Active parts of every table of one database: tables, rollups, latest values, aliases,
# pending buckets, jobs, audit: everything the database keeps.
PARTS_SQL = (
    "SELECT table, sum(bytes_on_disk) FROM system.parts WHERE active AND database = {db:String} "
    "GROUP BY table ORDER BY table"
)
# The MergeTree-family tables of one database that hold parts, to compact.
TABLES_SQL = (
    "SELECT DISTINCT table FROM system.parts WHERE active AND database = {db:String} ORDER BY table"
)


def bytes_by_table(query: Query, db: str) -> dict[str, int]:
    """table -> bytes on disk of its active parts, for every table of `db` that has any."""
    return {str(table): int(size) for table, size in query(PARTS_SQL, {"db": db})}


def compact(query: Query, run: Callable[[str], object], db: str) -> list[str]:
    """OPTIMIZE ... FINAL every table of `db` that holds parts; the tables, in order."""
    tables = [str(row[0]) for row in query(TABLES_SQL, {"db": db})]
    for table in tables:
        run(f"OPTIMIZE TABLE {db}.{table} FINAL")
    return tables
