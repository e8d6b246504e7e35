"""On-demand regexes in a running producers process: one built to backtrack does not delay
the shard's polling, and one RE2 refuses, or one too long, is refused, logged and counted
while polling goes on.

Anyone who can write the on-demand topic (the API for a pusher's own job, the scheduler's
`monitor=` type, a Kafka client) chooses the pattern; before RE2 (kafka/patterns.py) it
was matched with Python's `re` on the producer's event loop, and `(a+)+_y` against an
entry named `aaaa...a_x` held every device of the shard for seconds.
"""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

import httpx
import orjson
from confluent_kafka import Producer

from producers.config import ProducerSettings
from producers.runtime import now_us
from stack.processes import free_port, wait_until
from tests.conftest import new_topic
from tests.producers.test_producers_kafka import (
    PERIOD_US,
    TopicReader,
    _start_producers,
    close,
    stop_and_drain,
)
from tests.schedules import assert_unbroken

NAME = "a" * 28
"""`(a+)+_y` against `NAME_x` backtracks 2^28 times in Python's `re`: about 10 s."""
DEVICES = f"""\
- {{name: tester_value, device_id: pat-base, url: 'tester://', update_every: 200}}
- {{name: {NAME}_x, device_id: pat-node, url: 'tester://', update_every: 200, optional: true}}
- {{name: {NAME}_y, device_id: pat-node, url: 'tester://', update_every: 200, optional: true}}
"""
LONGEST = ProducerSettings.model_fields["ondemand_max_pattern_chars"].default
ACTIVATIONS = {
    "job/lookahead": "a(?=b)",
    "job/long": "x" * (LONGEST + 1),
    "job/attack": "(a+)+_y",
}
MOST_GAP_US = 10 * PERIOD_US
"""The longest gap between two polls of the healthy device (a busy 2-core machine may skip
a few ticks, which the producer reports); Python's `re` held it for ~10 s."""


def _activate(kafka: str, topic: str) -> None:
    """The activations of pat-node, written to the topic as any Kafka client can."""
    producer = Producer({"bootstrap.servers": kafka})
    for key, metrics in ACTIVATIONS.items():
        document = {"id": key, "devices": ["pat-node"], "metrics": metrics, "until": None}
        producer.produce(topic, orjson.dumps(document), key.encode())
    assert producer.flush(30) == 0, "Kafka did not take the activations"


def test_a_backtracking_on_demand_regex_does_not_delay_polling(kafka: str, tmp_path: Path) -> None:
    topic = new_topic(kafka, "test-patterns")
    ondemand = new_topic(kafka, "test-patterns-ondemand", partitions=1)
    metrics_port = free_port()
    proc, log_file = _start_producers(
        kafka,
        topic,
        tmp_path,
        DEVICES,
        ondemand_topic=ondemand,
        stats_interval_s="1",
        metrics_port=str(metrics_port),
    )
    reader = TopicReader(kafka, topic)
    try:
        wait_until(lambda: len(reader.of("pat-base")) >= 3, 30, "the first ticks of pat-base")
        published = now_us()
        _activate(kafka, ondemand)
        wait_until(lambda: reader.of("pat-node"), 60, "a reading of the activated entry")
        activated = now_us()
        wait_until(
            lambda: len(reader.of("pat-base", after_us=activated)) >= 10, 30, "10 more ticks"
        )
        exposed = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        stop_and_drain(proc, log_file, reader)
    finally:
        close(proc, reader)
    log = log_file.read_text()

    messages = reader.messages
    activated_names = {r.metric_id for m in messages if m.key == "pat-node" for r in m.readings}
    assert activated_names == {f"{NAME}_y"}  # RE2 matches from the start, as `re.match`
    stamps = sorted(
        m.timestamp_us for m in messages if m.key == "pat-base" and m.timestamp_us > published
    )
    assert_unbroken(stamps, PERIOD_US, log, "pat-base")
    # a held event loop is reported too (its ticks skipped): what tells it from a busy
    # machine is how long, ~10 s against a few ticks
    longest = max(later - earlier for earlier, later in pairwise(stamps))
    assert longest < MOST_GAP_US, f"pat-base not polled for {longest / 1e6:.1f} s"

    for key in ("job/lookahead", "job/long"):
        assert f"on-demand activation {key} ignored: metrics: " in log, log
    refused = re.search(r"^jobscope_producer_activations_refused (\S+)$", exposed, re.M)
    assert refused and float(refused[1]) == 2, exposed
