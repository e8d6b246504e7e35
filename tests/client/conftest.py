"""A job with readings of its own, for the CLI and client tests: the API tests' helpers
(readings straight into ClickHouse, jobs through the API) reused."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.api.conftest import insert_readings, post_job  # noqa: F401 (fixtures)

METRICS = ("bmc_power_watt", "bmc_temp_celsius", "prom_node_load1")


@dataclass(frozen=True)
class Scenario:
    job_id: str
    user: str
    nodes: tuple[str, ...]
    start: datetime
    end: datetime
    rows: list[list[Any]]


@pytest.fixture(scope="module")
def scenario(
    insert_readings: Callable[[list[list[Any]]], None],  # noqa: F811
    post_job: Callable[..., dict[str, Any]],  # noqa: F811
) -> Scenario:
    """A terminated job on two nodes, 2 min long and ending 10 min ago; each node reports
    three metrics every second (720 readings), two of them with labels."""
    prefix = f"cli-{uuid.uuid4().hex[:8]}"
    end = (datetime.now(UTC) - timedelta(minutes=10)).replace(tzinfo=None, microsecond=0)
    start = end - timedelta(minutes=2)
    nodes = (f"{prefix}-node-1", f"{prefix}-node-2")
    rows = [
        [
            start + timedelta(seconds=s, microseconds=250_000),
            node,
            metric,
            100.0 + n * 10 + s / 8 if metric == "bmc_power_watt" else s % 7 + 0.5,
            {"sensor": f"s{n}", "unit": "W"} if metric.startswith("bmc_") else {},
        ]
        for n, node in enumerate(nodes, 1)
        for metric in METRICS
        for s in range(120)
    ]
    insert_readings(rows)
    job_id = f"{prefix}-job"
    post_job(
        job_id=job_id,
        user=f"{prefix}-user",
        nodes=list(nodes),
        start=start.isoformat() + "Z",
        end=end.isoformat() + "Z",
        state="terminated",
    )
    return Scenario(job_id, f"{prefix}-user", nodes, start, end, rows)
