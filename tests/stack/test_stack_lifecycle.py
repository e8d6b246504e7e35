"""`python -m stack up|down` (what `make up` / `make down` run): everything starts, serves,
stops without leaving a process behind, and starts again on the same data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from stack import services
from stack.config import REPO_ROOT
from stack.processes import is_alive, port_in_use, wait_until
from tests import ports


def run_stack(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stack", command],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


def served(api_url: str, device: str) -> int:
    now = datetime.now(UTC).replace(tzinfo=None)
    window = {"start_time": (now - timedelta(hours=1)).isoformat(), "end_time": now.isoformat()}
    response = httpx.get(f"{api_url}/api/metrics", timeout=30, params={"devices": device, **window})
    return len(response.json()) if response.status_code == 200 else 0


def test_up_down_up(tmp_path: Path) -> None:
    settings = ports.stack_settings("lifecycle")
    state = settings.state_dir
    services.stop_all(settings)
    shutil.rmtree(state, ignore_errors=True)
    devices = tmp_path / "devices.yaml"
    devices.write_text(
        "- {name: up_value, device_id: up-1, url: 'tester://?metrics=3', update_every: 200}\n"
    )
    env = {
        **os.environ,
        "JOBSCOPE_STATE_DIR": str(state),
        "JOBSCOPE_KAFKA_PORT": str(settings.kafka_port),
        "JOBSCOPE_KAFKA_CONTROLLER_PORT": str(settings.kafka_controller_port),
        "JOBSCOPE_KAFKA_HEAP": "512m",
        "JOBSCOPE_CLICKHOUSE_PORT": str(settings.clickhouse_port),
        "JOBSCOPE_API_PORT": str(settings.api_port),
        "JOBSCOPE_PRODUCER_METRICS_PORT": str(settings.producer_metrics_port),
        "JOBSCOPE_DEVICES_FILE": str(devices),
    }
    listening = (
        settings.kafka_port,
        settings.kafka_controller_port,
        settings.clickhouse_port,
        settings.api_port,
        settings.producer_metrics_port,
    )
    try:
        up = run_stack("up", env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert settings.api_url in up.stdout and "log:" in up.stdout
        wait_until(lambda: served(settings.api_url, "up-1") >= 30, 60, "readings of up-1")
        metrics_url = f"http://{settings.host}:{settings.producer_metrics_port}/metrics"
        assert metrics_url in up.stdout
        exposed = httpx.get(metrics_url, timeout=10).text
        assert 'jobscope_producer_polls_total{device="up-1",plugin="tester"}' in exposed
        pids = {name: services.process(settings, name).pid() for name in services.STOP_ORDER}
        assert all(pids.values()), pids

        down = run_stack("down", env)
        assert down.returncode == 0, down.stdout + down.stderr
        for name, pid in pids.items():
            assert not is_alive(pid), f"{name} (pid {pid}) still running"
        assert not any(port_in_use(settings.host, p) for p in listening)
        status = run_stack("status", env)
        assert status.returncode == 3 and "stopped" in status.stdout

        up = run_stack("up", env)
        assert up.returncode == 0, up.stdout + up.stderr
        # the readings of the first run are still there, and new ones arrive
        before = served(settings.api_url, "up-1")
        wait_until(lambda: served(settings.api_url, "up-1") > before, 30, "new readings")
        served_count = served(settings.api_url, "up-1")
        assert served_count > before >= 30
    finally:
        run_stack("down", env)
    assert not any(port_in_use(settings.host, p) for p in listening)
