"""Live power per node from jobscope's JSON readings topic (`make up JSON_TOPIC=1`).

Keeps the newest value of every power series (metric ending in `_watt`) and prints, every
`--every` seconds, the sum per node: a series counts for the node named by its
`_device_alias` label (a PDU outlet, a wattmeter port) or else for its own device.

    python examples/live_node_power.py --bootstrap 127.0.0.1:9092 --topic readings-json
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, TopicPartition


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    parser.add_argument("--topic", default="readings-json", help="the JSON readings topic")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between two prints")
    parser.add_argument("--from-beginning", action="store_true", help="read the topic's history")
    args = parser.parse_args()

    # Every partition assigned directly, no consumer group: nothing to join at the start,
    # nothing to leave at Ctrl-C, and no offsets committed (group.id is required, unused).
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"live-node-power-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        topic = consumer.list_topics(args.topic, timeout=10).topics[args.topic]
        if topic.error is not None:
            raise KafkaException(topic.error)
    except KafkaException as error:
        consumer.close()
        raise SystemExit(f"topic {args.topic} at {args.bootstrap}: {error.args[0].str()}") from None
    start = OFFSET_BEGINNING if args.from_beginning else OFFSET_END
    consumer.assign([TopicPartition(args.topic, p, start) for p in topic.partitions])
    latest: dict[tuple[str, str, str], tuple[str, float]] = {}  # series -> (node, watts)
    next_print = time.monotonic() + args.every
    # Ctrl-C or a service manager's SIGTERM ends the loop at its next turn (at most 0.2 s),
    # then the consumer is closed: no exception raised wherever the signal lands.
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        while not stop.is_set():
            for message in consumer.consume(1000, timeout=0.2):
                if message.error():
                    print(f"# kafka: {message.error()}", flush=True)
                    continue
                for line in message.value().splitlines():  # a device's readings of one tick
                    reading = json.loads(line)
                    if not reading["metric_id"].endswith("_watt"):
                        continue
                    labels = reading["labels"]
                    node = labels.get("_device_alias") or reading["device_id"]
                    series = (
                        reading["device_id"],
                        reading["metric_id"],
                        str(sorted(labels.items())),
                    )
                    latest[series] = (node, float(reading["value"]))
            if time.monotonic() >= next_print and latest:
                next_print = time.monotonic() + args.every
                per_node: dict[str, float] = {}
                for node, watts in latest.values():
                    per_node[node] = per_node.get(node, 0.0) + watts
                stamp = time.strftime("%H:%M:%S")
                for node in sorted(per_node):
                    print(f"{stamp} {node} {per_node[node]:.2f} W", flush=True)
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
