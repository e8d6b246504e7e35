"""Render migration statements for a ClickHouse cluster (JOBSCOPE_CLICKHOUSE_CLUSTER).

One generic transformation, applied to every statement of every migration, so a new
migration renders for a cluster without a copy of its SQL:

- every DDL statement gets `ON CLUSTER <cluster>`;
- `*MergeTree` engines become `Replicated*MergeTree('<keeper path>', '{replica}', ...)`
  (unless JOBSCOPE_CLICKHOUSE_REPLICATED=false: shards without replicas);
- each table (or plain view) readers query (`DISTRIBUTED`) is stored as
  `<name><local suffix>` on every host, and `<name>` becomes a `Distributed` table over it,
  so readers (the API, Superset) keep their table names; it is created again after each
  statement that sets the local table's columns (CREATE, RENAME into place, ALTER ...
  COLUMN). Materialized views write to and read from the local tables, so each host's
  Kafka-engine table (one per host, all in one consumer group: hosts split the partitions)
  feeds its own shard, and each host's refreshes compute its own rollups;
- `INSERT ... SELECT` (a backfill) into a reader's table reads and writes through the
  Distributed tables, so it covers the whole cluster; other INSERTs (a rebuild's copy)
  run on the host the migrator is connected to, over its local tables.

With no cluster configured, statements pass through unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# The tables readers query, with the sharding key of their Distributed table (used by
# inserts through it: backfills; the Kafka path writes to the local tables).
DISTRIBUTED = {
    "metrics": "cityHash64(device_id)",
    "metrics_1m": "cityHash64(device_id)",
    "metrics_1h": "cityHash64(device_id)",
    "metrics_latest": "cityHash64(device_id)",
    "device_aliases": "cityHash64(device_id)",
    # views over each host's own tables (0022): each shard answers with its own marks
    "rollup_pending_1m": "rand()",
    "rollup_pending_1h": "rand()",
    "metrics_newest": "rand()",
    "jobs": "cityHash64(job_id)",
    "audit_log": "cityHash64(job_id)",  # the admin's: its records from every host
    "job_records": "cityHash64(job_id)",  # as jobs: the host consuming its topic stores them
}

# Code and the parts of a statement no rename may touch: string literals, quoted
# identifiers and comments.
_UNTOUCHED = re.compile(r"'(?:[^'\\]|\\.)*'|`(?:[^`\\]|\\.)*`|--[^\n]*|/\*.*?\*/", re.S)
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# DDL whose ON CLUSTER clause follows the object's name.
_DDL_HEAD = re.compile(
    rf"""^(\s*(?:
        CREATE\s+(?:OR\s+REPLACE\s+)?(?:TABLE|MATERIALIZED\s+VIEW|VIEW|FUNCTION|DICTIONARY)
            (?:\s+IF\s+NOT\s+EXISTS)?
      | DROP\s+(?:TABLE|VIEW|FUNCTION|DICTIONARY)(?:\s+IF\s+EXISTS)?
      | (?:ALTER|OPTIMIZE)\s+TABLE
      | TRUNCATE\s+TABLE(?:\s+IF\s+EXISTS)?
      | DETACH\s+TABLE(?:\s+IF\s+EXISTS)?
      | ATTACH\s+TABLE(?:\s+IF\s+NOT\s+EXISTS)?
    )\s+{_NAME})""",
    re.I | re.X,
)
_CREATE_TABLE = re.compile(
    rf"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TABLE|VIEW)(?:\s+IF\s+NOT\s+EXISTS)?\s+({_NAME})", re.I
)
_INSERT = re.compile(rf"^\s*INSERT\s+INTO\s+(?:TABLE\s+)?({_NAME})", re.I)
_RENAME = re.compile(r"^\s*RENAME\s+TABLE\b", re.I)
_RENAMED_TO = re.compile(rf"\bTO\s+({_NAME})", re.I)
_ALTER_COLUMNS = re.compile(rf"^\s*ALTER\s+TABLE\s+({_NAME})\b.*\bCOLUMN\b", re.I | re.S)
_READERS_TABLES = re.compile(r"\b(" + "|".join(map(re.escape, DISTRIBUTED)) + r")\b")
_MERGE_TREE = re.compile(r"\bENGINE\s*=\s*(\w*)MergeTree\b(?:\s*\(([^()]*)\))?", re.I)


@dataclass(frozen=True)
class ClusterLayout:
    """Where and how the schema lives: `cluster` empty means one server."""

    cluster: str = ""
    replicated: bool = True
    keeper_path: str = "/clickhouse/tables/{uuid}/{shard}"
    local_suffix: str = "_local"

    def local(self, table: str) -> str:
        """The table that stores `table`'s rows on each host."""
        return f"{table}{self.local_suffix}" if self.cluster and table in DISTRIBUTED else table

    def render(self, statement: str) -> list[str]:
        """The statements that do `statement`'s work on the cluster (itself for one server)."""
        if not self.cluster:
            return [statement]
        code = _strip_comments(statement)
        insert = _INSERT.match(code)
        if insert:
            return [statement if insert.group(1) in DISTRIBUTED else self._rename(code)]
        rendered = self._on_cluster(self._replicated(self._rename(code)))
        return [rendered] + [self._distributed(table) for table in _reshaped(code)]

    def _rename(self, code: str) -> str:
        """`code` with the readers' tables replaced by the local ones, outside literals."""
        return _outside_literals(
            code, lambda part: _READERS_TABLES.sub(lambda m: self.local(m[1]), part)
        )

    def _replicated(self, code: str) -> str:
        if not self.replicated:
            return code

        def engine(match: re.Match[str]) -> str:
            args = [f"'{self.keeper_path}'", "'{replica}'"]
            if match[2] and match[2].strip():
                args.append(match[2].strip())
            return f"ENGINE = Replicated{match[1]}MergeTree({', '.join(args)})"

        return _outside_literals(code, lambda part: _MERGE_TREE.sub(engine, part))

    def _on_cluster(self, code: str) -> str:
        clause = f" ON CLUSTER {self.cluster}"
        if _RENAME.match(code):
            return code.rstrip() + clause
        head = _DDL_HEAD.match(code)
        if head is None:
            raise ValueError(f"no cluster rendering for this statement:\n{code}")
        return head[1] + clause + code[head.end() :]

    def _distributed(self, table: str) -> str:
        local = self.local(table)
        return (
            f"CREATE OR REPLACE TABLE {table} ON CLUSTER {self.cluster} AS {local}\n"
            f"ENGINE = Distributed({self.cluster}, currentDatabase(), {local}, "
            f"{DISTRIBUTED[table]})"
        )


def _reshaped(code: str) -> list[str]:
    """The readers' tables whose columns `code` sets (creates, renames into place, alters):
    their Distributed tables are created again after it, with the same columns."""
    if _RENAME.match(code):
        names = _RENAMED_TO.findall(code)
    else:
        names = [m[1] for m in (_CREATE_TABLE.match(code), _ALTER_COLUMNS.match(code)) if m]
    return [name for name in names if name in DISTRIBUTED]


def _strip_comments(statement: str) -> str:
    """`statement` without its comments (a leading comment would hide its keyword)."""

    def keep(match: re.Match[str]) -> str:
        return "" if match[0].startswith(("--", "/*")) else match[0]

    return _UNTOUCHED.sub(keep, statement).strip()


def _outside_literals(code: str, change: Callable[[str], str]) -> str:
    """`code` with `change` applied to its parts between literals and quoted identifiers."""
    pieces, last = [], 0
    for match in _UNTOUCHED.finditer(code):
        pieces += [change(code[last : match.start()]), match[0]]
        last = match.end()
    return "".join([*pieces, change(code[last:])])
