"""The Connect worker of a stack and its connectors: start, register, stop."""

from __future__ import annotations

from pathlib import Path

from connectors import rest
from connectors.config import ConnectSettings
from connectors.oar_postgres import OarDatabase
from connectors.worker import CONNECTORS_DIR, Worker
from stack.config import StackSettings


def worker(stack: StackSettings, connect: ConnectSettings) -> Worker:
    """The stack's worker (process `connect`) against the stack's brokers."""
    return Worker(
        name="connect",
        state_dir=stack.state_dir,
        bootstrap=stack.kafka_bootstrap,
        rest_port=connect.rest_port,
        host=stack.host,
        heap=connect.heap,
        replication_factor=stack.kafka_replication_factor,
    )


def oar_database(stack: StackSettings, connect: ConnectSettings) -> OarDatabase:
    return OarDatabase(stack.state_dir, connect.oar_db_port)


def connector_file(name: str) -> Path:
    return CONNECTORS_DIR / f"{name}.json"


def register_all(url: str, connect: ConnectSettings, timeout: float = 60.0) -> dict[str, bool]:
    """Register each configured connector (True: created or changed) and wait until it runs."""
    changed = {}
    for name in connect.connectors:
        connector, config = rest.load(connector_file(name), connect.placeholders())
        changed[connector] = rest.register(url, connector, config)
    for connector in changed:
        rest.wait_running(url, connector, timeout)
    return changed


def up(stack: StackSettings, connect: ConnectSettings) -> Worker:
    """The local OAR database when asked for, the worker, then the connectors."""
    if connect.local_oar_db:
        oar_database(stack, connect).start()
    this = worker(stack, connect)
    this.start()
    register_all(this.url, connect)
    return this


def down(stack: StackSettings, connect: ConnectSettings) -> None:
    worker(stack, connect).stop()
    oar_database(stack, connect).stop()
