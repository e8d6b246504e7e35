"""`python -m stack backup` and `restore` (stack/backup.py) on a stack of the test's own: a
full backup and an incremental one over it are taken while a producer polls and the API
takes pushes; then the ClickHouse disk and the secrets are lost (everything in the state
directory but the broker's own), `python -m stack restore` brings back the incremental
backup, and every reading, job, job record, audit entry and rejected message is identical to
what the stack held before the loss: what was published after the backup (still in Kafka) is
ingested once, and ingestion goes on after the restore. Tokens minted before still work, a
revoked one stays revoked."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from api.infra.tokens import decode
from kafka import topics
from stack import backup, kafka_broker, secrets, services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import wait_until
from tests import ports

pytestmark = pytest.mark.slow

# Each table a site keeps, as a query of all its rows (FINAL: as readers see it).
TABLES = {
    "metrics": "SELECT * FROM metrics",
    "jobs": "SELECT * FROM jobs FINAL",
    "job_records": "SELECT * FROM job_records FINAL",
    "audit_log": "SELECT * FROM audit_log",
    "ingest_errors": "SELECT * FROM ingest_errors",
    "schema_migrations": "SELECT name, checksum FROM schema_migrations",
}
# The consumer groups of ClickHouse's Kafka tables (clickhouse/migrations), and their topics.
GROUPS = {
    "jobscope-clickhouse": topics.READINGS.name,
    "jobscope-clickhouse-jobs": topics.JOBS.name,
    "jobscope-clickhouse-records": topics.JOB_RECORDS.name,
    "jobscope-clickhouse-audit": topics.AUDIT.name,
}


def dump(client: Client) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, sorted (row order on disk is not part of the data)."""
    return {
        name: sorted((tuple(row) for row in client.query(sql).result_rows), key=repr)
        for name, sql in TABLES.items()
    }


def caught_up(settings: StackSettings) -> bool:
    """ClickHouse has stored everything its groups can read from Kafka."""
    security = kafka_broker.client_settings(settings).kafka_security()
    return all(
        topics.consumer_lag(settings.kafka_bootstrap, group, topic, security=security) == 0
        for group, topic in GROUPS.items()
    )


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def push(api: str, token: str, device: str, first: int, count: int, ago: float = 600) -> None:
    """Readings `first`..`first+count-1` of one series, each value its number, from `ago`
    seconds back."""
    now = time.time()
    body = [
        {"timestamp": now - ago + i / 1000, "device_id": device, "metric_id": "seq", "value": i}
        for i in range(first, first + count)
    ]
    response = httpx.post(f"{api}/api/metrics", json=body, headers=auth(token), timeout=30)
    assert response.status_code in (200, 202), response.text


def pushed(client: Client, device: str) -> list[float]:
    """The values of `device`'s series, every row (a duplicate counts twice)."""
    rows = client.query(
        "SELECT value FROM metrics WHERE device_id = {d:String} ORDER BY value",
        parameters={"d": device},
    ).result_rows
    return [row[0] for row in rows]


def stored(client: Client, device: str, count: int) -> None:
    wait_until(lambda: len(pushed(client, device)) >= count, 60, f"{count} readings of {device}")


def run_stack(settings: StackSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**secrets.public_environ(), **ports.stack_environ(settings)}
    return subprocess.run(
        [sys.executable, "-m", "stack", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture
def backups() -> Iterator[Path]:
    """A folder for the backups beside the test's state (not under /tmp: pytest resets the
    mode of its temporary root at each session, and with it the ACL that lets the ClickHouse
    account, when the stack runs as root, reach a backup there)."""
    folder = ports.state_dir("backup").with_name(ports.state_dir("backup").name + "-backups")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, mode=0o700)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[StackSettings]:
    with ports.own_stack("backup", tmp_path / "devices.yaml", "backup-polled") as settings:
        yield settings


def start_storage(settings: StackSettings) -> Client:
    services.start_kafka(settings)
    services.start_clickhouse(settings)
    return services.clickhouse_client(settings, "jobscope")


def start_ingestion(settings: StackSettings) -> str:
    services.start_producers(settings)
    return services.start_api(settings, env={"JOBSCOPE_RECORDS_INTERVAL_S": "0.5"})


def mint(api: str, admin: str) -> str:
    asked = {"user": "mallory", "role": "pusher", "ttl_days": 1}
    response = httpx.post(f"{api}/api/tokens", json=asked, headers=auth(admin), timeout=30)
    assert response.status_code == 201, response.text
    return response.json()["token"]


def can_mint(api: str, token: str) -> int:
    """403 for a valid pusher token (it may not mint), 401 once revoked."""
    asked = {"user": "x", "role": "pusher"}
    return httpx.post(f"{api}/api/tokens", json=asked, headers=auth(token), timeout=30).status_code


def test_backup_wipe_restore_gives_identical_data(stack: StackSettings, backups: Path) -> None:
    client = start_storage(stack)
    api = start_ingestion(stack)
    tokens = secrets.load_or_create(stack.state_dir)
    admin, scheduler = tokens["JOBSCOPE_ADMIN_TOKEN"], tokens["JOBSCOPE_SCHEDULER_TOKEN"]
    device = f"backup-{uuid.uuid4().hex[:6]}"
    job_id = f"bk-{uuid.uuid4().hex[:6]}"
    now = time.time()
    job = {"job_id": job_id, "nodes": [device], "user": "alice", "start": now - 900}
    running = {**job, "state": "running"}
    done = httpx.post(f"{api}/api/jobs", json=running, headers=auth(scheduler), timeout=30)
    assert done.status_code in (201, 202), done.text
    push(api, admin, device, 0, 100)
    ended = {**job, "state": "terminated", "end": now - 60}
    done = httpx.post(f"{api}/api/jobs", json=ended, headers=auth(scheduler), timeout=30)
    assert done.status_code in (201, 202), done.text
    kept, revoked = mint(api, admin), mint(api, admin)
    jti = decode(tokens["JOBSCOPE_TOKEN_SECRET"], revoked).jti
    response = httpx.delete(f"{api}/api/tokens/{jti}", headers=auth(admin), timeout=30)
    assert response.status_code == 200, response.text
    stored(client, device, 100)
    wait_until(
        lambda: (
            client.command(
                "SELECT count() FROM job_records FINAL WHERE job_id = {j:String}",
                parameters={"j": job_id},
            )
            == 1
        ),
        120,
        "the job's record",
    )

    full, incremental = backups / "full", backups / "incremental"
    taken = run_stack(stack, "backup", str(full))
    assert taken.returncode == 0, taken.stdout + taken.stderr
    push(api, admin, device, 100, 100)  # after the full backup
    stored(client, device, 200)
    taken = run_stack(stack, "backup", str(incremental), "--incremental-from", str(full))
    assert taken.returncode == 0, taken.stdout + taken.stderr
    assert "incremental" in taken.stdout
    manifest = backup.load_manifest(incremental)
    assert manifest["base"] == str(full.resolve())
    assert (incremental / "secrets.env").stat().st_mode & 0o777 == 0o600
    push(api, admin, device, 200, 100)  # after every backup: in Kafka alone once lost
    stored(client, device, 300)
    # ingestion stopped (what was published is stored), the state as it was before the loss
    for name in ("api", "producers"):
        services.process(stack, name).stop(timeout=30)
    wait_until(lambda: caught_up(stack), 60, "ClickHouse to store everything published")
    before = dump(client)
    assert len(pushed(client, device)) == 300
    services.stop_all(stack)

    # The ClickHouse disk and the secrets are lost; the broker (its own disk) is not.
    for entry in stack.state_dir.iterdir():
        if entry.name != "kafka":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    restored = run_stack(stack, "restore", str(incremental))
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "resumes right after the backup" in restored.stdout, restored.stdout
    assert (stack.state_dir / "secrets.env").stat().st_mode & 0o777 == 0o600

    client = start_storage(stack)
    assert secrets.load_or_create(stack.state_dir) == tokens
    wait_until(lambda: caught_up(stack), 60, "ClickHouse to catch up with Kafka")
    after = dump(client)
    for name in TABLES:
        assert after[name] == before[name], f"{name} differs after the restore"
    assert pushed(client, device) == [float(i) for i in range(300)]  # no gap, no duplicate
    api = start_ingestion(stack)
    push(api, admin, device, 300, 10)  # ingestion goes on
    stored(client, device, 310)
    assert pushed(client, device) == [float(i) for i in range(310)]
    assert can_mint(api, kept) == 403 and can_mint(api, revoked) == 401
    # A read-only user cannot write a backup (the engine's allowed path is the whole disk).
    target = backups / "by-reader"
    for user in ("reader", "api"):
        with pytest.raises(DatabaseError):
            services.clickhouse_client(stack, user).command(
                f"BACKUP DATABASE default TO File('{target}')"
            )
    assert not target.exists()
    polled = client.command("SELECT count() FROM metrics WHERE device_id = 'backup-polled'")
    wait_until(
        lambda: (
            client.command("SELECT count() FROM metrics WHERE device_id = 'backup-polled'") > polled
        ),
        60,
        "the producer's readings after the restore",
    )


def test_a_restore_refuses_a_state_that_holds_a_database(
    stack: StackSettings, tmp_path: Path
) -> None:
    """A restore never overwrites a database, and needs a backup there."""
    (stack.state_dir / "clickhouse" / "store").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / backup.MANIFEST).write_text(
        '{"format": 1, "schema_migrations": [], "base": null}'
    )
    refused = run_stack(stack, "restore", str(tmp_path / "b"))
    assert refused.returncode == 1 and "holds a database" in refused.stderr, refused.stderr
    missing = run_stack(stack, "restore", str(tmp_path / "none"))
    assert missing.returncode == 1 and "holds no backup" in missing.stderr, missing.stderr
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / backup.MANIFEST).write_text(
        '{"format": 1, "schema_migrations": ["0001_create_metrics.sql", "9999_future.sql"]}'
    )
    refused = run_stack(stack, "restore", str(newer))
    assert refused.returncode == 1 and "9999_future.sql" in refused.stderr, refused.stderr
    assert (stack.state_dir / "clickhouse" / "store").is_dir()
