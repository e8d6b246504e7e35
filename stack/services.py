"""Each jobscope process of the embedded default: how it starts and when it is healthy."""

from __future__ import annotations

import logging
import shutil
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from clickhouse.migrate import MigrationSettings, apply_migrations, connect
from stack import kafka_broker, secrets, topics
from stack.config import REPO_ROOT, StackSettings
from stack.processes import ManagedProcess, free_port, wait_until

log = logging.getLogger("jobscope.stack")


def fresh_stack(state_dir: Path) -> StackSettings:
    """Settings of a new stack in `state_dir` (emptied) on free loopback ports, stopped
    first if an earlier run left it running: the benchmarks' stacks."""
    settings = StackSettings(
        state_dir=state_dir,
        kafka_port=free_port(),
        kafka_controller_port=free_port(),
        kafka_heap="512m",
        clickhouse_port=free_port(),
        api_port=free_port(),
        producer_metrics_port=free_port(),
    )
    stop_all(settings)
    shutil.rmtree(state_dir, ignore_errors=True)
    return settings


def component_env(settings: StackSettings) -> dict[str, str]:
    """The environment every component reads its settings from (see the README)."""
    return {
        **secrets.load_or_create(settings.state_dir),
        "JOBSCOPE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "JOBSCOPE_CLICKHOUSE_HOST": settings.host,
        "JOBSCOPE_CLICKHOUSE_PORT": str(settings.clickhouse_port),
        "JOBSCOPE_CLICKHOUSE_DATA_DIR": str(settings.state_dir / "clickhouse"),
        "JOBSCOPE_CLICKHOUSE_ENGINE_LOG_FILE": str(settings.log_dir / "clickhouse-engine.log"),
        "JOBSCOPE_API_HOST": settings.host,
        "JOBSCOPE_API_PORT": str(settings.api_port),
        "JOBSCOPE_METRICS_PORT": str(settings.producer_metrics_port),
        "JOBSCOPE_SPOOL_ROOT": str(settings.state_dir / "producer-spool"),
        "JOBSCOPE_RETENTION_DAYS": str(settings.retention_days),
        "JOBSCOPE_JSON_TOPIC": settings.json_topic,
        "PYTHONUNBUFFERED": "1",
    }


# The local server's users and the variable holding each one's password.
PASSWORD_VARS = {
    "jobscope": "JOBSCOPE_CLICKHOUSE_ADMIN_PASSWORD",
    "reader": "JOBSCOPE_CLICKHOUSE_READER_PASSWORD",
    "api": "JOBSCOPE_CLICKHOUSE_API_PASSWORD",
}


def clickhouse_password(settings: StackSettings, user: str) -> str:
    return component_env(settings)[PASSWORD_VARS[user]]


def clickhouse_client(settings: StackSettings, user: str, **kwargs: object) -> Client:
    """A clickhouse-connect client to this stack's ClickHouse server as `user`."""
    return clickhouse_connect.get_client(
        host=settings.host,
        port=settings.clickhouse_port,
        username=user,
        password=clickhouse_password(settings, user),
        **kwargs,
    )


def migration_settings(settings: StackSettings, **overrides: object) -> MigrationSettings:
    """The schema settings of this stack (`overrides`: e.g. another database or topic)."""
    values: dict[str, object] = {
        "clickhouse_host": settings.host,
        "clickhouse_port": settings.clickhouse_port,
        "clickhouse_admin_password": clickhouse_password(settings, "jobscope"),
        "kafka_bootstrap": settings.kafka_bootstrap,
        "retention_days": settings.retention_days,
    }
    return MigrationSettings(**{**values, **overrides})


def process(settings: StackSettings, name: str) -> ManagedProcess:
    return ManagedProcess(name, settings.pid_dir, settings.log_dir)


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200


def start_kafka(settings: StackSettings) -> None:
    kafka_broker.start(settings)
    optional = (topics.json_readings(settings.json_topic),) if settings.json_topic else ()
    topics.ensure_topics(
        settings.kafka_bootstrap,
        (*topics.ALL_TOPICS, *optional),
        replication_factor=settings.kafka_replication_factor,
        min_insync_replicas=settings.kafka_min_insync_replicas,
    )


def start_clickhouse(settings: StackSettings, timeout: float = 60.0) -> None:
    """Start the local ClickHouse server and apply the schema."""
    env = component_env(settings)
    process(settings, "clickhouse").start(
        [sys.executable, "-m", "clickhouse.server"],
        env=env,
        cwd=REPO_ROOT,
        ports=[(settings.host, settings.clickhouse_port)],
    )
    wait_until(
        lambda: _http_ok(f"{settings.clickhouse_url}/ping"),
        timeout,
        f"ClickHouse on {settings.clickhouse_url}",
    )
    apply_schema(settings)


def apply_schema(settings: StackSettings) -> None:
    migration = migration_settings(settings)
    apply_migrations(connect(migration), migration)


def start_producers(
    settings: StackSettings, devices_file: Path | None = None, name: str = "producers"
) -> ManagedProcess:
    proc = process(settings, name)
    proc.start(
        [
            sys.executable,
            "-m",
            "producers",
            "--devices",
            str(devices_file or settings.devices_file),
        ],
        env=component_env(settings),
        cwd=REPO_ROOT,
    )
    return proc


def start_simulators(settings: StackSettings, timeout: float = 300.0) -> None:
    """The simulated devices (stack/simulators), when `settings.simulators` asks for them.
    The first start builds snmpsim's own venv (cached for later starts)."""
    if not settings.simulators:
        return
    ready = simulators_ready_file(settings)
    ready.unlink(missing_ok=True)
    proc = process(settings, "simulators")
    proc.start(
        [sys.executable, "-m", "stack.simulators"], env=component_env(settings), cwd=REPO_ROOT
    )
    wait_until(
        lambda: ready.exists() or not proc.is_running(), timeout, "the simulated devices", 0.5
    )
    if not proc.is_running():
        raise RuntimeError(f"the simulated devices did not start: see {proc.log_file}")


def simulators_ready_file(settings: StackSettings) -> Path:
    """Exists while every simulated device answers (written by stack.simulators)."""
    return settings.state_dir / "simulators" / "ready"


def start_api(settings: StackSettings, timeout: float = 60.0) -> None:
    process(settings, "api").start(
        [sys.executable, "-m", "api"],
        env=component_env(settings),
        cwd=REPO_ROOT,
        ports=[(settings.host, settings.api_port)],
    )
    wait_until(
        lambda: _http_ok(f"{settings.api_url}/health"), timeout, f"the API on {settings.api_url}"
    )


# Stop order: readers and writers first, the broker last.
STOP_ORDER = ("api", "producers", "clickhouse", "kafka")


def stop_all(settings: StackSettings, drain_timeout: float = 15.0) -> list[str]:
    """Stop every process this state directory started (extra ones, e.g. a second producer,
    before ClickHouse and Kafka); return the names stopped. Once nothing produces, ClickHouse
    gets up to `drain_timeout` to consume what is left in the readings topic, so that a
    stopped stack holds every reading (and an upgrade that changes the message layout finds
    none of the old one in flight)."""
    known = {p.stem for p in settings.pid_dir.glob("*.pid")} if settings.pid_dir.exists() else set()
    brokers = sorted(name for name in known if name.startswith("kafka-"))  # nodes 2..N
    extra = sorted(known - set(STOP_ORDER) - set(brokers))
    stopped = []
    for name in ("api", *extra, "producers", "clickhouse"):
        proc = process(settings, name)
        if name == "clickhouse" and proc.is_running() and process(settings, "kafka").is_running():
            _drain_readings(settings, drain_timeout)
        if proc.is_running():
            proc.stop(timeout=30)
            stopped.append(name)
    # Kafka nodes together: the last one stopping alone would wait for a lost quorum.
    nodes = [name for name in ("kafka", *brokers) if process(settings, name).is_running()]
    with ThreadPoolExecutor(max(1, len(nodes))) as pool:
        list(pool.map(lambda name: process(settings, name).stop(timeout=30), nodes))
    return stopped + nodes


def _drain_readings(settings: StackSettings, timeout: float) -> None:
    migration = migration_settings(settings)

    def consumed() -> bool:
        lag = topics.consumer_lag(
            settings.kafka_bootstrap, migration.consumer_group, migration.readings_topic
        )
        return lag == 0

    try:
        wait_until(consumed, timeout, "ClickHouse to consume the readings topic")
    except TimeoutError:
        log.warning(
            "stopping with readings not yet consumed after %.0f s: they stay in Kafka and are "
            "consumed at the next start",
            timeout,
        )
