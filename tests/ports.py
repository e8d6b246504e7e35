"""The suite's one port table: every fixed port a test listens on, by name.

A test session owns one block of `BLOCK` ports. Without pytest-xdist the block starts at
`FIRST` + JOBSCOPE_TEST_PORT_SHIFT; each xdist worker (`gwN`) owns the N-th block after it,
so workers never share a port. Blocks lie below Linux's ephemeral range (32768 and up,
where the kernel picks client ports and `free_port()`'s) and away from the ports of
`make up` (8000, 8088, 8123, 8180, 9001, 9092-9093, 9464, 11090, 11161-11162, 11400,
12001-12002), so the suite runs beside a stack of `make up` and beside another session
shifted by a whole number of blocks times the workers. tests/stack/test_ports.py checks the table.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stack.config import REPO_ROOT, StackSettings

FIRST = 20000
BLOCK = 100
MAX_WORKERS = 8

# name: (offset in the block, how many consecutive ports)
TABLE: dict[str, tuple[int, int]] = {
    # the session's stack: Kafka, its controller, ClickHouse, the API, the producers' /metrics
    "stack": (0, 5),
    "disk-full": (5, 5),  # tests/reliability/test_disk_full.py's own stack
    # tests/stack/test_stack_lifecycle.py: `make up` in a subprocess; also the stack of
    # tests/stack/test_service_install.py's units (each stops its stack before it ends)
    "lifecycle": (10, 5),
    "sasl": (15, 5),  # tests/stack/test_kafka_sasl.py
    "kafka-cluster": (20, 9),  # 3 KRaft nodes (port pairs), ClickHouse, API, /metrics
    "multisite": (29, 9),  # 2 sites' and the centre's brokers (pairs), ClickHouse, API, /metrics
    "connect": (38, 2),  # Kafka Connect's REST port, OAR's PostgreSQL
    "kubernetes": (40, 3),  # etcd, its peer port, kube-apiserver
    "superset": (43, 1),
    "node-exporter": (44, 1),
    "prometheus": (45, 4),  # an OpenMetrics exporter, a closed port, a second one, a broken one
    "wattmeter-plugin": (49, 10),  # control port, 5 meters, a closed port
    "wattmetre-simulator": (59, 3),  # control port, a v2 meter, a v3 meter
    "snmp-agents": (62, 3),  # snmpsim, snmpd (v3), snmpd (v2c): UDP
    "snmpsim": (65, 1),  # tests/stack/test_snmp_simulators.py's own snmpsim: UDP
    "sasl-connect": (66, 1),  # Kafka Connect's REST port in tests/stack/test_kafka_sasl.py
    "read-policy": (67, 1),  # tests/api/test_read_policy.py: an API under JOBSCOPE_READ_POLICY=jobs
    "sql-users": (68, 1),  # tests/clickhouse/test_sql_users_policy.py: its own ClickHouse server
    "oidc": (69, 2),  # tests/identity/: Keycloak, an API that trusts it
    "login-other-api": (71, 1),  # tests/identity/test_login.py: an API the token must not reach
    "superset-oidc": (72, 1),  # tests/superset/test_oidc_login.py: Superset logging in by OIDC
    "report-policy": (73, 1),  # tests/api/test_report.py: an API under JOBSCOPE_READ_POLICY=jobs
    "job-records": (74, 1),  # tests/api/test_job_records.py: an API refreshing records fast
    "remote-write": (75, 3),  # tests/api/test_remote_write.py: node_exporter, API, Prometheus
    "exporters": (78, 1),  # tests/producers/plugins/test_prometheus_exporters.py
    # tests/api/test_energy_sharing.py: APIs under two policies, and one with a per-node map
    "energy-sharing": (79, 3),
    "monitoring": (82, 1),  # tests/monitoring/test_scraped.py: Prometheus scraping every part
    "backup": (83, 5),  # tests/stack/test_backup_restore.py: the stack backed up and restored
    # tests/api/test_otel_collector.py: an API, the Collector's OTLP receiver, its own /metrics
    "otel-collector": (90, 3),
    "upgrade": (93, 5),  # tests/stack/test_upgrade.py: the previous release's stack, then this
    # tests/stack/test_service_install.py's optional units: Superset, Kafka Connect's REST port
    "service-optional": (98, 2),
}


def worker_index() -> int:
    """0 without xdist; N on worker gwN."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw"))


def block_start() -> int:
    return FIRST + int(os.environ.get("JOBSCOPE_TEST_PORT_SHIFT", "0")) + worker_index() * BLOCK


def ports(name: str) -> list[int]:
    """The ports of `name` in this session's (or worker's) block."""
    offset, count = TABLE[name]
    return [block_start() + offset + i for i in range(count)]


def port(name: str, index: int = 0) -> int:
    return ports(name)[index]


def state_dir(name: str) -> Path:
    """A test stack's state folder, apart from every other session's and worker's."""
    return REPO_ROOT / "state" / f"test-{name}-{port(name)}"


def stack_settings(name: str, **settings: Any) -> StackSettings:
    """A StackSettings of `name`'s ports (Kafka, controller, ClickHouse, API, /metrics: the
    last five of its range, Kafka's node pairs first) and state folder."""
    first, *_, clickhouse, api, metrics = ports(name)
    return StackSettings(
        state_dir=state_dir(name),
        kafka_port=first,
        kafka_controller_port=first + 1,
        clickhouse_port=clickhouse,
        api_port=api,
        producer_metrics_port=metrics,
        **settings,
    )


def stack_environ(settings: StackSettings) -> dict[str, str]:
    """The variables giving a `python -m stack` subprocess `settings`' state folder, ports,
    Kafka heap and devices file."""
    return {
        "JOBSCOPE_STATE_DIR": str(settings.state_dir),
        "JOBSCOPE_KAFKA_PORT": str(settings.kafka_port),
        "JOBSCOPE_KAFKA_CONTROLLER_PORT": str(settings.kafka_controller_port),
        "JOBSCOPE_KAFKA_HEAP": settings.kafka_heap,
        "JOBSCOPE_CLICKHOUSE_PORT": str(settings.clickhouse_port),
        "JOBSCOPE_API_PORT": str(settings.api_port),
        "JOBSCOPE_PRODUCER_METRICS_PORT": str(settings.producer_metrics_port),
        "JOBSCOPE_DEVICES_FILE": str(settings.devices_file),
    }


@contextmanager
def own_stack(name: str, devices: Path, device_id: str) -> Iterator[StackSettings]:
    """A stack of its own for `name` (stopped and its state deleted first, stopped after),
    whose producer polls one tester device `device_id` every 500 ms."""
    from stack import services  # the stack's processes: only the tests that start one

    devices.write_text(
        f"- {{name: polled, device_id: {device_id}, url: 'tester://?metrics=2', "
        "update_every: 500}\n"
    )
    settings = stack_settings(name, kafka_heap="512m", devices_file=devices)
    services.stop_all(settings)
    shutil.rmtree(settings.state_dir, ignore_errors=True)
    try:
        yield settings
    finally:
        services.stop_all(settings)
