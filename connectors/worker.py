"""A Kafka Connect distributed worker from the broker's Kafka release, as a stack process.

The worker keeps its connectors' configurations, offsets and statuses in three compacted
topics of the cluster it runs against (`_<name>-configs`, `-offsets`, `-status`): a restarted
worker resumes every connector from its last committed offset.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from connectors import maven
from stack.config import REPO_ROOT
from stack.processes import ManagedProcess, wait_until

CONNECTORS_DIR = REPO_ROOT / "connectors"
# One directory per plugin, each filled by Maven from plugins/<plugin>/pom.xml.
PLUGINS = tuple(sorted(p.parent.name for p in (CONNECTORS_DIR / "plugins").glob("*/pom.xml")))
LOG4J_CONFIG = REPO_ROOT / "kafka" / "log4j2.yaml"
# Classpaths and plugin jars by version of their pom, shared by every stack of this clone.
JAR_CACHE = REPO_ROOT / "state" / "connect-jars"


@dataclass(frozen=True)
class Worker:
    """One worker (a Connect cluster of one) known by `name`: its process name, its state
    directory under `state_dir` and the prefix of its group and storage topics."""

    name: str
    state_dir: Path  # the stack's state directory
    bootstrap: str
    rest_port: int
    host: str = "127.0.0.1"
    heap: str = "512m"
    replication_factor: int = 1
    offset_flush_ms: int = 1000  # a restart replays at most this much of a source

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.rest_port}"

    @property
    def home(self) -> Path:
        return self.state_dir / self.name

    @property
    def plugin_path(self) -> Path:
        """A directory holding a link to each plugin's directory of jars."""
        return self.home / "plugins"

    def process(self) -> ManagedProcess:
        return ManagedProcess(self.name, self.state_dir / "pids", self.state_dir / "logs")

    def render_config(self) -> Path:
        """Write the worker's properties into its state directory."""
        values = {
            "bootstrap.servers": self.bootstrap,
            "group.id": f"jobscope-{self.name}",
            "listeners": self.url,
            "rest.advertised.host.name": self.host,
            "rest.advertised.port": self.rest_port,
            "config.storage.topic": f"_{self.name}-configs",
            "offset.storage.topic": f"_{self.name}-offsets",
            "status.storage.topic": f"_{self.name}-status",
            "config.storage.replication.factor": self.replication_factor,
            "offset.storage.replication.factor": self.replication_factor,
            "status.storage.replication.factor": self.replication_factor,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "false",
            "value.converter.schemas.enable": "false",
            "offset.flush.interval.ms": self.offset_flush_ms,
            "plugin.path": self.plugin_path,
            "plugin.discovery": "hybrid_warn",
        }
        path = self.home / "worker.properties"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
        return path

    def _fill_plugin_path(self) -> None:
        shutil.rmtree(self.plugin_path, ignore_errors=True)
        self.plugin_path.mkdir(parents=True)
        for plugin in PLUGINS:
            jars = maven.copy_jars(CONNECTORS_DIR / "plugins" / plugin / "pom.xml", JAR_CACHE)
            (self.plugin_path / plugin).symlink_to(jars)

    def is_ready(self) -> bool:
        """The REST API answers and the worker has joined its group (it lists connectors)."""
        with urllib.request.urlopen(f"{self.url}/connectors", timeout=2) as response:
            return response.status == 200 and isinstance(json.load(response), list)

    def start(self, timeout: float = 120.0) -> None:
        """Start the worker unless it runs; wait until its REST API serves requests."""
        proc = self.process()
        if not proc.is_running():
            self._fill_plugin_path()
            config = self.render_config()
            cp = maven.classpath(CONNECTORS_DIR / "pom.xml", JAR_CACHE)
            proc.start(
                [
                    "java",
                    f"-Xmx{self.heap}",
                    f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                    "-cp",
                    cp,
                    "org.apache.kafka.connect.cli.ConnectDistributed",
                    str(config),
                ],
                ports=[(self.host, self.rest_port)],
            )
        wait_until(
            lambda: self.is_ready() or not proc.is_running(), timeout, f"Kafka Connect {self.url}"
        )
        if not proc.is_running():
            raise RuntimeError(f"Kafka Connect {self.name} exited: see {proc.log_file}")

    def stop(self) -> None:
        self.process().stop(timeout=30)

    def kill(self) -> None:
        """kill -9, as a crash would."""
        self.process().kill()
