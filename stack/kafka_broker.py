"""The single-node KRaft Kafka broker of the embedded default, run from Maven-resolved jars."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import uuid
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


def render_config(settings: StackSettings) -> Path:
    """Write server.properties for this stack into the state directory."""
    kafka_state = settings.state_dir / "kafka"
    text = (KAFKA_DIR / "broker.properties.in").read_text()
    for key, value in {
        "HOST": settings.host,
        "PORT": str(settings.kafka_port),
        "CONTROLLER_PORT": str(settings.kafka_controller_port),
        "LOG_DIRS": str(kafka_state / "data"),
    }.items():
        text = text.replace(f"@{key}@", value)
    path = kafka_state / "server.properties"
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


def format_storage(settings: StackSettings, config: Path) -> None:
    """Format the KRaft log directory once; a formatted directory is kept as it is."""
    if (settings.state_dir / "kafka" / "data" / "meta.properties").exists():
        return
    cluster_id = _cluster_id()
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
            "--standalone",
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def process(settings: StackSettings) -> ManagedProcess:
    return ManagedProcess("kafka", settings.pid_dir, settings.log_dir)


def is_ready(settings: StackSettings, timeout: float = 2.0) -> bool:
    """True when the broker answers a metadata request."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap, "log_level": 0})
    metadata = admin.list_topics(timeout=timeout)
    return len(metadata.brokers) > 0


def start(settings: StackSettings, timeout: float = 90.0) -> None:
    """Start the broker (formatting storage the first time) and wait until it answers."""
    proc = process(settings)
    if not proc.is_running():
        config = render_config(settings)
        format_storage(settings, config)
        proc.start(
            _java(settings, settings.kafka_heap, "kafka.Kafka", str(config)),
            ports=[
                (settings.host, settings.kafka_port),
                (settings.host, settings.kafka_controller_port),
            ],
        )
    wait_until(lambda: is_ready(settings), timeout, f"Kafka on {settings.kafka_bootstrap}")
