"""A Kafka Connect distributed worker from the broker's Kafka release, as a stack process.

The worker keeps its connectors' configurations, offsets and statuses in three compacted
topics of the cluster it runs against (`_<name>-configs`, `-offsets`, `-status`): a restarted
worker resumes every connector from its last committed offset.

Secrets (a database's password, the worker's own Kafka password) live in one private file
beside the worker's properties, `secrets.properties`; configurations name them through
Connect's FileConfigProvider (`${file:<path>:<key>}`), which the worker resolves when it
uses them, so that neither its properties nor the connector configurations in the configs
topic (which every reader of that topic sees, and the REST API answers) hold any. The REST
API listens on `host` (loopback in the embedded default) only, and answers only its user
`REST_USER` (HTTP basic, Kafka's own extension): without it any local account could register
a connector that names the secrets file and read the passwords out, or write forged jobs.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from pydantic import SecretStr

from connectors import maven
from kafka.security import KafkaClientSettings
from stack import secrets
from stack.config import REPO_ROOT
from stack.processes import ManagedProcess
from stack.transient import STARTING

CONNECTORS_DIR = REPO_ROOT / "connectors"
# One directory per plugin, each filled by Maven from plugins/<plugin>/pom.xml.
PLUGINS = tuple(sorted(p.parent.name for p in (CONNECTORS_DIR / "plugins").glob("*/pom.xml")))
LOG4J_CONFIG = REPO_ROOT / "kafka" / "log4j2.yaml"
# Classpaths and plugin jars by version of their pom, shared by every stack of this clone.
JAR_CACHE = REPO_ROOT / "state" / "connect-jars"
REST_USER = "jobscope"
"""The REST API's one user (every client of it is the project's own)."""
BASIC_AUTH = "org.apache.kafka.connect.rest.basic.auth.extension"


@dataclass(frozen=True)
class Worker:
    """One worker (a Connect cluster of one) known by `name`: its process name, its state
    directory under `state_dir` and the prefix of its group and storage topics."""

    name: str
    state_dir: Path  # the stack's state directory
    bootstrap: str
    rest_port: int
    rest_password: SecretStr
    """The password of the REST API's user `REST_USER`."""
    host: str = "127.0.0.1"
    heap: str = "512m"
    replication_factor: int = 1
    offset_flush_ms: int = 1000  # a restart replays at most this much of a source
    kafka: KafkaClientSettings = field(default_factory=KafkaClientSettings)
    """The worker's Kafka credentials (its bootstrap is `bootstrap`)."""

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

    @property
    def auth(self) -> httpx.BasicAuth:
        """What every request to the REST API sends."""
        return httpx.BasicAuth(REST_USER, self.rest_password.get_secret_value())

    @property
    def credentials_file(self) -> Path:
        """The REST API's user and password (`user: password`), private to the worker."""
        return self.home / "rest-credentials.properties"

    @property
    def jaas_file(self) -> Path:
        """The JVM's login configuration: the basic-auth extension's `KafkaConnect` section."""
        return self.home / "rest-jaas.conf"

    def process(self) -> ManagedProcess:
        return ManagedProcess(self.name, self.state_dir / "pids", self.state_dir / "logs")

    @property
    def secrets_file(self) -> Path:
        return self.home / "secrets.properties"

    def store_secrets(self, values: Mapping[str, str]) -> dict[str, str]:
        """Add `values` to the worker's private secrets file; return the reference to each
        (`${file:<path>:<key>}`), what configurations hold instead."""
        stored = self._stored_secrets()
        stored.update(values)
        self.home.mkdir(parents=True, exist_ok=True)
        secrets.write_private(
            self.secrets_file,
            "".join(f"{key}={escape_property(value)}\n" for key, value in sorted(stored.items())),
        )
        return self.references(values)

    def references(self, keys: Iterable[str]) -> dict[str, str]:
        """The config provider's reference to each key of the secrets file."""
        return {key: f"${{file:{self.secrets_file}:{key}}}" for key in keys}

    def _stored_secrets(self) -> dict[str, str]:
        if not self.secrets_file.exists():
            return {}
        lines = self.secrets_file.read_text().splitlines()
        return {
            key: value.replace("\\\\", "\\")
            for key, _, value in (line.partition("=") for line in lines)
        }

    def render_config(self) -> Path:
        """Write the worker's properties into its state directory (its Kafka password as a
        reference into the secrets file), and its REST API's credentials and login file."""
        reference = None
        if self.kafka.sasl:
            password = self.kafka.kafka_sasl_password.get_secret_value()
            reference = self.store_secrets({"kafka_password": password})["kafka_password"]
        security = self.kafka.java_properties(reference)
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
            "rest.extension.classes": f"{BASIC_AUTH}.BasicAuthSecurityRestExtension",
            "config.providers": "file",
            "config.providers.file.class": (
                "org.apache.kafka.common.config.provider.FileConfigProvider"
            ),
            # the worker's own clients, and those it creates for connectors
            **{
                f"{prefix}{key}": value
                for prefix in ("", "producer.", "consumer.", "admin.")
                for key, value in security.items()
            },
        }
        path = self.home / "worker.properties"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
        password = escape_property(self.rest_password.get_secret_value())
        secrets.write_private(self.credentials_file, f"{REST_USER}: {password}\n")
        secrets.write_private(
            self.jaas_file,
            f"KafkaConnect {{\n  {BASIC_AUTH}.PropertyFileLoginModule required\n"
            f'  file="{self.credentials_file}";\n}};\n',
        )
        return path

    def _fill_plugin_path(self) -> None:
        shutil.rmtree(self.plugin_path, ignore_errors=True)
        self.plugin_path.mkdir(parents=True)
        for plugin in PLUGINS:
            jars = maven.copy_jars(CONNECTORS_DIR / "plugins" / plugin / "pom.xml", JAR_CACHE)
            (self.plugin_path / plugin).symlink_to(jars)

    def is_ready(self) -> bool:
        """The REST API answers and the worker has joined its group (it lists connectors)."""
        response = httpx.get(f"{self.url}/connectors", auth=self.auth, timeout=2)
        if response.status_code == 401:  # another password than the worker's: no use waiting
            response.raise_for_status()
        return response.status_code == 200 and isinstance(response.json(), list)

    def start(self, timeout: float = 120.0) -> None:
        """Start the worker unless it runs; wait until its REST API serves requests."""
        proc = self.process()
        if not proc.is_running():
            self._fill_plugin_path()
            config = self.render_config()
            cp = maven.classpath(CONNECTORS_DIR / "pom.xml", JAR_CACHE)
            proc.start(self.command("java", cp, config), ports=[(self.host, self.rest_port)])
        proc.wait_ready(self.is_ready, timeout, f"Kafka Connect {self.url}", transient=STARTING)

    def command(self, java: str, classpath: str, config: Path) -> list[str]:
        """The worker's command line (`make connect`'s and the service unit's)."""
        return [
            java,
            f"-Xmx{self.heap}",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            f"-Djava.security.auth.login.config={self.jaas_file}",
            "-cp",
            classpath,
            "org.apache.kafka.connect.cli.ConnectDistributed",
            str(config),
        ]

    def stop(self) -> None:
        self.process().stop(timeout=30)

    def kill(self) -> None:
        """kill -9, as a crash would."""
        self.process().kill()


def escape_property(value: str) -> str:
    """A value as a Java properties file reads it back (backslash is its escape)."""
    return value.replace("\\", "\\\\")
