"""Fixtures that run real components for the test suite.

The test stack listens on its own ports (tests/ports.py: one block per xdist worker) and keeps
its state in its own folder, so `make test` can run beside a stack started by `make up`. Components
start once per session, through the same code as `make up` (stack/services.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka.admin import AdminClient

from kafka import topics
from stack import secrets, services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import wait_until
from tests import ports

# Every JVM the suite starts (Kafka brokers and their storage tool, Connect, MirrorMaker) lives
# for minutes at most: compiled by C1 alone and collected by the serial collector, one start
# costs ~45% less CPU (12.7 s -> 7.1 s for a broker and its storage tool on this 2-core
# machine), and CPU is what bounds the suite's wall time. What the tests prove is unchanged.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.import_plugin("tests.scheduling")
    config.pluginmanager.import_plugin("tests.oidc_provider")
    os.environ.setdefault("JDK_JAVA_OPTIONS", TEST_JVM_OPTIONS)  # xdist workers inherit it


@pytest.fixture(scope="session")
def stack_settings() -> StackSettings:
    """A fresh test stack on this session's (or xdist worker's) ports (tests/ports.py);
    leftovers of a crashed run are stopped first."""
    settings = ports.stack_settings("stack", kafka_heap="512m")
    services.stop_all(settings)
    shutil.rmtree(settings.state_dir, ignore_errors=True)
    return settings


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
    """The REST API, as a process, in front of the test ClickHouse server. Its job records'
    refresher is off: an ended job's summary would otherwise change source (raw, then its
    record) in the middle of a test; tests/api/test_job_records.py runs an API with it on."""
    services.start_api(clickhouse, env={"JOBSCOPE_RECORDS_INTERVAL_S": "0"})
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
        parts = metadata.partitions.values()
        led = all(part.leader >= 0 and part.error is None for part in parts)
        return metadata.error is None and len(parts) == partitions and led

    wait_until(ready, 10, f"topic {topic}")
    return topic


def tracked_files(pattern: str) -> list[Path]:
    """The repository's files matching `pattern` that git tracks, or would (untracked, not
    ignored), as they are in the working tree."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", pattern],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [REPO_ROOT / name for name in listed if (REPO_ROOT / name).exists()]
