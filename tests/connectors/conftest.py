"""Fixtures of the Kafka Connect tests: a real PostgreSQL 15 with OAR's tables and logical
replication, a real Connect worker (Debezium on its plugin path) against the test stack's
broker, the connectors of connectors/*.json registered."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest
from clickhouse_connect.driver.client import Client

from connectors import services
from connectors.config import ConnectSettings
from connectors.oar_postgres import OarDatabase
from connectors.worker import Worker
from stack.config import StackSettings
from tests import ports


@pytest.fixture(scope="session")
def connect_settings() -> ConnectSettings:
    rest_port, oar_db_port = ports.ports("connect")
    return ConnectSettings(rest_port=rest_port, oar_db_port=oar_db_port, heap="384m")


@pytest.fixture(scope="session")
def oar_db(
    stack_settings: StackSettings, connect_settings: ConnectSettings
) -> Iterator[OarDatabase]:
    db = services.oar_database(stack_settings, connect_settings)
    db.start()
    with db.connect() as conn:  # job ids of their own among the other tests' jobs
        conn.execute(f"ALTER SEQUENCE jobs_job_id_seq RESTART WITH {random.randint(10**8, 10**9)}")
    yield db
    db.stop()


@pytest.fixture(scope="session")
def connect_worker(
    clickhouse: StackSettings, connect_settings: ConnectSettings, oar_db: OarDatabase
) -> Iterator[Worker]:
    worker = services.worker(clickhouse, connect_settings)
    worker.start()
    services.register_all(worker, services.with_local_password(clickhouse, connect_settings))
    yield worker
    worker.stop()


@dataclass
class Oar:
    """OAR's side of a job's life, as OAR's server writes it into its tables."""

    db: OarDatabase

    def add_node(self, network_address: str, cores: int = 2) -> list[int]:
        """One resource per core of a node, as OAR describes a cluster."""
        with self.db.connect() as conn:
            return [
                conn.execute(
                    "INSERT INTO resources (network_address, host) VALUES (%s, %s)"
                    " RETURNING resource_id",
                    (network_address, network_address),
                ).fetchone()[0]
                for _ in range(cores)
            ]

    def submit(self, user: str, project: str = "proj", queue: str = "default") -> int:
        with self.db.connect() as conn:
            return conn.execute(
                "INSERT INTO jobs (job_name, job_user, project, queue_name, submission_time)"
                " VALUES ('bench', %s, %s, %s, %s) RETURNING job_id",
                (user, project, queue, int(time.time())),
            ).fetchone()[0]

    def schedule(self, job_id: int, resources: Sequence[int]) -> None:
        """toLaunch: the scheduler assigns a moldable job's resources in one transaction."""
        moldable_id = job_id + 7  # OAR's moldable ids are their own sequence
        with self.db.connect() as conn, conn.transaction():
            for resource in resources:
                conn.execute(
                    "INSERT INTO assigned_resources (moldable_job_id, resource_id) VALUES (%s, %s)",
                    (moldable_id, resource),
                )
            conn.execute(
                "UPDATE jobs SET state = 'toLaunch', assigned_moldable_job = %s WHERE job_id = %s",
                (moldable_id, job_id),
            )

    def set_state(self, job_id: int, state: str, **columns: int) -> None:
        assignments = "".join(f", {name} = %({name})s" for name in columns)
        with self.db.connect() as conn:
            conn.execute(
                f"UPDATE jobs SET state = %(state)s{assignments} WHERE job_id = %(job_id)s",
                {"state": state, "job_id": job_id, **columns},
            )

    def run(self, job_id: int, resources: Sequence[int], start: int, stop: int) -> None:
        """A whole life: scheduled, launched, running from `start`, terminated at `stop`."""
        self.schedule(job_id, resources)
        self.set_state(job_id, "Launching")
        self.set_state(job_id, "Running", start_time=start)
        self.set_state(job_id, "Terminated", stop_time=stop)


@pytest.fixture(scope="session")
def oar(oar_db: OarDatabase) -> Oar:
    return Oar(oar_db)


def stored_jobs(admin: Client, user: str) -> dict[str, tuple]:
    """The user's jobs in ClickHouse: job id -> (state, nodes, start, end), one per id."""
    rows = admin.query(
        "SELECT job_id, state, nodes, toUnixTimestamp(start_time), toUnixTimestamp(end_time)"
        " FROM jobs FINAL WHERE user = {user:String}",
        parameters={"user": user},
    ).result_rows
    return {row[0]: tuple(row[1:]) for row in rows}
