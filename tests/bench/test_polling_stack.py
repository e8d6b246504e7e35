"""The polling benchmarks' one stack (bench/polling/producer.py `PollingStack`): its parts
started when first needed and once, a benchmark's producer stopped when its block ends,
everything stopped at `close`; and the readings topic counters of bench/polling/topic.py,
which read only what was produced after they started (the topic holds the earlier
benchmarks' readings) and still finish when nothing came. A real Kafka broker, the stack's
own, and jobscope's real producer polling tester:// devices."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from bench.polling.producer import PollingStack, producer
from bench.polling.topic import ReadingsCounter
from kafka import topics
from kafka.message import pack
from kafka.reading import Reading
from stack import services
from stack.processes import wait_until


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PollingStack]:
    shared = PollingStack(tmp_path_factory.mktemp("polling") / "stack")
    try:
        shared.need("kafka")
        yield shared
    finally:
        shared.close()


def _produce(bootstrap: str, device: str, count: int) -> None:
    out = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        reading = Reading(1_795_000_000_000_000 + i, device, "bench_test_value", float(i))
        out.produce(topics.READINGS.name, key=device.encode(), value=pack([reading]).payload)
    assert out.flush(30) == 0


def _counter(bootstrap: str) -> ReadingsCounter:
    counter = ReadingsCounter(bootstrap, topics.READINGS.name)
    counter.start()
    assert counter.started.wait(30), f"the counter never started: {counter.error!r}"
    return counter


def _finished(counter: ReadingsCounter) -> ReadingsCounter:
    counter.finish.set()
    counter.join(30)
    assert not counter.is_alive(), "the counter did not finish"
    assert counter.error is None
    return counter


def test_parts_start_when_first_needed_and_once(stack: PollingStack) -> None:
    settings = stack.settings
    assert stack.started == ["kafka"]
    assert services.process(settings, "kafka").is_running()
    assert not services.process(settings, "clickhouse").is_running()
    assert not services.process(settings, "api").is_running()
    kafka_pid = services.process(settings, "kafka").pid()
    assert stack.need("kafka") is settings
    assert services.process(settings, "kafka").pid() == kafka_pid
    with pytest.raises(ValueError, match="no such part"):
        stack.need("postgres")


def test_counter_reads_only_what_came_after_it(stack: PollingStack) -> None:
    bootstrap = stack.settings.kafka_bootstrap
    device = f"before-{uuid.uuid4().hex[:6]}"
    _produce(bootstrap, device, 5)  # an earlier benchmark's readings
    counter = _counter(bootstrap)
    _produce(bootstrap, device, 3)
    assert len(_finished(counter).messages) == 3


def test_counter_finishes_when_nothing_came(stack: PollingStack) -> None:
    bootstrap = stack.settings.kafka_bootstrap
    _produce(bootstrap, f"earlier-{uuid.uuid4().hex[:6]}", 4)
    assert _finished(_counter(bootstrap)).messages == []


def test_a_benchmarks_producer_is_stopped_with_its_block(
    stack: PollingStack, tmp_path: Path
) -> None:
    part = tmp_path / "some-part"
    part.mkdir()
    devices = part / "devices.yaml"
    devices.write_text("- {name: tv, device_id: part-node, url: 'tester://', update_every: 500}\n")
    counter = _counter(stack.settings.kafka_bootstrap)
    try:
        with producer(
            stack, devices, lambda: bool(counter.messages), "the part's readings", 60
        ) as proc:
            assert proc.name == "producers-some-part"
            assert proc.is_running()
        assert proc.pid() is None
    finally:
        _finished(counter)
    assert services.process(stack.settings, "kafka").is_running()  # the stack stays


def test_close_stops_the_stack(stack: PollingStack) -> None:
    kafka = services.process(stack.settings, "kafka")
    stack.close()
    wait_until(lambda: not kafka.is_running(), 30, "Kafka to stop")
    assert stack.started == []
    with pytest.raises(RuntimeError, match="not started"):
        _ = stack.settings
