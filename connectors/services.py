"""The Connect worker of a stack and its connectors: start, register, stop."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from connectors import rest
from connectors.config import ConnectSettings
from connectors.oar_postgres import OarDatabase
from connectors.worker import CONNECTORS_DIR, Worker
from kafka.security import KafkaClientSettings
from stack import kafka_broker, secrets
from stack.config import StackSettings

REST_PASSWORD = "JOBSCOPE_CONNECT_REST_PASSWORD"


def worker(
    stack: StackSettings,
    connect: ConnectSettings,
    kafka: KafkaClientSettings | None = None,
    rest_password: str | None = None,
) -> Worker:
    """The stack's worker (process `connect`) against the stack's brokers, as the stack's
    Kafka user `connect` when they authenticate (`kafka`: its credentials, else secrets.env's);
    its REST API's password `rest_password`, else secrets.env's."""
    if rest_password is None:
        rest_password = secrets.of(stack.state_dir, "connect")[REST_PASSWORD]
    return Worker(
        name="connect",
        state_dir=stack.state_dir,
        bootstrap=stack.kafka_bootstrap,
        rest_port=connect.rest_port,
        rest_password=SecretStr(rest_password),
        host=stack.host,
        heap=connect.heap,
        replication_factor=stack.kafka_replication_factor,
        kafka=kafka or kafka_broker.client_settings(stack, "connect"),
    )


def oar_database(stack: StackSettings, connect: ConnectSettings) -> OarDatabase:
    """The local demo database, its password from the stack's secrets.env."""
    password = secrets.load_or_create(stack.state_dir)["JOBSCOPE_DEMO_OAR_DB_PASSWORD"]
    return OarDatabase(stack.state_dir, connect.oar_db_port, password)


def with_local_password(stack: StackSettings, connect: ConnectSettings) -> ConnectSettings:
    """`connect`, with the local demo database's password when it reads that one and was
    given none."""
    if not connect.local_oar_db or connect.oar_db_password.get_secret_value():
        return connect
    password = oar_database(stack, connect).password
    return connect.model_copy(update={"oar_db_password": SecretStr(password)})


def connector_file(name: str) -> Path:
    return CONNECTORS_DIR / f"{name}.json"


def register_all(
    worker: Worker, connect: ConnectSettings, timeout: float = 60.0
) -> dict[str, bool]:
    """Register each configured connector (True: created or changed) and wait until it runs;
    their secrets go to the worker's secrets file, their configurations name them."""
    placeholders = connect.placeholders(worker.store_secrets(connect.secrets()))
    changed = {}
    for name in connect.connectors:
        connector, config = rest.load(connector_file(name), placeholders)
        changed[connector] = rest.register(worker, connector, config)
    for connector in changed:
        rest.wait_running(worker, connector, timeout)
    return changed


def up(stack: StackSettings, connect: ConnectSettings) -> Worker:
    """The local OAR database when asked for, the worker, then the connectors."""
    if connect.local_oar_db:
        oar_database(stack, connect).start()
    this = worker(stack, connect)
    this.start()
    register_all(this, with_local_password(stack, connect))
    return this


def down(stack: StackSettings, connect: ConnectSettings) -> None:
    worker(stack, connect).stop()
    oar_database(stack, connect).stop()
