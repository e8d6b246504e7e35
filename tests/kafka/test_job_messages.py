"""The jobs and on-demand messages (kafka/jobs.py, kafka/ondemand.py) against their vectors
(kafka/json_vectors.json): the bytes the API writes, what the readers make of them, what
they refuse; and the ClickHouse table that reads the jobs topic, against the model."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from datetime import datetime
from typing import Any

import pytest

from api.jobs import job_message
from api.ondemand import activation, message
from api.schemas import JobCreate
from kafka import jobs, ondemand, topics
from kafka.jobs import JobMessage
from kafka.ondemand import OnDemandMessage
from producers.ondemand import parse_activation
from stack.config import REPO_ROOT

VECTORS = json.loads((REPO_ROOT / "kafka" / "json_vectors.json").read_text())
JOBS, ONDEMAND = VECTORS["jobs"], VECTORS["ondemand"]
API_JOBS = {
    "running_job": (
        JobCreate(
            job_id="4242",
            user="alice",
            project="energy-study",
            queue="default",
            nodes="node-[1-2]",
            start="2026-11-23T10:00:00+01:00",
            state="running",
            site="nancy",
            labels={"types": "monitor"},
        ),
        datetime(2026, 11, 23, 9, 0, 0, 123456),
    ),
    "minimal_job": (JobCreate(job_id="7"), datetime(2026, 11, 23, 9)),
    "ended_job": (
        JobCreate(
            job_id="1234_5",
            user="zoé",
            nodes=["gpu-01.site.org"],
            start=1795424400,
            end=1795428000.5,
            state="terminated",
            labels={"name": "été"},
        ),
        datetime(2026, 11, 23, 11, 0, 0, 1),
    ),
    "gpu_job": (
        JobCreate(
            job_id="5150",
            user="alice",
            nodes="gpu-[01-02]",
            start="2026-11-23T09:00:00Z",
            allocations={
                "gpu-01.site.org": {
                    "cpus": "32,0-15",
                    "gpus": [1, "0"],
                    "gpu_uuids": [
                        "GPU-5d3f0c4e-8f1b-4a53-9b7e-2f61c0a1d001",
                        "GPU-5d3f0c4e-8f1b-4a53-9b7e-2f61c0a1d002",
                    ],
                    "memory_mb": 64000,
                },
                "gpu-02": {"cpus": 8, "gpus": ["2"]},
            },
        ),
        datetime(2026, 11, 23, 9, 0, 0, 500000),
    ),
}
"""What the API was asked to write for each jobs vector, and when (`gpu_job`: allocations
given loosely, written canonically)."""
API_ACTIVATIONS = {
    "job_activation": activation(
        JobCreate(job_id="4242", nodes=["node-1", "node-2"], end="2026-11-23T12:00:00Z"),
        "wattmetre_|bmc_",
        None,
    ),
    "every_metric": activation(JobCreate(job_id="7", nodes=["node-1"]), None, None),
}
"""The activation the API publishes for each on-demand vector."""
CLICKHOUSE_TYPES = {
    "str": "String",
    "str | None": "Nullable(String)",
    "list[str]": "Array(String)",
    "dict[str, str]": "Map(String, String)",
    "dict[str, dict[str, Any]]": "String",  # allocations: the object's JSON text
}
"""The ClickHouse column type of each field type of the jobs message."""


def _names(cases: list[dict[str, Any]]) -> list[str]:
    return [case["name"] for case in cases]


@pytest.mark.parametrize("case", JOBS["written"], ids=_names(JOBS["written"]))
def test_the_api_writes_the_jobs_vectors(case: dict[str, Any]) -> None:
    written = job_message(*API_JOBS[case["name"]])
    assert jobs.key(written) == case["key"]
    assert jobs.encode(written) == case["value"].encode()
    assert jobs.decode(case["value"].encode()) == written == JobMessage(**case["message"])


@pytest.mark.parametrize("case", JOBS["malformed"], ids=_names(JOBS["malformed"]))
def test_a_malformed_job_message_is_refused_naming_the_field(case: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(case['field'])}"):
        jobs.decode(case["value"].encode())


@pytest.mark.parametrize("case", ONDEMAND["written"], ids=_names(ONDEMAND["written"]))
def test_the_api_writes_the_ondemand_vectors(case: dict[str, Any]) -> None:
    written = message(API_ACTIVATIONS[case["name"]])
    assert written.id == case["key"]
    assert ondemand.encode(written) == case["value"].encode()
    decoded = ondemand.decode(case["key"], case["value"].encode())
    assert decoded == written == OnDemandMessage(**case["message"])


@pytest.mark.parametrize("case", ONDEMAND["read"], ids=_names(ONDEMAND["read"]))
def test_the_producers_read_other_writers_activations(case: dict[str, Any]) -> None:
    decoded = ondemand.decode(case["key"], case["value"].encode())
    assert decoded == OnDemandMessage(**case["message"])
    assert decoded.until_us() == case["until_us"]
    parsed = parse_activation(case["key"], case["value"].encode(), max_pattern_chars=4096)
    assert (parsed.id, parsed.until_us, parsed.job_id) == (
        case["key"],
        case["until_us"],
        case["message"]["job_id"],
    )
    assert parsed.devices == frozenset(case["message"]["devices"])


@pytest.mark.parametrize("case", ONDEMAND["malformed"], ids=_names(ONDEMAND["malformed"]))
def test_a_malformed_activation_is_refused_naming_the_field(case: dict[str, Any]) -> None:
    """Attack: any Kafka client may write to the on-demand topic. A value the producers'
    follower cannot read must be a ValueError (refused, counted, logged): before the
    contract, `"until": []` raised AttributeError and `"until": 1e308` OverflowError, which
    stopped the follower, again at every restart, as the compacted topic keeps the message."""
    value = case["value"].encode()
    with pytest.raises(ValueError, match=f"^{re.escape(case['field'])}"):
        ondemand.decode("job/1", value)
    with pytest.raises(ValueError, match=f"^{re.escape(case['field'])}"):
        parse_activation("job/1", value, max_pattern_chars=4096)


def _kafka_table(name: str) -> tuple[list[tuple[str, str]], str]:
    """The columns (name, type) and the settings of Kafka-engine table `name` in
    clickhouse/schema.sql."""
    schema = (REPO_ROOT / "clickhouse" / "schema.sql").read_text()
    found = re.search(
        rf"^CREATE TABLE {name}\n\((.*?)\n\)\nENGINE = Kafka\nSETTINGS (.*?);$",
        schema,
        re.MULTILINE | re.DOTALL,
    )
    assert found, f"no Kafka table {name} in clickhouse/schema.sql"
    columns = re.findall(r"^\s*`(\w+)` (.+?),?$", found[1], re.MULTILINE)
    return columns, found[2]


def test_the_clickhouse_jobs_table_reads_the_model() -> None:
    """jobs_queue's columns are the message's fields, in order and of matching types (a
    Nullable column may hold a field jobscope always writes: other writers may omit it)."""
    columns, settings = _kafka_table("jobs_queue")
    assert [name for name, _ in columns] == list(jobs.FIELDS)
    for (name, column_type), field in zip(columns, fields(JobMessage), strict=True):
        expected = CLICKHOUSE_TYPES[str(field.type)]
        assert column_type in (expected, f"Nullable({expected})"), (name, column_type)
        if expected.startswith("Nullable"):
            assert column_type == expected, (name, column_type)
    assert f"kafka_topic_list = '{topics.JOBS.name}'" in settings
    assert "kafka_format = 'JSONEachRow'" in settings
