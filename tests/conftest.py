"""Fixtures that run real components for the test suite.

The test stack listens on its own ports (19092, 18123, 18000, ...) and keeps its state in a
temporary folder, so `make test` can run beside a stack started by `make up`. Components
start once per session, through the same code as `make up` (stack/services.py).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator

import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka.admin import AdminClient

from stack import secrets, services, topics
from stack.config import REPO_ROOT, StackSettings
from stack.processes import wait_until


@pytest.fixture(scope="session")
def stack_settings() -> StackSettings:
    """A fresh test stack in state/test-<ports>; leftovers of a crashed run are stopped first."""
    shift = int(os.environ.get("JOBSCOPE_TEST_PORT_SHIFT", "0"))  # for parallel test sessions
    state = REPO_ROOT / "state" / f"test-{19092 + shift}"
    services.stop_all(StackSettings(state_dir=state))
    shutil.rmtree(state, ignore_errors=True)
    return StackSettings(
        state_dir=state,
        kafka_port=19092 + shift,
        kafka_controller_port=19093 + shift,
        kafka_heap="512m",
        clickhouse_port=18123 + shift,
        api_port=18000 + shift,
        producer_metrics_port=19464 + shift,
    )


@pytest.fixture(scope="session")
def kafka(stack_settings: StackSettings) -> Iterator[str]:
    """A real single-node Kafka broker with jobscope's topics; yields the bootstrap address."""
    services.start_kafka(stack_settings)
    yield stack_settings.kafka_bootstrap
    services.process(stack_settings, "kafka").stop()


@pytest.fixture(scope="session")
def clickhouse(stack_settings: StackSettings, kafka: str) -> Iterator[StackSettings]:
    """The local ClickHouse server (real engine) with jobscope's schema applied."""
    services.start_clickhouse(stack_settings)
    yield stack_settings
    services.process(stack_settings, "clickhouse").stop()


@pytest.fixture(scope="session")
def admin_client(clickhouse: StackSettings) -> Client:
    return services.clickhouse_client(clickhouse, "jobscope")


@pytest.fixture(scope="session")
def reader_client(clickhouse: StackSettings) -> Client:
    return services.clickhouse_client(clickhouse, "reader")


@pytest.fixture(scope="session")
def api_url(clickhouse: StackSettings) -> Iterator[str]:
    """The REST API, as a process, in front of the test ClickHouse server."""
    services.start_api(clickhouse)
    yield clickhouse.api_url
    services.process(clickhouse, "api").stop()


@pytest.fixture(scope="session")
def api_tokens(stack_settings: StackSettings) -> dict[str, str]:
    """The test stack's API tokens by role (generated into its secrets.env like make up's)."""
    values = secrets.load_or_create(stack_settings.state_dir)
    return {
        "admin": values["JOBSCOPE_ADMIN_TOKEN"],
        "scheduler": values["JOBSCOPE_SCHEDULER_TOKEN"],
    }


def wait_for_rollups(client: Client, device: str, readings: int, timeout: float = 180.0) -> None:
    """Wait until the 1-minute and the 1-hour rollups hold `readings` readings of `device`
    (refreshed once their minutes are past: clickhouse/migrations/0022)."""

    def rolled_up() -> bool:
        counts = client.query(
            "SELECT (SELECT sum(count) FROM metrics_1m FINAL WHERE device_id = {d:String}), "
            "(SELECT sum(count) FROM metrics_1h FINAL WHERE device_id = {d:String})",
            parameters={"d": device},
        ).first_row
        return list(counts) == [readings, readings]

    wait_until(rolled_up, timeout, f"the rollups to hold the {readings} readings of {device}")


def new_topic(bootstrap: str, prefix: str, partitions: int = 3) -> str:
    """A topic of the caller's own, `prefix-<random>`, ready when this returns."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    topics.ensure_topics(bootstrap, (topics.TopicSpec(topic, partitions),))
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def ready() -> bool:
        metadata = admin.list_topics(topic, timeout=5).topics[topic]
        return metadata.error is None and len(metadata.partitions) == partitions

    wait_until(ready, 10, f"topic {topic}")
    return topic
