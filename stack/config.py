"""Settings of the embedded default (`make up`): where state lives and where each part listens."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_home() -> Path:
    """Where what is built once per user lives (Keycloak, Superset's initialised metadata):
    the user's cache directory, as pip's and Maven's caches."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jobscope"


class StackSettings(BaseSettings):
    """Every value can be set by an environment variable `JOBSCOPE_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_", extra="ignore")

    state_dir: Path = Field(REPO_ROOT / "state", description="data, logs, PIDs and secrets")
    host: str = Field("127.0.0.1", description="every local service binds to this address")
    kafka_port: int = Field(
        9092, description="the first broker's client listener (node i: this + 2(i-1))"
    )
    kafka_controller_port: int = Field(
        9093, description="the first broker's KRaft controller listener (node i: this + 2(i-1))"
    )
    kafka_heap: str = Field("1g", description="JVM heap of the broker")
    kafka_brokers: int = Field(
        1,
        ge=1,
        le=9,
        description="KRaft nodes (broker and controller each) on consecutive port pairs from "
        "kafka_port / kafka_controller_port; 3: topics replicated 3 times, 2 in sync",
    )
    kafka_broker_session_timeout_ms: int = Field(
        9000,
        ge=1000,
        description="a node that stops heartbeating (killed, frozen) is fenced after this and "
        "its partitions get new leaders (Kafka's default); nodes heartbeat every quarter of "
        "it, at most every 2 s",
    )
    kafka_sasl: bool | None = Field(
        None,
        description="brokers that authenticate every client (SCRAM-SHA-512, a user per "
        "component, passwords in secrets.env; `make up` sets it unless KAFKA_SASL=false); "
        "unset: as this state directory's brokers were last started, a new one without",
    )
    clickhouse_port: int = Field(
        8123,
        description="the local ClickHouse server's HTTP port",
    )
    clickhouse_account: str = Field(
        "jobscope-clickhouse",
        description="when the stack starts as root: the system account the ClickHouse server "
        "runs as (created with useradd if missing), which can write only the engine's own "
        "files of the state directory; empty: root. A non-root stack runs it as its own user",
    )
    api_port: int = Field(8000, description="the REST API's port")
    producer_metrics_port: int = Field(
        9464, description="the producers' Prometheus /metrics (plus the shard index)"
    )
    devices_file: Path = Field(
        REPO_ROOT / "producers" / "config" / "demo.yaml",
        description="device configuration the demo producer polls",
    )
    simulators: bool = Field(
        False,
        description="also run the simulated devices the sample devices files poll, and a "
        "Prometheus remote-writing a simulated dcgm-exporter's GPU metrics to the API "
        "(`make up DEVICES=sample`; stack/simulators/)",
    )
    auth: Literal["tokens", "oidc"] = Field(
        "tokens",
        description="who the API trusts: jobscope's own tokens; oidc: also a local OpenID "
        "Connect provider with demo users (`make up AUTH=oidc`: stack/oidc_provider.py)",
    )
    json_topic: str = Field(
        "",
        max_length=249,
        pattern=r"^[a-zA-Z0-9._-]*$",  # Kafka's legal topic names
        description="the producers and the API also write every reading as JSON lines to this "
        "topic (`make up JSON_TOPIC=1` sets readings-json); empty: off",
    )
    retention_days: int = Field(
        90,
        ge=1,
        le=20000,
        # Bounded: past the year 2106 the TTL date wraps around and every row would expire.
        description="TTL of raw readings in days",
    )

    @property
    def kafka_bootstrap(self) -> str:
        """Every broker's address: a client reaches the cluster while one is down."""
        nodes = range(1, self.kafka_brokers + 1)
        return ",".join(f"{self.host}:{self.kafka_node_ports(n)[0]}" for n in nodes)

    def kafka_node_ports(self, node_id: int) -> tuple[int, int]:
        """The broker and controller ports of KRaft node `node_id` (1..kafka_brokers)."""
        shift = 2 * (node_id - 1)
        return self.kafka_port + shift, self.kafka_controller_port + shift

    @property
    def kafka_broker_heartbeat_interval_ms(self) -> int:
        """Kafka's default (2 s) for the default session, a quarter of a shorter one."""
        return min(2000, self.kafka_broker_session_timeout_ms // 4)

    @property
    def kafka_replication_factor(self) -> int:
        return min(3, self.kafka_brokers)

    @property
    def kafka_min_insync_replicas(self) -> int:
        """2 of 3 replicas: a write acknowledged by all in-sync ones survives a broker loss."""
        return 2 if self.kafka_replication_factor >= 3 else 1

    @property
    def clickhouse_url(self) -> str:
        return f"http://{self.host}:{self.clickhouse_port}"

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.api_port}"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def pid_dir(self) -> Path:
        return self.state_dir / "pids"
