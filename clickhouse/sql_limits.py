"""What SQL users (people at a SQL prompt, Superset's user) may do, wherever they query: the
local server of the embedded default sets these limits on their engine connections
(stack/clickhouse_server/users.py, whose settings inherit this class), and on a real server
`python -m clickhouse.migrate` writes them into the SQL roles' settings profile (access.py).
Env vars `JOBSCOPE_CLICKHOUSE_SQL_<NAME>`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ReadPolicy = Literal["open", "authenticated", "jobs"]
"""Who reads what (the API's JOBSCOPE_READ_POLICY; docs/access.md)."""


class SqlLimitSettings(BaseSettings):
    """ClickHouse's settings profile and quotas of SQL users (reader, superset)."""

    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_CLICKHOUSE_", extra="ignore")

    sql_max_execution_time_s: float = Field(60.0, gt=0, description="a longer query is stopped")
    sql_max_memory_usage: int = Field(4 << 30, gt=0, description="bytes of memory per query")
    sql_max_rows_to_read: int = Field(10_000_000_000, ge=0, description="rows per query; 0: any")
    sql_max_threads: int = Field(2, ge=1, description="engine threads per query")
    sql_os_thread_priority: int = Field(
        10, ge=0, le=19, description="nice value of their threads: ingestion and the API first"
    )
    sql_max_concurrent_queries_per_user: int = Field(
        4, ge=1, description="queries of one SQL user at once; more: code 202"
    )
