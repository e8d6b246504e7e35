"""The stack with brokers that authenticate (JOBSCOPE_KAFKA_SASL=true): every component reaches
Kafka with its own SCRAM user, readings and jobs flow end to end, and a client without
credentials, or with a wrong password, cannot write to `jobs` (which grants push rights on
a job's nodes). Runs its own stack on ports of its own (tests/ports.py)."""

from __future__ import annotations

import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, Producer, TopicPartition

from connectors import services as connect_services
from connectors.config import ConnectSettings
from stack import kafka_broker, secrets, services
from stack.config import StackSettings
from stack.processes import wait_until
from tests import ports


@pytest.fixture(scope="module")
def sasl_stack() -> Iterator[StackSettings]:
    settings = ports.stack_settings("sasl", kafka_heap="384m", kafka_sasl=True)
    services.stop_all(settings)
    shutil.rmtree(settings.state_dir, ignore_errors=True)
    try:
        services.start_kafka(settings)
        services.start_clickhouse(settings)
        services.start_api(settings)
        yield settings
    finally:
        services.stop_all(settings)
        shutil.rmtree(settings.state_dir, ignore_errors=True)


def _jobs_end(settings: StackSettings) -> int:
    """The end offset of `jobs`, read as the stack's admin user."""
    consumer = KafkaConsumer(
        {**kafka_broker.client_settings(settings).kafka_client(), "group.id": "sasl-test"}
    )
    try:
        return consumer.get_watermark_offsets(TopicPartition("jobs", 0), timeout=10)[1]
    finally:
        consumer.close()


def _produce_job(settings: StackSettings, security: dict[str, str]) -> list[KafkaError | None]:
    """Try to write a forged job; the delivery reports (and client errors) that came back."""
    reports: list[KafkaError | None] = []

    def report(err: KafkaError | None, _msg: object = None) -> None:
        reports.append(err)

    producer = Producer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            **security,
            "message.timeout.ms": 5000,
            "error_cb": report,
            "log_level": 0,
        }
    )
    job = b'{"job_id": "forged", "user": "mallory", "nodes": ["node-1"]}'
    producer.produce("jobs", job, b"forged", on_delivery=report)
    producer.flush(10)
    return reports


def test_a_client_without_credentials_cannot_write_jobs(sasl_stack: StackSettings) -> None:
    before = _jobs_end(sasl_stack)
    reports = _produce_job(sasl_stack, {})
    # never delivered (a KafkaError cannot be compared to None with ==, hence `is`)
    assert reports and all(err is not None for err in reports), reports
    assert _jobs_end(sasl_stack) == before


def test_a_wrong_password_is_refused(sasl_stack: StackSettings) -> None:
    before = _jobs_end(sasl_stack)
    security = kafka_broker.client_settings(sasl_stack, "producers").kafka_security()
    reports = _produce_job(sasl_stack, {**security, "sasl.password": "not-the-password"})
    assert all(err is not None for err in reports)
    assert any(err.code() == KafkaError._AUTHENTICATION for err in reports if err), reports
    assert _jobs_end(sasl_stack) == before


def test_with_credentials_the_same_write_goes_through(sasl_stack: StackSettings) -> None:
    """The check above can fail: the broker takes the write from an authenticated user."""
    before = _jobs_end(sasl_stack)
    security = kafka_broker.client_settings(sasl_stack, "admin").kafka_security()
    reports = _produce_job(sasl_stack, security)
    assert len(reports) == 1 and reports[0] is None, reports
    assert _jobs_end(sasl_stack) == before + 1


def test_readings_of_an_authenticated_producer_reach_clickhouse(
    sasl_stack: StackSettings, tmp_path: Path
) -> None:
    """`python -m producers` as user `producers` -> Kafka -> ClickHouse's Kafka table as user
    `clickhouse` -> `metrics`; the API (user `api`) reports Kafka healthy."""
    device = f"sasl-{uuid.uuid4().hex[:6]}"
    devices_file = tmp_path / "devices.yaml"
    devices_file.write_text(
        f"- {{name: sasl_value, device_id: {device}, url: 'tester://?metrics=2', "
        "update_every: 250}\n"
    )
    proc = services.start_producers(sasl_stack, devices_file, name="producers-sasl")
    admin = services.clickhouse_client(sasl_stack, "jobscope")
    try:
        environ = Path(f"/proc/{proc.pid()}/environ").read_bytes().split(b"\0")
        assert environ != [b""], f"the producers exited at start: {proc.log_file.read_text()}"
        assert b"JOBSCOPE_KAFKA_SASL_USERNAME=producers" in environ
        wait_until(
            lambda: (
                admin.command(
                    "SELECT count() FROM metrics WHERE device_id = {d:String}",
                    parameters={"d": device},
                )
                > 0
            ),
            60,
            "readings of the authenticated producer in ClickHouse",
        )
    finally:
        proc.stop()
    health = httpx.get(f"{sasl_stack.api_url}/health", timeout=10).json()
    assert health["kafka"]["ok"], health


def test_a_job_written_through_the_api_reaches_clickhouse(sasl_stack: StackSettings) -> None:
    token = secrets.load_or_create(sasl_stack.state_dir)["JOBSCOPE_ADMIN_TOKEN"]
    job_id = f"{uuid.uuid4().int % 10**9}"
    created = httpx.post(
        f"{sasl_stack.api_url}/api/jobs",
        json={"job_id": job_id, "user": "alice", "nodes": ["node-1"], "start": 1795424400},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert created.status_code in (201, 202), created.text
    admin = services.clickhouse_client(sasl_stack, "jobscope")
    wait_until(
        lambda: (
            admin.command(
                "SELECT count() FROM jobs WHERE job_id = {j:String}", parameters={"j": job_id}
            )
            > 0
        ),
        30,
        "the job in ClickHouse",
    )


def test_passwords_stay_out_of_ddl_command_lines_and_open_files(
    sasl_stack: StackSettings,
) -> None:
    passwords = secrets.load_or_create(sasl_stack.state_dir)
    kafka_passwords = [passwords[v] for v in kafka_broker.SCRAM_USERS.values()]
    admin = services.clickhouse_client(sasl_stack, "jobscope")
    ddl = admin.command("SELECT groupConcat(create_table_query) FROM system.tables")
    assert "readings_queue" in ddl and "Kafka" in ddl
    assert not any(p in ddl for p in kafka_passwords)
    for name in ("kafka", "clickhouse", "api"):
        cmdline = Path(f"/proc/{services.process(sasl_stack, name).pid()}/cmdline").read_text()
        assert not any(p in cmdline for p in kafka_passwords), name
    properties = sasl_stack.state_dir / "kafka" / "server.properties"
    assert stat.S_IMODE(properties.stat().st_mode) == 0o600
    # the engine's configuration: private, and without the password once the engine read it
    # (the Kafka tables, created after that by the schema, consume: see above)
    engine_xml = sasl_stack.state_dir / "clickhouse-engine.xml"
    assert stat.S_IMODE(engine_xml.stat().st_mode) == 0o600
    assert "<sasl_username>clickhouse</sasl_username>" in engine_xml.read_text()
    assert passwords["JOBSCOPE_KAFKA_CLICKHOUSE_PASSWORD"] not in engine_xml.read_text()
    assert not (sasl_stack.state_dir / "kafka" / "format.args").exists()


def test_the_connect_worker_joins_with_its_credentials_from_a_private_file(
    sasl_stack: StackSettings,
) -> None:
    """Kafka Connect as user `connect`: its properties name the password through the
    FileConfigProvider, the secrets file is private, and the worker joins its group."""
    worker = connect_services.worker(
        sasl_stack, ConnectSettings(rest_port=ports.port("sasl-connect"))
    )
    try:
        worker.start()
        assert worker.is_ready()
    finally:
        worker.stop()
    password = secrets.load_or_create(sasl_stack.state_dir)["JOBSCOPE_KAFKA_CONNECT_PASSWORD"]
    properties = (worker.home / "worker.properties").read_text()
    assert 'username="connect"' in properties and password not in properties
    assert "${file:" in properties
    assert stat.S_IMODE(worker.secrets_file.stat().st_mode) == 0o600
