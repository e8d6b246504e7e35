"""The errors of a server that is still starting (or restarting), for `wait_until`'s
`transient=`: a polled check retries them, and fails at once on any other.

Apart from stack/processes.py so that a process importing only that one (the device
simulators) does not load httpx, librdkafka and clickhouse_connect at start.
"""

from __future__ import annotations

import httpx
from clickhouse_connect.driver.exceptions import OperationalError
from confluent_kafka import KafkaException

STARTING: tuple[type[Exception], ...] = (OSError, httpx.TransportError)
"""A TCP or HTTP server still starting: refused, reset or timed-out connections (urllib's and
requests' errors are OSErrors; httpx's are its TransportError)."""
KAFKA_STARTING: tuple[type[Exception], ...] = (*STARTING, KafkaException)
"""A Kafka broker (or its group coordinator) still starting, as well as `STARTING`."""
CLICKHOUSE_STARTING: tuple[type[Exception], ...] = (*STARTING, OperationalError)
"""ClickHouse's HTTP interface not answering yet (clickhouse_connect's OperationalError)."""
