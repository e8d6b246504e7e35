"""`python -m stack.create_topics`: create jobscope's Kafka topics on an existing cluster
(the chart's schema Job); existing topics are left as they are."""

from __future__ import annotations

import sys
from dataclasses import replace

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from kafka import topics
from kafka.security import KafkaClientSettings


class TopicSettings(KafkaClientSettings):
    """Each setting is read from `JOBSCOPE_<NAME>` (Kafka's address and credentials:
    kafka/security.py)."""

    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_", extra="ignore")

    json_topic: str = Field("", description="the opt-in JSON copy of the readings; empty: none")
    kafka_replication_factor: int = Field(1, ge=1)
    kafka_min_insync_replicas: int = Field(1, ge=1)
    readings_partitions: int = Field(
        topics.READINGS.partitions, ge=1, description="partitions of the readings topic"
    )


def main() -> int:
    settings = TopicSettings()
    optional = (topics.json_readings(settings.json_topic),) if settings.json_topic else ()
    readings = (topics.READINGS, *optional)  # with this cluster's partitions
    wanted = tuple(
        replace(t, partitions=settings.readings_partitions) if t in readings else t
        for t in (*topics.ALL_TOPICS, *optional)
    )
    topics.ensure_topics(
        settings.kafka_bootstrap,
        wanted,
        replication_factor=settings.kafka_replication_factor,
        min_insync_replicas=settings.kafka_min_insync_replicas,
        security=settings.kafka_security(),
    )
    print(f"topics present: {', '.join(t.name for t in wanted)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
