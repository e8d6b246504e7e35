"""The producers' follower of the on-demand topic against a real Kafka: malformed messages
any Kafka client may write are refused and counted, and the follower goes on."""

from __future__ import annotations

import asyncio
import json
import logging

from confluent_kafka import Producer

from producers.ondemand import Activations, Follower
from producers.runtime import now_us
from stack.config import REPO_ROOT
from stack.processes import wait_until
from tests.conftest import new_topic

MALFORMED = json.loads((REPO_ROOT / "kafka" / "json_vectors.json").read_text())["ondemand"][
    "malformed"
]


def test_malformed_activations_do_not_stop_the_follower(kafka: str) -> None:
    """Attack: `{"until": []}` or `{"until": 1e308}` on the compacted topic raised out of the
    follower (AttributeError, OverflowError) and stopped it for good, restarts included.
    Now each is refused and the valid activation written after them is applied."""
    topic = new_topic(kafka, "test-ondemand-follow", partitions=1)
    producer = Producer({"bootstrap.servers": kafka})
    for case in MALFORMED:
        producer.produce(topic, case["value"].encode(), f"bad/{case['name']}".encode())
    producer.produce(topic, b'{"devices": ["n1"]}', b"job/good")
    assert producer.flush(30) == 0, "Kafka did not take the activations"
    activations = Activations()
    follower = Follower(
        {"bootstrap.servers": kafka}, topic, activations, logging.getLogger(__name__), 4096
    )

    async def follow() -> None:
        task = asyncio.create_task(follower.run())

        def applied() -> bool:
            assert not task.done(), f"the follower stopped: {task.exception()!r}"
            return activations.active_ids(now_us()) == {"job/good"}

        try:
            await asyncio.to_thread(wait_until, applied, 30, "the activation after the bad ones")
        finally:
            task.cancel()

    asyncio.run(follow())
    assert activations.refused == len(MALFORMED)
