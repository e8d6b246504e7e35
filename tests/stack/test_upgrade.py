"""An upgrade from the previous release (tests/stack/previous_release.txt, taken with `git
archive`), as a site does it: the previous release's `python -m stack up` runs with data in it
(a producer polling, pushed readings, a job and its record, the rollups, a token and a revoked
one), this release's `python -m stack down` stops it, readings are published while ClickHouse
is down (they wait in Kafka), and this release's `python -m stack up` starts on the same state:
its migrations apply, every reading, job, record and rollup is as it was, the readings
published meanwhile are stored once, and the tokens are as they were."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import httpx
import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka import Producer

from api.infra.tokens import decode
from clickhouse.migrate import MIGRATIONS_DIR
from kafka import topics
from kafka.message import pack
from kafka.reading import Reading
from stack import secrets, services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import wait_until
from tests import ports
from tests.conftest import wait_for_rollups
from tests.stack.test_backup_restore import auth, can_mint, caught_up, mint, push, stored

pytestmark = pytest.mark.slow

RELEASE_FILE = Path(__file__).with_name("previous_release.txt")


def previous_release() -> str:
    lines = RELEASE_FILE.read_text().splitlines()
    return next(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def checkout(release: str, folder: Path) -> Path:
    """The release's files in `folder` (git archive: the repository is left as it is)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", release],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def run_stack(
    code: Path, settings: StackSettings, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """`python -m stack ...` of the code in `code` (this venv), on the test's state and ports."""
    done = subprocess.run(
        [sys.executable, "-m", "stack", *args],
        env={
            **secrets.public_environ(),
            **ports.stack_environ(settings),
            "JOBSCOPE_RECORDS_INTERVAL_S": "0.5",
            **env,
        },
        cwd=code,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[StackSettings]:
    with ports.own_stack("upgrade", tmp_path / "devices.yaml", "upgrade-polled") as settings:
        yield settings


@pytest.fixture
def release(stack: StackSettings) -> Iterator[Path]:
    """The previous release's files, beside the test's state (not under /tmp: when the stack
    runs as root, its ClickHouse account must reach them, and pytest resets its temporary
    root's mode, ACL included, at each session)."""
    folder = stack.state_dir.with_name(stack.state_dir.name + "-release")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    yield checkout(previous_release(), folder)
    shutil.rmtree(folder, ignore_errors=True)


def rows(client: Client, table: str, device: str, columns: list[str]) -> list[tuple[Any, ...]]:
    key = "job_id" if table in ("jobs", "job_records") else "device_id"
    final = "" if table == "metrics" else " FINAL"
    result = client.query(
        f"SELECT {', '.join(columns)} FROM {table}{final} WHERE {key} = {{k:String}}",
        parameters={"k": device},
    ).result_rows
    return sorted((tuple(row) for row in result), key=repr)


def columns(client: Client, table: str) -> list[str]:
    """The table's columns as comparable values (an aggregate state: its final value)."""
    described = client.query(f"DESCRIBE TABLE {table}").result_rows
    return [
        f"finalizeAggregation({name})" if kind.startswith("AggregateFunction") else name
        for name, kind, *_ in described
    ]


def test_upgrade_from_the_previous_release_keeps_everything(
    stack: StackSettings, release: Path
) -> None:
    run_stack(release, stack, "up")
    client = services.clickhouse_client(stack, "jobscope")
    tokens = secrets.load_or_create(stack.state_dir)
    admin, scheduler, api = (
        tokens["JOBSCOPE_ADMIN_TOKEN"],
        tokens["JOBSCOPE_SCHEDULER_TOKEN"],
        (stack.api_url),
    )
    device, job_id = f"upgrade-{uuid.uuid4().hex[:6]}", f"up-{uuid.uuid4().hex[:6]}"
    now = time.time()
    job = {"job_id": job_id, "nodes": [device], "user": "alice", "state": "terminated"}
    job |= {"start": now - 7500, "end": now - 6900}  # readings of two hours back: rolled up
    done = httpx.post(f"{api}/api/jobs", json=job, headers=auth(scheduler), timeout=30)
    assert done.status_code in (201, 202), done.text
    push(api, admin, device, 0, 100, ago=7200)
    kept, revoked = mint(api, admin), mint(api, admin)
    jti = decode(tokens["JOBSCOPE_TOKEN_SECRET"], revoked).jti
    assert httpx.delete(f"{api}/api/tokens/{jti}", headers=auth(admin), timeout=30).is_success
    stored(client, device, 100)
    wait_for_rollups(client, device, 100)
    record = "SELECT count() FROM job_records FINAL WHERE job_id = {j:String}"
    wait_until(
        lambda: client.command(record, parameters={"j": job_id}) == 1, 120, "the job's record"
    )
    for name in ("api", "producers"):
        services.process(stack, name).stop(timeout=30)
    wait_until(lambda: caught_up(stack), 60, "ClickHouse to store everything published")
    tables = {"metrics": device, "metrics_1m": device, "metrics_1h": device}
    tables |= {"jobs": job_id, "job_records": job_id}
    kept_columns = {table: columns(client, table) for table in tables}
    before = {t: rows(client, t, key, kept_columns[t]) for t, key in tables.items()}
    polled = rows(client, "metrics", "upgrade-polled", kept_columns["metrics"])
    assert len(before["metrics"]) == 100 and polled

    run_stack(REPO_ROOT, stack, "down")  # this release's down, as docs/operations.md says
    # While ClickHouse is down, readings published to Kafka wait there.
    services.start_kafka(stack)
    down = f"{device}-down"
    waiting = [Reading(int((now - 300 + i) * 1e6), down, "while_down", float(i)) for i in range(50)]
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "acks": "all"})
    producer.produce(topics.READINGS.name, key=down.encode(), value=pack(waiting).payload)
    assert producer.flush(30) == 0
    del producer  # its connection closes before the broker stops
    services.stop_all(stack)

    run_stack(REPO_ROOT, stack, "up")
    client = services.clickhouse_client(stack, "jobscope")
    applied = client.query("SELECT name FROM schema_migrations").result_rows
    assert {row[0] for row in applied} == {p.name for p in MIGRATIONS_DIR.glob("*.sql")}
    for table, key in tables.items():
        assert rows(client, table, key, kept_columns[table]) == before[table], table
    now_polled = rows(client, "metrics", "upgrade-polled", kept_columns["metrics"])
    assert [row for row in polled if row not in now_polled] == []
    readings = (
        "SELECT count() FROM metrics WHERE device_id = {d:String} AND metric_id = 'while_down'"
    )
    wait_until(
        lambda: client.command(readings, parameters={"d": down}) >= 50,
        60,
        "the readings published while ClickHouse was down",
    )
    assert client.command(readings, parameters={"d": down}) == 50
    assert can_mint(stack.api_url, kept) == 403 and can_mint(stack.api_url, revoked) == 401
    assert secrets.load_or_create(stack.state_dir) == tokens
