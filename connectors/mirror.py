"""MirrorMaker 2 copying each site's readings, jobs and OAR changes topics into a central
cluster.

Dedicated mode (`org.apache.kafka.connect.mirror.MirrorMaker`, from the Connect worker's
jars): one process, one properties file, no connector to register. Its
DefaultReplicationPolicy names a copy `<site>.<topic>` (`nancy.readings`), the prefix from
which the central ClickHouse derives every reading's and job's site
(clickhouse/migrations/0018_site_from_topic.sql; JOBSCOPE_SITES lists the same sites).
MirrorMaker keeps its offsets in the central cluster (`mm2-offsets.<site>.internal`): a
restart resumes where it stopped. `python -m connectors.mirror` runs it in the foreground.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from clickhouse.migrate import SiteName
from connectors import maven
from connectors.worker import CONNECTORS_DIR, JAR_CACHE, LOG4J_CONFIG, escape_property
from kafka.security import KafkaClientSettings
from kafka.topics import JOBS, OAR_CHANGES, READINGS
from stack import secrets
from stack.config import REPO_ROOT
from stack.processes import ManagedProcess
from stack.transient import KAFKA_STARTING

MAIN = "org.apache.kafka.connect.mirror.MirrorMaker"


class MirrorSettings(BaseSettings):
    """Env vars `JOBSCOPE_MIRROR_<NAME>`, e.g. `JOBSCOPE_MIRROR_SITES='{"nancy":
    "kafka.nancy:9092", "lyon": "kafka.lyon:9092"}'`."""

    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_MIRROR_", extra="ignore")

    sites: dict[SiteName, str] = Field(
        min_length=1, description="each site's name (its topics' prefix) and Kafka bootstrap"
    )
    central: str = Field("127.0.0.1:9092", description="the central cluster's bootstrap")
    central_name: SiteName = Field(
        "central", description="the central cluster's alias in MirrorMaker's configuration"
    )
    topics: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: [t.name for t in (READINGS, JOBS, OAR_CHANGES)],
        description="the topics copied from every site, comma-separated (each site's jobs "
        "from its scheduler hooks and from change data capture)",
    )
    replication_factor: int = Field(1, ge=1, description="of the copies and internal topics")
    refresh_topics_s: int = Field(
        30, ge=1, description="how often a new or grown source topic is noticed"
    )
    credentials: dict[SiteName, KafkaClientSettings] = Field(
        default_factory=dict,
        description="per cluster (a site's name or central_name), how MirrorMaker logs in "
        'there (kafka/security.py\'s fields, e.g. `{"nancy": {"kafka_security_protocol": '
        '"SASL_SSL", "kafka_sasl_username": ..., "kafka_sasl_password": ..., '
        '"kafka_ssl_ca_file": ...}}`); a cluster not named: no authentication. The '
        "passwords go to a private file that the properties name (FileConfigProvider)",
    )
    heap: str = Field("256m", description="JVM heap of MirrorMaker")
    state_dir: Path = Field(REPO_ROOT / "state", description="config, PID and log go here")

    @field_validator("topics", mode="before")
    @classmethod
    def _split_topics(cls, value: object) -> object:
        return (
            [t.strip() for t in value.split(",") if t.strip()] if isinstance(value, str) else value
        )

    def mirrored(self) -> list[str]:
        """The copies in the central cluster: `<site>.<topic>` for every site and topic."""
        return [f"{site}.{topic}" for site in self.sites for topic in self.topics]

    @property
    def secrets_file(self) -> Path:
        return self.state_dir / "mirrormaker" / "secrets.properties"

    def central_client(self) -> dict[str, str]:
        """librdkafka's configuration of a client of the central cluster."""
        central = self.credentials.get(self.central_name)
        return {"bootstrap.servers": self.central, **(central.kafka_security() if central else {})}

    def _security(self) -> dict[str, str]:
        """Each cluster's security properties, passwords named in `secrets_file`."""
        if not self.credentials:
            return {}
        values = {
            "config.providers": "file",
            "config.providers.file.class": (
                "org.apache.kafka.common.config.provider.FileConfigProvider"
            ),
        }
        for alias, client in self.credentials.items():
            reference = f"${{file:{self.secrets_file}:{alias}.password}}"
            for key, value in client.java_properties(reference).items():
                values[f"{alias}.{key}"] = value
        return values

    def properties(self) -> dict[str, str]:
        """MirrorMaker's configuration: one flow per site into the central cluster (with its
        heartbeats, `<site>.heartbeats`; no consumer-group offsets or ACLs copied)."""
        rf = str(self.replication_factor)
        values = {
            "clusters": ", ".join([*self.sites, self.central_name]),
            f"{self.central_name}.bootstrap.servers": self.central,
            "replication.factor": rf,
            "refresh.topics.interval.seconds": str(self.refresh_topics_s),
            "sync.group.offsets.enabled": "false",
            "sync.topic.acls.enabled": "false",
            # compaction of `jobs` and the readings' retention follow the source's
            "sync.topic.configs.enabled": "true",
            "offset.flush.interval.ms": "1000",  # a restart copies at most ~1 s again
        }
        internal_topics = ("heartbeats.topic", "checkpoints.topic", "offset-syncs.topic")
        for internal in (*internal_topics, "offset.storage", "config.storage", "status.storage"):
            values[f"{internal}.replication.factor"] = rf
        for site, bootstrap in self.sites.items():
            values[f"{site}.bootstrap.servers"] = bootstrap
            values[f"{site}->{self.central_name}.enabled"] = "true"
            values[f"{site}->{self.central_name}.topics"] = ",".join(self.topics)
        return {**values, **self._security()}


class MirrorMaker:
    """The MirrorMaker 2 process of `settings` (a stack process named `mirrormaker`)."""

    def __init__(self, settings: MirrorSettings) -> None:
        self.settings = settings
        self.home = settings.state_dir / "mirrormaker"

    def process(self) -> ManagedProcess:
        return ManagedProcess(
            "mirrormaker", self.settings.state_dir / "pids", self.settings.state_dir / "logs"
        )

    def render_config(self) -> Path:
        """The properties file, and beside it the private file of the passwords it names."""
        path = self.home / "mm2.properties"
        path.parent.mkdir(parents=True, exist_ok=True)
        credentials = self.settings.credentials.items()
        if credentials:
            secrets.write_private(
                self.settings.secrets_file,
                "".join(
                    f"{alias}.password={escape_property(c.kafka_sasl_password.get_secret_value())}\n"
                    for alias, c in credentials
                ),
            )
        lines = (f"{key}={value}\n" for key, value in self.settings.properties().items())
        path.write_text("".join(lines))
        return path

    def command(self) -> list[str]:
        classpath = maven.classpath(CONNECTORS_DIR / "pom.xml", JAR_CACHE)
        return [
            "java",
            f"-Xmx{self.settings.heap}",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "-cp",
            classpath,
            MAIN,
            str(self.render_config()),
            "--clusters",
            self.settings.central_name,
        ]

    def copies_exist(self) -> bool:
        """Every `<site>.<topic>` copy exists in the central cluster."""
        admin = AdminClient({**self.settings.central_client(), "log_level": 0})
        existing = set(admin.list_topics(timeout=5).topics)
        return set(self.settings.mirrored()) <= existing

    def task_states(self, site: str) -> dict[str, str]:
        """The newest state of each task of `site`'s flow, by task (`MirrorSourceConnector-0`),
        as MirrorMaker records them in its status topic at the centre."""
        topic = f"mm2-status.{site}.internal"
        consumer = Consumer(
            {
                **self.settings.central_client(),
                "group.id": "jobscope-mirror-status",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        try:
            partitions = consumer.list_topics(topic, timeout=5).topics[topic].partitions
            ends = {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
                for p in partitions
            }
            ends = {p: end for p, end in ends.items() if end > 0}
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
            states: dict[str, str] = {}
            while ends:
                message = consumer.poll(5)
                if message is None:
                    raise TimeoutError(f"{topic} not read to its end")
                if message.error():
                    continue
                key = (message.key() or b"").decode()
                if key.startswith("status-task-") and message.value():
                    states[key.removeprefix("status-task-")] = json.loads(message.value())["state"]
                if message.offset() + 1 >= ends.get(message.partition(), 0):
                    ends.pop(message.partition(), None)
            return states
        finally:
            consumer.close()

    def copying(self) -> bool:
        """Every site's copy tasks run (MirrorMaker creates the copies before they start)."""
        for site in self.settings.sites:
            tasks = self.task_states(site)
            copiers = [s for task, s in tasks.items() if task.startswith("MirrorSourceConnector")]
            if not copiers or any(state != "RUNNING" for state in copiers):
                return False
        return True

    def start(self, timeout: float = 180.0) -> None:
        """Start MirrorMaker unless it runs; wait until it has created every copy and its
        copy tasks run."""
        proc = self.process()
        if not proc.is_running():
            proc.start(self.command())
        proc.wait_ready(
            lambda: self.copies_exist() and self.copying(),
            timeout,
            f"MirrorMaker copying into {', '.join(self.settings.mirrored())}",
            0.5,
            KAFKA_STARTING,
        )

    def stop(self) -> None:
        self.process().stop(timeout=30)


def main() -> int:
    """Run MirrorMaker in the foreground with the settings from the environment."""
    mirror = MirrorMaker(MirrorSettings())  # type: ignore[call-arg]
    command = mirror.command()
    os.execvp(command[0], command)
    return 1


if __name__ == "__main__":
    sys.exit(main())
