"""`python -m stack.create_topics`: create jobscope's Kafka topics on an existing cluster
(the chart's schema Job); existing topics are left as they are."""

from __future__ import annotations

import sys

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from stack import topics


class TopicSettings(BaseSettings):
    """Each setting is read from `JOBSCOPE_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    json_topic: str = Field("", description="the opt-in JSON copy of the readings; empty: none")
    kafka_replication_factor: int = Field(1, ge=1)
    kafka_min_insync_replicas: int = Field(1, ge=1)
    readings_partitions: int = Field(
        topics.READINGS.partitions, ge=1, description="partitions of the readings topic"
    )


def main() -> int:
    settings = TopicSettings()
    readings = topics.TopicSpec(
        topics.READINGS.name, settings.readings_partitions, topics.READINGS.config
    )
    wanted = [readings, topics.JOBS, topics.ON_DEMAND, topics.OAR_CHANGES]
    if settings.json_topic:
        json_copy = topics.json_readings(settings.json_topic)
        wanted.append(topics.TopicSpec(json_copy.name, readings.partitions, json_copy.config))
    topics.ensure_topics(
        settings.kafka_bootstrap,
        tuple(wanted),
        replication_factor=settings.kafka_replication_factor,
        min_insync_replicas=settings.kafka_min_insync_replicas,
    )
    print(f"topics present: {', '.join(t.name for t in wanted)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
