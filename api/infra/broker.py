"""The Kafka broker's state for Prometheus, read with the admin API when scraped (at most once
per `cache_s`): brokers, partitions per topic, those under-replicated or without a leader,
and each consumer group's lag.

Kafka's own metrics are JMX beans; the Prometheus JMX exporter (a javaagent) is not among the
jars this project can resolve, so the figures an operator alerts on are computed from what
any client may ask the cluster, with the API's Kafka credentials. Served on the API's
/metrics: every deployment runs the API, embedded or on Kubernetes alike.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)
PREFIX = "jobscope_kafka_"


def _gauge(name: str, documentation: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, documentation, labels=list(labels))


class BrokerCollector(Collector):
    """`jobscope_kafka_up` is 0 when the cluster did not answer within `timeout_s` (the other
    series are then left out, so no alert reads a stale lag as current)."""

    def __init__(self, client: Mapping[str, Any], cache_s: float, timeout_s: float) -> None:
        self._client = dict(client)
        self._cache_s = cache_s
        self._timeout_s = timeout_s
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()
        self._last: tuple[float, list[Metric]] = (-float("inf"), [])

    def collect(self) -> Iterable[Metric]:
        """The cached figures, read again once `cache_s` old; a scrape arriving while another
        reads them gets the last ones at once, never a thread waiting on a slow cluster."""
        at, metrics = self._last
        if time.monotonic() - at < self._cache_s or not self._lock.acquire(blocking=False):
            return metrics
        try:
            metrics = self._read()
            self._last = (time.monotonic(), metrics)
        finally:
            self._lock.release()
        return metrics

    def _read(self) -> list[Metric]:
        up = _gauge("up", "1 when the Kafka cluster answered the API's admin requests")
        try:
            metrics = [*self._cluster(), self._lags()]
        except (KafkaException, TimeoutError) as exc:
            log.warning("Kafka metrics: the cluster did not answer: %s", exc)
            self._admin = None  # a new client at the next scrape
            up.add_metric([], 0)
            return [up]
        up.add_metric([], 1)
        return [up, *metrics]

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({**self._client, "log_level": 3})
        return self._admin

    def _cluster(self) -> list[Metric]:
        metadata = self._admin_client().list_topics(timeout=self._timeout_s)
        brokers = _gauge("brokers", "brokers the cluster's metadata lists")
        brokers.add_metric([], len(metadata.brokers))
        partitions = _gauge("topic_partitions", "partitions of a topic", ["topic"])
        under = _gauge(
            "under_replicated_partitions",
            "partitions of a topic with fewer in-sync replicas than replicas",
            ["topic"],
        )
        offline = _gauge("offline_partitions", "partitions of a topic without a leader", ["topic"])
        for name, topic in sorted(metadata.topics.items()):
            parts = topic.partitions.values()
            partitions.add_metric([name], len(parts))
            under.add_metric([name], sum(len(p.isrs) < len(p.replicas) for p in parts))
            offline.add_metric([name], sum(p.leader < 0 for p in parts))
        return [brokers, partitions, under, offline]

    def _lags(self) -> Metric:
        """Per group with committed offsets: messages after them, up to each partition's end."""
        admin = self._admin_client()
        lag = _gauge(
            "consumer_group_lag",
            "messages not yet committed by a consumer group, over the partitions it committed",
            ["group"],
        )
        listed = admin.list_consumer_groups(request_timeout=self._timeout_s).result()
        for group in sorted(g.group_id for g in listed.valid):
            request = [ConsumerGroupTopicPartitions(group)]
            (future,) = admin.list_consumer_group_offsets(
                request, request_timeout=self._timeout_s
            ).values()
            committed = [tp for tp in future.result().topic_partitions if tp.offset >= 0]
            if not committed:
                continue
            ends = admin.list_offsets(
                {TopicPartition(tp.topic, tp.partition): OffsetSpec.latest() for tp in committed},
                request_timeout=self._timeout_s,
            )
            end = {(tp.topic, tp.partition): f.result().offset for tp, f in ends.items()}
            lag.add_metric(
                [group], sum(max(0, end[(tp.topic, tp.partition)] - tp.offset) for tp in committed)
            )
        return lag
