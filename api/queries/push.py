"""What a pusher may write (api/push.py): the nodes of its user's running jobs and their spans."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clickhouse_connect.driver.client import Client

RUNNING_JOBS = (
    "SELECT node, toUnixTimestamp64Micro(start_time), toUnixTimestamp64Micro(end_time) "
    "FROM jobs ARRAY JOIN nodes AS node "
    "WHERE user = {user:String} AND state = 'running'"
)
"""The nodes of a user's running jobs, with their spans (the reader queries with FINAL:
newest versions)."""


def running_job_spans(client: Client, user: str) -> Sequence[Sequence[Any]]:
    """(node, start, end) in µs of each node of each running job of `user`; end may be None."""
    return client.query(RUNNING_JOBS, parameters={"user": user}).result_rows
