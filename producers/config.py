"""Typed configuration of the producers: the devices file and the service settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, Field, ValidationError
from pydantic_settings import NoDecode, SettingsConfigDict

from kafka import topics
from kafka.security import KafkaClientSettings
from producers.entry import DeviceEntry
from producers.plugins import plugin_for
from producers.plugins.base import validation_message
from producers.sharding import Shard

DEMO_DEVICES = Path(__file__).resolve().parent / "config" / "demo.yaml"


class ConfigError(ValueError):
    """A devices file that cannot be used; the message names every bad entry and field."""


def load_devices(path: Path) -> list[DeviceEntry]:
    """Read and validate the device entries of a YAML file, or of every file of a directory
    (Kwollect's `metrics_dir`, read in name order). A file holds a list of entries, one
    entry (a mapping), or nothing; plugin options are checked too.

    Raises ConfigError naming each bad entry by file, position (1-based), line and device_id.
    """
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    entries: list[DeviceEntry] = []
    errors: list[str] = []
    # An entry is one series per metric: the same name on one device is allowed only with
    # other labels (a PDU's outlets: `outlet`, `_device_alias`).
    first_seen: dict[tuple[str, str, frozenset[tuple[str, str]]], str] = {}
    for file in files:
        try:
            items = _yaml_items(file)
        except ConfigError as exc:
            errors.append(str(exc))
            continue
        for index, (item, line) in enumerate(items, start=1):
            where = _where(file, index, line, item)
            try:
                entry = DeviceEntry.model_validate(item)
                plugin_for(entry.url).check(entry)
            except ValidationError as exc:
                errors.append(f"{where}: {validation_message(exc)}")
                continue
            except ValueError as exc:
                errors.append(f"{where}: url: {exc}")
                continue
            key = (entry.device_id, entry.name, frozenset(entry.labels.items()))
            if key in first_seen:
                errors.append(
                    f"{where}: name: {entry.name} of {entry.device_id} with these labels is "
                    f"already defined by {first_seen[key]}"
                )
                continue
            first_seen[key] = f"{file.name} entry {index}"
            entries.append(entry)
    if errors:
        raise ConfigError("\n".join(errors))
    if not entries:
        raise ConfigError(f"{path}: no device entries")
    return entries


def _where(path: Path, index: int, line: int, item: Any) -> str:
    """`devices.yaml entry 3 (line 12, device_id=node-4)`: how errors name an entry."""
    device_id = item.get("device_id") if isinstance(item, dict) else None
    return f"{path} entry {index} (line {line}" + (
        f", device_id={device_id})" if device_id is not None else ")"
    )


def _yaml_items(path: Path) -> list[tuple[Any, int]]:
    """The entries of the YAML file `path` (a list, one mapping, or empty), each with the
    line where it starts."""
    loader = yaml.SafeLoader(path.read_text())
    try:
        root = loader.get_single_node()
        if root is None or (isinstance(root, yaml.ScalarNode) and root.tag.endswith(":null")):
            return []
        if isinstance(root, yaml.MappingNode):
            return [(loader.construct_document(root), root.start_mark.line + 1)]
        if not isinstance(root, yaml.SequenceNode):
            raise ConfigError(f"{path}: expected a list of device entries or one entry")
        lines = [node.start_mark.line + 1 for node in root.value]
        return list(zip(loader.construct_document(root), lines, strict=True))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _shard(value: object) -> object:
    return Shard.parse(value) if isinstance(value, str) else value


class ProducerSettings(KafkaClientSettings):
    """Settings of `python -m producers`; each one is also read from `JOBSCOPE_<NAME>`
    (Kafka's address and credentials: kafka/security.py)."""

    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_", extra="forbid")

    readings_topic: str = Field(
        topics.READINGS.name,
        min_length=1,
        description="topic the readings are published to (kafka/topics.py)",
    )
    json_topic: str = Field(
        "",
        description="also publish each message's readings as JSON lines to this topic "
        "(kafka/WIRE_FORMAT.md); empty: off",
    )
    ondemand_topic: str = Field(
        topics.ON_DEMAND.name, min_length=1, description="compacted topic of on-demand activations"
    )
    ondemand_max_pattern_chars: int = Field(
        4096,
        gt=0,
        description="an on-demand activation whose metrics regex is longer is refused "
        "(logged, counted as activations_refused)",
    )
    shard: Annotated[Shard, NoDecode, BeforeValidator(_shard)] = Field(
        Shard(0, 1),
        description="i/N: poll only the devices shard i of N owns (producers/sharding.py)",
    )
    metrics_port: int = Field(
        9464,
        ge=0,
        le=65535,
        description="port of the Prometheus /metrics endpoint, plus the shard index; 0: none",
    )
    metrics_host: str = Field("127.0.0.1", description="address the /metrics endpoint binds")
    self_interval_s: float = Field(
        10.0, gt=0, description="period of the jobscope-producer-<shard> readings"
    )
    devices_file: Path = Field(
        DEMO_DEVICES, description="YAML file of device entries, or a directory of them"
    )
    linger_ms: int = Field(20, ge=0, description="how long a message may wait for its batch")
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        "lz4", description="compression of the producer's Kafka batches"
    )
    # When Kafka is away (producers/publisher.py, producers/spool.py): messages handed to the
    # client are retried until delivered; the others wait in memory, then in the spool.
    inflight_max_messages: int = Field(
        10_000,
        ge=1,
        le=100_000,
        description="messages handed to the Kafka client and not yet acknowledged, at most",
    )
    memory_queue_max_bytes: int = Field(
        64 << 20,
        ge=0,
        description="payload bytes of the messages waiting in memory for the client; past "
        "it, the oldest ones move to the spool",
    )
    spool_dir: Path | None = Field(
        None,
        description="the disk spool of this process (one per process); default: "
        "<spool_root>/<topic>@<bootstrap>-shard-<i>-of-<N>",
    )
    spool_root: Path = Field(
        DEMO_DEVICES.parents[2] / "state" / "producer-spool",
        description="where the default spool folders are (make up: state/producer-spool)",
    )
    spool_max_bytes: int = Field(
        1 << 30,
        ge=0,
        description="size bound of the spool; when it is full, the oldest messages still "
        "in memory are dropped (counted and logged)",
    )
    spool_segment_bytes: int = Field(
        16 << 20,
        ge=1 << 10,
        le=256 << 20,
        description="size of the spool's files; a file is deleted once all its messages "
        "are delivered",
    )

    @property
    def spool_path(self) -> Path:
        """`spool_dir`, or one named after where the messages go, so that two stacks or two
        shards never share one (it holds messages for that topic of that cluster only)."""
        if self.spool_dir is not None:
            return self.spool_dir
        cluster = re.sub(r"[^\w.-]", "_", self.kafka_bootstrap)
        topic = re.sub(r"[^\w.-]", "_", self.readings_topic)
        name = f"{topic}@{cluster}-shard-{self.shard.index}-of-{self.shard.count}"
        return self.spool_root / name

    poll_timeout_ratio: float = Field(
        0.8,
        gt=0,
        le=1,
        description="share of its period a poll may take, counted from its tick; a poll "
        "still running then is cancelled and that device has no readings that tick",
    )
    stats_interval_s: float = Field(30.0, gt=0, description="period of the counters log line")
    shutdown_timeout_s: float = Field(
        10.0, ge=0, description="how long shutdown waits for deliveries"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="least severity logged (to stderr)"
    )
