"""Fixtures that run real components for the test suite.

The test stack listens on its own ports (19092, 18123, 18000, ...) and keeps its state in a
temporary folder, so `make test` can run beside a stack started by `make up`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack import kafka_broker, topics
from stack.config import StackSettings


@pytest.fixture(scope="session")
def stack_settings(tmp_path_factory: pytest.TempPathFactory) -> StackSettings:
    state = Path(os.environ.get("JOBSCOPE_TEST_STATE") or tmp_path_factory.mktemp("state"))
    return StackSettings(
        state_dir=state,
        kafka_port=19092,
        kafka_controller_port=19093,
        kafka_heap="512m",
        clickhouse_port=18123,
        api_port=18000,
    )


@pytest.fixture(scope="session")
def kafka(stack_settings: StackSettings) -> Iterator[str]:
    """A real single-node Kafka broker with jobscope's topics; yields the bootstrap address."""
    kafka_broker.start(stack_settings)
    topics.ensure_topics(stack_settings.kafka_bootstrap)
    yield stack_settings.kafka_bootstrap
    kafka_broker.process(stack_settings).stop()
