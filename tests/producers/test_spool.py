"""The disk spool (producers/spool.py) and the publisher's use of it when Kafka is away.

The spool tests use real files; a crash is a real child process that exits without closing.
"Kafka away" is a loopback port nobody listens on (held bound, so nothing else takes it);
the delivery tests use the session's real broker.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from producers.config import ProducerSettings
from producers.publisher import Publisher
from producers.spool import FILE_MAGIC, Spool, SpoolError, SpoolRecord, encode
from stack.processes import wait_until
from tests.conftest import new_topic

REPO_ROOT = Path(__file__).resolve().parents[2]


def records(n: int, start: int = 0, size: int = 100) -> list[SpoolRecord]:
    return [
        SpoolRecord(f"dev-{i % 3}", i.to_bytes(4, "big") * (size // 4), i % 7 + 1)
        for i in range(start, start + n)
    ]


def read_all(spool: Spool) -> list:
    items = spool.peek(spool.unread)
    spool.consume(len(items))
    return items


def segment_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.seg"))


def test_records_come_back_in_order_across_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1000)
    assert spool.append(records(30)) == 30
    assert spool.append(records(20, start=30)) == 20
    assert len(segment_files(tmp_path)) > 5
    assert (spool.messages, spool.unread) == (50, 50)
    items = read_all(spool)
    assert [item.record for item in items] == records(50)
    assert (spool.messages, spool.unread) == (50, 0)
    spool.close()


def test_a_segment_is_deleted_only_once_all_its_records_are_acknowledged(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1000)
    spool.append(records(20))
    items = read_all(spool)
    first = items[0].segment
    in_first = [item for item in items if item.segment is first]
    files = len(segment_files(tmp_path))
    for item in reversed(in_first[1:]):  # out of order, as acks across partitions come
        spool.ack(item)
    assert first.path.exists() and len(segment_files(tmp_path)) == files
    spool.ack(in_first[0])
    assert not first.path.exists() and len(segment_files(tmp_path)) == files - 1
    for item in items[len(in_first) :]:
        spool.ack(item)
    assert segment_files(tmp_path) == [] and (spool.messages, spool.bytes, spool.segments) == (
        0,
        0,
        0,
    )
    spool.close()


def test_the_size_bound_refuses_what_does_not_fit(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=3000, segment_bytes=1000)
    assert spool.append(records(100)) < 100
    assert 2500 < spool.bytes <= 3000
    kept = spool.messages
    assert spool.append(records(1, start=100)) == 0
    for item in read_all(spool):  # delivered: room again
        spool.ack(item)
    assert spool.append(records(5, start=200)) == 5
    assert [i.record for i in read_all(spool)] == records(5, start=200)
    assert kept > 10
    spool.close()


def test_acknowledgements_survive_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1000)
    spool.append(records(30))
    items = read_all(spool)
    acked = {0, 1, 2, 5, 17, 29}
    for n in acked:
        spool.ack(items[n])
    spool.append(records(10, start=30))  # written, never read
    spool.close()

    again = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1000)
    assert again.recovered_messages == 40 - len(acked)
    expected = [r for n, r in enumerate(records(40)) if n not in acked]
    assert [i.record for i in read_all(again)] == expected
    again.close()


def test_insert_after_goes_between_two_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    spool.append(records(3))
    first = spool.last_major
    read_all(spool)  # caught up: the next append starts a new segment
    spool.append(records(3, start=10))
    assert spool.insert_after(first, records(2, start=100)) == 2
    spool.close()
    again = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    assert [i.record for i in read_all(again)] == records(3) + records(2, 100) + records(3, 10)
    again.close()


def test_a_corrupt_record_is_reported_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    spool.append(records(10))
    spool.close()
    (segment,) = tmp_path.glob("*.seg")
    size = len(encode(records(1)[0]))
    data = bytearray(segment.read_bytes())
    data[len(FILE_MAGIC) + 3 * size + 50] ^= 0xFF  # a bit flipped in the 4th record's body
    segment.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, "producers.spool"):
        again = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    assert again.corrupt_bytes == size
    assert f"spool {segment}: {size} bytes unreadable" in caplog.text
    assert [i.record for i in read_all(again)] == records(3) + records(6, start=4)
    again.close()


def test_a_record_cut_by_a_crash_is_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    """A real process appends, then dies without closing; its last record is cut short."""
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from producers.spool import Spool, SpoolRecord
        spool = Spool(Path({str(tmp_path)!r}), 1 << 20, 1 << 20)
        spool.append([SpoolRecord("d", bytes([i]) * 100, 1) for i in range(10)])
        segment = next(Path({str(tmp_path)!r}).glob("*.seg"))
        os.truncate(segment, segment.stat().st_size - 30)
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO_ROOT)
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    assert spool.corrupt_bytes == len(encode(SpoolRecord("d", bytes(100), 1))) - 30
    assert [i.record.payload[0] for i in read_all(spool)] == list(range(9))
    spool.close()


def test_checkpoints_bound_what_a_crash_sends_again(tmp_path: Path) -> None:
    """Acknowledged before the last checkpoint: gone after a crash; after it: sent again."""
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from producers.spool import Spool, SpoolRecord
        spool = Spool(Path({str(tmp_path)!r}), 1 << 20, 1 << 20)
        spool.append([SpoolRecord("d", bytes([i]) * 10, 1) for i in range(10)])
        items = spool.peek(10)
        spool.consume(10)
        for item in items[:4]:
            spool.ack(item)
        spool.checkpoint()
        for item in items[4:6]:
            spool.ack(item)
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO_ROOT)
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    assert [i.record.payload[0] for i in read_all(spool)] == list(range(4, 10))
    spool.close()


def test_one_spool_directory_serves_one_process(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    with pytest.raises(SpoolError, match="in use by another producer process"):
        Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    spool.close()
    Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20).close()


# -- the publisher -------------------------------------------------------------------------


@pytest.fixture
def dead_broker() -> Iterator[str]:
    """A loopback address where no broker listens: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def message(device: str, n: int) -> bytes:
    return f"{device}:{n:06d}:".encode() + b"x" * 200


async def publish_all(publisher: Publisher, count: int, devices: int = 4) -> None:
    for n in range(count):
        await publisher.publish(f"dev-{n % devices}", message(f"dev-{n % devices}", n), 10)
        publisher.serve_callbacks()


def test_without_a_broker_messages_fill_the_window_then_memory_then_the_spool(
    dead_broker: str, tmp_path: Path
) -> None:
    settings = ProducerSettings(
        kafka_bootstrap=dead_broker,
        spool_dir=tmp_path / "spool",
        inflight_max_messages=50,
        memory_queue_max_bytes=10_000,
        spool_max_bytes=100_000,
        spool_segment_bytes=20_000,
    )
    publisher = Publisher(settings)
    asyncio.run(publish_all(publisher, 300))
    depth = publisher.depth()
    assert depth.inflight_messages == 50
    assert 0 < depth.memory_bytes <= 10_000
    assert depth.spool_segments > 1 and depth.spool_messages == 300 - 50 - depth.memory_messages
    assert publisher.undelivered() == 300
    assert publisher.counters.messages_spilled == depth.spool_messages
    assert publisher.counters.messages_dropped == 0
    result = publisher.close(0.5)
    assert (result.kept, result.dropped) == (300, 0)


def test_what_exceeds_the_spool_is_counted_and_logged_once(
    dead_broker: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = ProducerSettings(
        kafka_bootstrap=dead_broker,
        spool_dir=tmp_path / "spool",
        inflight_max_messages=10,
        memory_queue_max_bytes=5_000,
        spool_max_bytes=20_000,
        spool_segment_bytes=5_000,
    )
    publisher = Publisher(settings)
    counters = publisher.counters
    with caplog.at_level(logging.WARNING, "producers.publisher"):
        asyncio.run(publish_all(publisher, 500))
        depth = publisher.depth()
        assert counters.messages_dropped > 300
        assert counters.readings_dropped == 10 * counters.messages_dropped
        assert depth.spool_bytes <= 20_000
        assert (
            depth.inflight_messages + depth.memory_messages + depth.spool_messages
            == 500 - counters.messages_dropped
        )
        result = publisher.close(0.2)
    assert caplog.text.count("is full") == 1, caplog.text
    assert result.kept + counters.messages_dropped == 500
    assert result.kept == depth.spool_messages


def test_a_message_kafka_can_never_take_is_counted_as_failed_and_logged_once(
    dead_broker: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Larger than the client's message.max.bytes (1 MB): refused at once, not kept."""
    publisher = Publisher(ProducerSettings(kafka_bootstrap=dead_broker, spool_dir=tmp_path))

    async def too_large() -> None:
        for _ in range(3):
            await publisher.publish("dev", b"x" * 2_000_000, 5)

    with caplog.at_level(logging.ERROR, "producers.publisher"):
        asyncio.run(too_large())
    counters = publisher.counters
    assert (counters.messages_failed, counters.readings_failed) == (3, 15)
    assert publisher.undelivered() == 0
    assert caplog.text.count("delivery failed for device_id=dev: 5 readings lost") == 1
    assert publisher.close(0).kept == 0


def _read_topic(bootstrap: str, topic: str, expected: int) -> list[tuple[str, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "log_level": 0})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
    got: list[tuple[str, bytes]] = []

    def enough() -> bool:
        got.extend(
            (m.key().decode(), m.value())
            for m in consumer.consume(1000, timeout=0.2)
            if not m.error()
        )
        return len(got) >= expected

    try:
        wait_until(enough, 30, f"{expected} messages in {topic}")
        got.extend((m.key().decode(), m.value()) for m in consumer.consume(1000, timeout=1))
    finally:
        consumer.close()
    return got


def test_a_restart_delivers_the_spool_first_in_order_exactly_once(
    dead_broker: str, kafka: str, tmp_path: Path
) -> None:
    """Messages kept at shutdown without a broker (in flight, in memory, spooled) are
    delivered by the next process, before its own, each device's in order, once each."""
    topic = new_topic(kafka, "test-spool")
    spool_dir = tmp_path / "spool"
    small = {
        "readings_topic": topic,
        "spool_dir": spool_dir,
        "inflight_max_messages": 20,
        "memory_queue_max_bytes": 5_000,
        "spool_segment_bytes": 4_000,
    }
    first = Publisher(ProducerSettings(kafka_bootstrap=dead_broker, **small))
    asyncio.run(publish_all(first, 200))
    assert first.close(0.2).kept == 200

    second = Publisher(ProducerSettings(kafka_bootstrap=kafka, **small))
    assert second.counters.messages_recovered == 200

    async def more() -> None:
        for n in range(200, 300):
            await second.publish(f"dev-{n % 4}", message(f"dev-{n % 4}", n), 10)
        while second.undelivered():
            second.serve_callbacks()
            await asyncio.sleep(0.05)

    asyncio.run(asyncio.wait_for(more(), 30))
    assert second.close(5).kept == 0
    assert second.counters.messages_spilled > 0  # the new ones waited behind the spool
    assert second.counters.messages_replayed == 200 + second.counters.messages_spilled
    assert second.counters.messages_delivered == 300
    assert segment_files(spool_dir) == []
    got = _read_topic(kafka, topic, 300)
    assert len(got) == 300
    for device in (f"dev-{d}" for d in range(4)):
        numbers = [int(v.split(b":")[1]) for k, v in got if k == device]
        assert numbers == list(range(int(device[-1]), 300, 4)), device
