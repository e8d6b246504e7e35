"""The Kafka topics of jobscope, created idempotently at start."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


READINGS = TopicSpec("readings", 6, {"compression.type": "producer"})
JOBS = TopicSpec("jobs", 1, {"cleanup.policy": "compact"})
ON_DEMAND = TopicSpec("ondemand", 1, {"cleanup.policy": "compact"})
# OAR's job changes from the Debezium connector (connectors/oar-jobs.json): one partition,
# so that they are consumed in commit order.
OAR_CHANGES = TopicSpec("oar-changes", 1)
# Ids of revoked API tokens (api/infra/revocations.py), read whole by every API replica.
TOKEN_REVOCATIONS = TopicSpec("token-revocations", 1, {"cleanup.policy": "compact"})
# Reads of jobs by others than their owners (api/audit.py), stored in ClickHouse's audit_log.
AUDIT = TopicSpec("audit", 1)
JOB_RECORD_MAX_BYTES = 32 * 1024 * 1024
"""The largest batch the job-records topic takes (Kafka's default is 1 MB: the record of a job
of 10,000 series is ~3 MB of JSON; the API bounds a record below this: records_max_bytes)."""
BATCH_OVERHEAD_BYTES = 64 * 1024
"""Room for a batch's framing around one message, however it compresses."""
# Job records (api/records.py), stored in ClickHouse's job_records; keyed by site and job, the
# newest record of a job is enough.
JOB_RECORDS = TopicSpec(
    "job-records",
    1,
    {
        "cleanup.policy": "compact",
        "max.message.bytes": str(JOB_RECORD_MAX_BYTES),
        "compression.type": "producer",
    },
)
ALL_TOPICS = (READINGS, JOBS, ON_DEMAND, OAR_CHANGES, TOKEN_REVOCATIONS, AUDIT, JOB_RECORDS)


def json_readings(name: str) -> TopicSpec:
    """The opt-in JSON copy of the readings topic (kafka/WIRE_FORMAT.md)."""
    return TopicSpec(name, READINGS.partitions, {"compression.type": "producer"})


def ensure_topics(
    bootstrap: str,
    topics: tuple[TopicSpec, ...] = ALL_TOPICS,
    timeout: float = 30.0,
    replication_factor: int = 1,
    min_insync_replicas: int = 1,
    security: Mapping[str, str] | None = None,
) -> None:
    """Create the topics that do not exist yet; existing ones are left as they are.
    `security`: Kafka's credentials (kafka/security.py), for a broker that asks for them."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(security or {})})
    existing = set(admin.list_topics(timeout=timeout).topics)
    replicas = {"min.insync.replicas": str(min_insync_replicas)} if replication_factor > 1 else {}
    missing = [
        NewTopic(
            t.name,
            num_partitions=t.partitions,
            replication_factor=replication_factor,
            config={**t.config, **replicas},
        )
        for t in topics
        if t.name not in existing
    ]
    if not missing:
        return
    for name, future in admin.create_topics(missing, operation_timeout=timeout).items():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise RuntimeError(f"cannot create topic {name}: {exc}") from exc


def consumer_lag(
    bootstrap: str,
    group: str,
    topic: str,
    timeout: float = 10.0,
    security: Mapping[str, str] | None = None,
) -> int:
    """Messages of `topic` that consumer group `group` has not committed yet (a group that
    never committed counts from the start of the topic)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **(security or {}),
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout).topics[topic]
        partitions = [TopicPartition(topic, p) for p in metadata.partitions]
        committed = consumer.committed(partitions, timeout=timeout)
        lag = 0
        for tp in committed:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
            lag += high - (tp.offset if tp.offset >= 0 else low)
        return lag
    finally:
        consumer.close()
