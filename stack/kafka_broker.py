"""The KRaft Kafka brokers of the embedded default, run from Maven-resolved jars.

One broker (node 1, process `kafka`, state in `kafka/`) by default; JOBSCOPE_KAFKA_BROKERS=N
adds nodes 2..N (processes `kafka-<id>`, state in `kafka-<id>/`), each a broker and a
controller of one quorum, node i on the ports after node i-1's (`kafka_port + 2(i-1)` and
`kafka_controller_port + 2(i-1)`).

With JOBSCOPE_KAFKA_SASL=true every listener authenticates: clients and brokers with
SCRAM-SHA-512, one user per component (`SCRAM_USERS`, passwords in secrets.env), created when
the storage is formatted and upserted at each start; the embedded ClickHouse engine with PLAIN
(`PLAIN_USERS`: its librdkafka is built without OpenSSL, so without SCRAM), a static user of
the client listener; the controllers' listener with PLAIN and a static user (KRaft
controllers cannot read SCRAM credentials). Without, any local account can produce to any
topic (a job on `jobs` gives push rights on its nodes).
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from kafka.security import KafkaClientSettings, scram_jaas
from stack import secrets
from stack.config import REPO_ROOT, StackSettings
from stack.processes import ManagedProcess, wait_until
from stack.transient import KAFKA_STARTING

KAFKA_DIR = REPO_ROOT / "kafka"
# The SCRAM users of a SASL stack and the secrets.env variable of each one's password.
SCRAM_USERS = {
    "admin": "JOBSCOPE_KAFKA_ADMIN_PASSWORD",  # the stack's own tools: topics, readiness, lag
    "broker": "JOBSCOPE_KAFKA_BROKER_PASSWORD",  # brokers to each other
    "producers": "JOBSCOPE_KAFKA_PRODUCERS_PASSWORD",
    "api": "JOBSCOPE_KAFKA_API_PASSWORD",
    "clickhouse": "JOBSCOPE_KAFKA_CLICKHOUSE_PASSWORD",
    "connect": "JOBSCOPE_KAFKA_CONNECT_PASSWORD",
}
CONTROLLER_PASSWORD = "JOBSCOPE_KAFKA_CONTROLLER_PASSWORD"
"""The controllers' listener's one PLAIN user, `controller`."""
MECHANISM = "SCRAM-SHA-512"
PLAIN_USERS = ("clickhouse",)
"""Users that log in with PLAIN instead (the embedded engine's Kafka client)."""
SCRAM_ITERATIONS = 8192


def sasl(settings: StackSettings) -> bool:
    """Whether the brokers authenticate: the setting, else as they were last started."""
    if settings.kafka_sasl is not None:
        return settings.kafka_sasl
    mode = _mode_file(settings)
    return mode.exists() and mode.read_text().strip() == "sasl"


def _mode_file(settings: StackSettings) -> Path:
    return settings.state_dir / "kafka" / "security"


def _users_file(settings: StackSettings) -> Path:
    """Exists once the storage was formatted with the SCRAM users."""
    return settings.state_dir / "kafka" / "scram-users"


def client_settings(settings: StackSettings, user: str = "admin") -> KafkaClientSettings:
    """How `user` (one of SCRAM_USERS) reaches this stack's brokers."""
    if not sasl(settings):
        return KafkaClientSettings(kafka_bootstrap=settings.kafka_bootstrap)
    return KafkaClientSettings(
        kafka_bootstrap=settings.kafka_bootstrap,
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="PLAIN" if user in PLAIN_USERS else MECHANISM,
        kafka_sasl_username=user,
        kafka_sasl_password=secrets.load_or_create(settings.state_dir)[SCRAM_USERS[user]],
    )


def client_env(settings: StackSettings, user: str) -> dict[str, str]:
    """The JOBSCOPE_KAFKA_* variables of a component that connects as `user`: its own
    credentials only (empty without SASL)."""
    if not sasl(settings):
        return {}
    client = client_settings(settings, user)
    return {
        "JOBSCOPE_KAFKA_SECURITY_PROTOCOL": client.kafka_security_protocol,
        "JOBSCOPE_KAFKA_SASL_MECHANISM": client.kafka_sasl_mechanism,
        "JOBSCOPE_KAFKA_SASL_USERNAME": client.kafka_sasl_username,
        "JOBSCOPE_KAFKA_SASL_PASSWORD": client.kafka_sasl_password.get_secret_value(),
    }


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
        "BROKER_SESSION_TIMEOUT_MS": str(settings.kafka_broker_session_timeout_ms),
        "BROKER_HEARTBEAT_INTERVAL_MS": str(settings.kafka_broker_heartbeat_interval_ms),
        "LOG_DIRS": str(this.state / "data"),
        "PROTOCOL": "SASL_PLAINTEXT" if sasl(settings) else "PLAINTEXT",
        "SECURITY": _security_section(settings),
    }.items():
        text = text.replace(f"@{key}@", value)
    path = this.state / "server.properties"
    path.parent.mkdir(parents=True, exist_ok=True)
    secrets.write_private(path, text)
    return path


def _security_section(settings: StackSettings) -> str:
    """The SASL lines of server.properties (with the brokers' and controllers' passwords):
    empty without SASL."""
    if not sasl(settings):
        return ""
    passwords = secrets.load_or_create(settings.state_dir)
    controller = passwords[CONTROLLER_PASSWORD]
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule required"
    controllers = (
        f'{plain} username="controller" password="{controller}" user_controller="{controller}";'
    )
    plain_users = " ".join(f'user_{u}="{passwords[SCRAM_USERS[u]]}"' for u in PLAIN_USERS)
    broker = scram_jaas("broker", passwords[SCRAM_USERS["broker"]])
    return "\n".join(
        [
            "# SASL (JOBSCOPE_KAFKA_SASL): SCRAM users for clients and brokers, PLAIN for the",
            "# embedded ClickHouse engine and between controllers. No authorizer: an",
            "# authenticated user may use every topic.",
            f"sasl.enabled.mechanisms={MECHANISM},PLAIN",
            f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
            f"listener.name.client.{MECHANISM.lower()}.sasl.jaas.config={broker}",
            f"listener.name.client.plain.sasl.jaas.config={plain} {plain_users};",
            "sasl.mechanism.controller.protocol=PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
            f"listener.name.controller.plain.sasl.jaas.config={controllers}",
            "",
        ]
    )


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


def _argfile(path: Path, args: list[str]) -> str:
    """The Java launcher's `@file` holding `args` (private), so that no password shows in
    the process's command line, which every local account can read."""
    secrets.write_private(path, "".join('"' + a.replace("\\", "\\\\") + '"\n' for a in args))
    return f"@{path}"


def format_storage(settings: StackSettings, config: Path, node_id: int = 1) -> None:
    """Format node `node_id`'s KRaft log directory once; a formatted one is kept as it is."""
    if (node(settings, node_id).state / "data" / "meta.properties").exists():
        if sasl(settings) and not _users_file(settings).exists():
            raise RuntimeError(
                f"{settings.state_dir} holds brokers formatted without SASL users: start them "
                "with JOBSCOPE_KAFKA_SASL=false (make up KAFKA_SASL=false), or remove the "
                "state (make reset) to format them with SASL"
            )
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
    args = [
        "format",
        # one argument: an id may start with "-" (base64), which would read as an option
        f"--cluster-id={cluster_id}",
        "-c",
        str(config),
        quorum,
    ]
    if sasl(settings):
        passwords = secrets.load_or_create(settings.state_dir)
        for user, variable in SCRAM_USERS.items():
            args += ["--add-scram", f"{MECHANISM}=[name={user},password={passwords[variable]}]"]
    argfile = node(settings, node_id).state / "format.args"
    try:
        subprocess.run(
            _java(settings, "256m", _argfile(argfile, ["kafka.tools.StorageTool", *args])),
            check=True,
            stdout=subprocess.DEVNULL,
        )
    finally:
        argfile.unlink(missing_ok=True)
    if sasl(settings):
        _users_file(settings).touch()


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
    admin = AdminClient({**client_settings(settings).kafka_client(), "log_level": 0})
    metadata = admin.list_topics(timeout=timeout)
    return len(metadata.brokers) >= settings.kafka_brokers


def upsert_scram_users(settings: StackSettings, timeout: float = 30.0) -> None:
    """Set every SCRAM user's password from secrets.env (a changed one takes effect)."""
    passwords = secrets.load_or_create(settings.state_dir)
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
    admin = AdminClient({**client_settings(settings).kafka_client(), "log_level": 0})
    upserts = [
        UserScramCredentialUpsertion(user, info, passwords[variable].encode())
        for user, variable in SCRAM_USERS.items()
    ]
    for future in admin.alter_user_scram_credentials(upserts).values():
        future.result(timeout)


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
    wait_until(
        lambda: is_ready(settings),
        timeout,
        f"Kafka on {settings.kafka_bootstrap}",
        transient=KAFKA_STARTING,
    )
    _mode_file(settings).write_text("sasl\n" if sasl(settings) else "plaintext\n")
    if sasl(settings):
        upsert_scram_users(settings)
