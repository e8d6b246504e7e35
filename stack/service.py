"""`python -m stack.service <step>`: what the systemd units of the service install run
(stack/install.py writes them). Each step reads the one configuration file the unit gives it
(/etc/jobscope/jobscope.env, the StackSettings), derives the component's own environment as
`make up` does, and runs in the foreground: a service step replaces itself with the
component's process (exec), so systemd supervises the component itself.

Secrets come from the unit, never from the state directory: the API, the producers and
Superset get theirs in their environment (EnvironmentFile), the ClickHouse server on its
standard input (StandardInput=file:), read once and never in its environment, as `make up`'s
pipe. The optional Connect unit's steps are connectors/service.py's (connectors/ imports
stack/, not the reverse), run by this module's main.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from confluent_kafka.admin import AdminClient

from clickhouse.migrate import MigrationSettings, apply_migrations, connect
from kafka import topics
from kafka.security import KafkaClientSettings
from stack import kafka_broker, superset
from stack.clickhouse_server.__main__ import SECRETS_FD_VAR
from stack.config import REPO_ROOT, StackSettings
from stack.processes import wait_until
from stack.secrets import OWNERS
from stack.services import ensure_topics, http_ok, settings_env
from stack.transient import KAFKA_STARTING, STARTING

log = logging.getLogger("jobscope.service")

DRAIN_TIMEOUT_S = 60.0
"""The ClickHouse unit's stop waits this long for the readings topic to be consumed (its
TimeoutStopSec leaves the server time to stop after it)."""
READY_TIMEOUT_S = 240.0
"""A start step waits this long for its server (the unit's TimeoutStartSec is longer)."""

# The Kafka user each part connects as (stack/kafka_broker.py SCRAM_USERS).
KAFKA_USERS = {
    "kafka": "admin",
    "clickhouse": "clickhouse",
    "producers": "producers",
    "api": "api",
    "connect": "connect",
}
SUPERSET_SECRETS = (*OWNERS["superset"], superset.ADMIN_PASSWORD)
"""Superset's unit's secrets (its EnvironmentFile): `make superset`'s, and its admin's
password, which the start sets (superset.initialise) and the server never holds."""


def kafka_jars(settings: StackSettings) -> Path:
    """The broker's jars, copied there by the install (the Maven cache is the installer's)."""
    return settings.state_dir / "kafka" / "lib"


def clickhouse_log_dir(settings: StackSettings) -> Path:
    """The engine's own log (the server's goes to the journal), in a folder of its account."""
    return settings.state_dir / "clickhouse-logs"


def ipmi_cache_dir(settings: StackSettings) -> Path:
    return settings.state_dir / "ipmi-sdr-cache"


def connect_home(settings: StackSettings) -> Path:
    """The Connect worker's folder (Worker.home): its properties, secrets, jars, plugins."""
    return settings.state_dir / "connect"


def connect_jars(settings: StackSettings) -> Path:
    """The worker's classpath, copied there by the install (as Kafka's)."""
    return connect_home(settings) / "lib"


def kafka_env(settings: StackSettings, part: str) -> dict[str, str]:
    """How `part` reaches the brokers, less its password (the unit's secret); nothing for
    a part that uses no Kafka (Superset)."""
    if part not in KAFKA_USERS or not kafka_broker.sasl(settings):
        return {}
    user = KAFKA_USERS[part]
    plain = user in kafka_broker.PLAIN_USERS
    return {
        "JOBSCOPE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "JOBSCOPE_KAFKA_SASL_MECHANISM": "PLAIN" if plain else kafka_broker.MECHANISM,
        "JOBSCOPE_KAFKA_SASL_USERNAME": user,
    }


def part_env(settings: StackSettings, part: str) -> dict[str, str]:
    """The non-secret environment of `part` (kafka, clickhouse, producers, api)."""
    env = {**settings_env(settings), **kafka_env(settings, part)}
    if part == "clickhouse":
        env["JOBSCOPE_CLICKHOUSE_ENGINE_LOG_FILE"] = str(
            clickhouse_log_dir(settings) / "clickhouse-engine.log"
        )
        env["HOME"] = str(settings.state_dir / "clickhouse")
    if part == "producers":
        env["JOBSCOPE_IPMI_SDR_CACHE_DIR"] = str(ipmi_cache_dir(settings))
    if part == "superset":  # a system account has no home: its cache in its own folder
        env["HOME"] = str(superset.home(settings))
    return env


def read_secrets(stream_fd: int = 0) -> dict[str, str]:
    """The `NAME=value` lines of the unit's secrets file on standard input."""
    with os.fdopen(os.dup(stream_fd)) as stream:
        lines = stream.read().splitlines()
    return {
        name.strip(): value.strip()
        for name, sep, value in (line.partition("=") for line in lines)
        if sep and not name.startswith("#")
    }


def exec_step(
    argv: list[str], env: Mapping[str, str], cwd: Path = REPO_ROOT, drop: Collection[str] = ()
) -> None:
    """Replace this process with `argv` (the unit's main process), in `cwd`, its environment
    without `drop`: the secrets only the steps before the exec needed, which a process that
    runs for months must not hold (/proc/<pid>/environ, a crash report, a child)."""
    os.chdir(cwd)
    kept = {n: v for n, v in os.environ.items() if n not in drop}
    os.execve(argv[0], argv, {**kept, **env})


def run_kafka(settings: StackSettings) -> None:
    config = kafka_broker.node(settings, 1).state / "server.properties"
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java is not on the PATH (Debian package default-jre-headless)")
    exec_step(
        [
            java,
            f"-Xmx{settings.kafka_heap}",
            f"-Dlog4j2.configurationFile={kafka_broker.KAFKA_DIR / 'log4j2.yaml'}",
            "-cp",
            f"{kafka_jars(settings)}/*",
            "kafka.Kafka",
            str(config),
        ],
        {},
    )


def kafka_ready(settings: StackSettings) -> None:
    """Wait for the broker, then create the topics that do not exist yet (ExecStartPost)."""
    client = KafkaClientSettings(**kafka_client_values(settings, os.environ))
    admin = AdminClient({**client.kafka_client(), "log_level": 0})
    wait_until(
        lambda: admin.list_topics(timeout=2).brokers,
        READY_TIMEOUT_S,
        f"Kafka on {settings.kafka_bootstrap}",
        transient=KAFKA_STARTING,
    )
    ensure_topics(settings, client.kafka_security())


def kafka_client_values(settings: StackSettings, secrets: Mapping[str, str]) -> dict[str, str]:
    """A KafkaClientSettings' values for the part this step runs as (part_env), its password
    from `secrets`."""
    values = {"kafka_bootstrap": settings.kafka_bootstrap}
    if kafka_broker.sasl(settings):
        values |= {
            "kafka_security_protocol": "SASL_PLAINTEXT",
            "kafka_sasl_mechanism": os.environ["JOBSCOPE_KAFKA_SASL_MECHANISM"],
            "kafka_sasl_username": os.environ["JOBSCOPE_KAFKA_SASL_USERNAME"],
            "kafka_sasl_password": secrets["JOBSCOPE_KAFKA_SASL_PASSWORD"],
        }
    return values


def run_clickhouse(settings: StackSettings) -> None:
    """The server reads its passwords from standard input (the unit's secrets file)."""
    exec_step([sys.executable, "-m", "stack.clickhouse_server"], {SECRETS_FD_VAR: "0"})


def _migration(settings: StackSettings, secrets: Mapping[str, str]) -> MigrationSettings:
    return MigrationSettings(
        clickhouse_host=settings.host,
        clickhouse_port=settings.clickhouse_port,
        clickhouse_admin_password=secrets["JOBSCOPE_CLICKHOUSE_ADMIN_PASSWORD"],
        kafka_bootstrap=settings.kafka_bootstrap,
        retention_days=settings.retention_days,
    )


def clickhouse_schema(settings: StackSettings) -> None:
    """Wait for the server, then apply the schema migrations (ExecStartPost)."""
    migration = _migration(settings, read_secrets())
    wait_until(
        lambda: http_ok(f"{settings.clickhouse_url}/ping"),
        READY_TIMEOUT_S,
        f"ClickHouse on {settings.clickhouse_url}",
        transient=STARTING,
    )
    apply_migrations(connect(migration), migration)


def clickhouse_drain(settings: StackSettings) -> None:
    """ExecStop, before the server gets SIGTERM: wait until ClickHouse consumed what the
    readings topic holds (the producers and the API, ordered after it, are stopped), as
    `make down` does; a server that is not answering (it failed) is not waited for."""
    secrets = read_secrets()
    try:
        http_ok(f"{settings.clickhouse_url}/ping")
    except OSError:
        log.warning("ClickHouse is not answering: nothing to drain")
        return
    migration = _migration(settings, secrets)
    client = KafkaClientSettings(**kafka_client_values(settings, secrets))

    def consumed() -> bool:
        lag = topics.consumer_lag(
            settings.kafka_bootstrap,
            migration.consumer_group,
            migration.readings_topic,
            security=client.kafka_security(),
        )
        return lag == 0

    try:
        wait_until(
            consumed,
            DRAIN_TIMEOUT_S,
            "ClickHouse to consume the readings topic",
            transient=KAFKA_STARTING,
        )
    except TimeoutError:
        log.warning(
            "stopping with readings not yet consumed after %.0f s: they stay in Kafka and are "
            "consumed at the next start",
            DRAIN_TIMEOUT_S,
        )
    else:
        log.info("drained: ClickHouse consumed every reading of the topic")


def run_producers(settings: StackSettings) -> None:
    argv = [sys.executable, "-m", "producers", "--devices", str(settings.devices_file)]
    exec_step(argv, {})


def run_api(settings: StackSettings) -> None:
    exec_step([sys.executable, "-m", "api"], {})


def _superset_secrets() -> dict[str, str]:
    return {n: os.environ[n] for n in SUPERSET_SECRETS if n in os.environ}


def run_superset(settings: StackSettings) -> None:
    """As `make superset`: initialise the metadata (migrations once per version, the admin's
    password from the unit's secrets), import the dashboards, then serve (gunicorn)."""
    site = superset.SupersetSettings()
    values = _superset_secrets()
    superset.check_installed(site)
    superset.initialise(settings, site, values)
    superset.import_bundle(settings, site, values)
    env = superset.superset_env(settings, site, values)
    argv = superset.gunicorn_argv(site)
    exec_step(argv, env, superset.home(settings), drop=(superset.ADMIN_PASSWORD,))


def superset_ready(settings: StackSettings) -> None:
    """Wait for Superset's /health (ExecStartPost: the unit is started once it serves)."""
    url = superset.SupersetSettings().url
    wait_until(lambda: superset.healthy(url), READY_TIMEOUT_S, f"Superset on {url}", 1, STARTING)


STEPS: dict[str, tuple[str, Callable[[StackSettings], None]]] = {
    "kafka": ("kafka", run_kafka),
    "kafka-ready": ("kafka", kafka_ready),
    "clickhouse": ("clickhouse", run_clickhouse),
    "clickhouse-schema": ("clickhouse", clickhouse_schema),
    "clickhouse-drain": ("clickhouse", clickhouse_drain),
    "producers": ("producers", run_producers),
    "api": ("api", run_api),
    "superset": ("superset", run_superset),
    "superset-ready": ("superset", superset_ready),
}
"""Each step and the part whose environment it runs in."""


def main(
    steps: Mapping[str, tuple[str, Callable[[StackSettings], None]]] = STEPS,
    prog: str = "python -m stack.service",
) -> int:
    """Run one of `steps` (connectors/service.py has Connect's), in its part's environment."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("step", choices=sorted(steps))
    step = parser.parse_args().step
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    os.umask(0o077)
    settings = StackSettings()
    part, run = steps[step]
    os.environ.update(part_env(settings, part))
    run(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
