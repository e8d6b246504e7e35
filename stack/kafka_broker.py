"""The KRaft Kafka brokers of the embedded default, run from Maven-resolved jars.

One broker (node 1, process `kafka`, state in `kafka/`) by default; JOBSCOPE_KAFKA_BROKERS=N
adds nodes 2..N (processes `kafka-<id>`, state in `kafka-<id>/`), each a broker and a
controller of one quorum, node i on the ports after node i-1's (`kafka_port + 2(i-1)` and
`kafka_controller_port + 2(i-1)`).
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from stack.config import REPO_ROOT, StackSettings
from stack.processes import ManagedProcess, wait_until

KAFKA_DIR = REPO_ROOT / "kafka"


def classpath(settings: StackSettings) -> str:
    """Resolve the broker jars with Maven (cached in ~/.m2) and return the classpath."""
    pom = KAFKA_DIR / "pom.xml"
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    cp_file = settings.state_dir / "kafka" / f"classpath-{digest}.txt"
    if not cp_file.exists():
        if shutil.which("mvn") is None:
            raise RuntimeError("Maven (mvn) is required to resolve the Kafka jars")
        cp_file.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "-Dstyle.color=never",
                "-f",
                str(pom),
                "dependency:build-classpath",
                "-DincludeScope=runtime",
                f"-Dmdep.outputFile={cp_file}",
            ],
            check=True,
        )
    return cp_file.read_text().strip()


@dataclass(frozen=True)
class BrokerNode:
    """One KRaft node (broker and controller) of the stack."""

    node_id: int
    name: str  # its process name
    state: Path  # its configuration and log directory
    port: int
    controller_port: int


def nodes(settings: StackSettings) -> list[BrokerNode]:
    return [node(settings, node_id) for node_id in range(1, settings.kafka_brokers + 1)]


def node(settings: StackSettings, node_id: int) -> BrokerNode:
    name = "kafka" if node_id == 1 else f"kafka-{node_id}"
    return BrokerNode(node_id, name, settings.state_dir / name, *settings.kafka_node_ports(node_id))


def render_config(settings: StackSettings, node_id: int = 1) -> Path:
    """Write server.properties of node `node_id` into the state directory."""
    this = node(settings, node_id)
    text = (KAFKA_DIR / "broker.properties.in").read_text()
    for key, value in {
        "NODE_ID": str(node_id),
        "HOST": settings.host,
        "PORT": str(this.port),
        "CONTROLLER_PORT": str(this.controller_port),
        "CONTROLLERS": ",".join(f"{settings.host}:{n.controller_port}" for n in nodes(settings)),
        "REPLICATION_FACTOR": str(settings.kafka_replication_factor),
        "MIN_INSYNC_REPLICAS": str(settings.kafka_min_insync_replicas),
        "LOG_DIRS": str(this.state / "data"),
    }.items():
        text = text.replace(f"@{key}@", value)
    path = this.state / "server.properties"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _java(settings: StackSettings, heap: str, main: str, *args: str) -> list[str]:
    return [
        "java",
        f"-Xmx{heap}",
        f"-Dlog4j2.configurationFile={KAFKA_DIR / 'log4j2.yaml'}",
        "-cp",
        classpath(settings),
        main,
        *args,
    ]


def format_storage(settings: StackSettings, config: Path, node_id: int = 1) -> None:
    """Format node `node_id`'s KRaft log directory once; a formatted one is kept as it is."""
    if (node(settings, node_id).state / "data" / "meta.properties").exists():
        return
    cluster_id = _stack_cluster_id(settings)
    if settings.kafka_brokers == 1:
        quorum = "--standalone"
    else:  # every node formats with the same initial voters (id@host:port:directory id)
        voters = (
            f"{n.node_id}@{settings.host}:{n.controller_port}:{_directory_id(cluster_id, n)}"
            for n in nodes(settings)
        )
        quorum = f"--initial-controllers={','.join(voters)}"
    subprocess.run(
        _java(
            settings,
            "256m",
            "kafka.tools.StorageTool",
            "format",
            # one argument: an id may start with "-" (base64), which would read as an option
            f"--cluster-id={cluster_id}",
            "-c",
            str(config),
            quorum,
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _stack_cluster_id(settings: StackSettings) -> str:
    """The cluster id every node of this stack formats with, drawn once."""
    path = settings.state_dir / "kafka" / "cluster.id"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_cluster_id())
    return path.read_text().strip()


def _directory_id(cluster_id: str, this: BrokerNode) -> str:
    """A controller's metadata directory id, derived from the cluster id and its node id so
    that every node formats with the same list."""
    derived = uuid.uuid5(uuid.NAMESPACE_URL, f"kafka:{cluster_id}:{this.node_id}")
    return base64.urlsafe_b64encode(derived.bytes).decode().rstrip("=")


def process(settings: StackSettings, node_id: int = 1) -> ManagedProcess:
    return ManagedProcess(node(settings, node_id).name, settings.pid_dir, settings.log_dir)


def is_ready(settings: StackSettings, timeout: float = 2.0) -> bool:
    """True when every broker of the stack is in the cluster's metadata."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap, "log_level": 0})
    metadata = admin.list_topics(timeout=timeout)
    return len(metadata.brokers) >= settings.kafka_brokers


def start(settings: StackSettings, timeout: float = 90.0) -> None:
    """Start the brokers not running (formatting storage the first time) and wait until
    every one is in the cluster."""
    for this in nodes(settings):
        proc = process(settings, this.node_id)
        if not proc.is_running():
            config = render_config(settings, this.node_id)
            format_storage(settings, config, this.node_id)
            proc.start(
                _java(settings, settings.kafka_heap, "kafka.Kafka", str(config)),
                ports=[(settings.host, this.port), (settings.host, this.controller_port)],
            )
    wait_until(lambda: is_ready(settings), timeout, f"Kafka on {settings.kafka_bootstrap}")
