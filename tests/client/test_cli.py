"""The `jobscope` command, run as a subprocess against the real API: exports parsed back,
tables, progress on a pseudo-terminal only, errors as one line."""

from __future__ import annotations

import csv
import json
import os
import pty
import select
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from jobscope.client import Client
from stack.processes import wait_until
from tests.client.conftest import Scenario

JOBSCOPE = Path(sys.executable).with_name("jobscope")


def run(api_url: str, *args: str, stdin: bytes = b"", **env: str) -> subprocess.CompletedProcess:
    if not JOBSCOPE.exists():
        pytest.fail(f"{JOBSCOPE} missing: `make venv` installs it (pip install -e .)")
    return subprocess.run(
        [str(JOBSCOPE), "--api", api_url, *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "250", **env},
        check=False,
    )


def bmc_rows(scenario: Scenario) -> list[tuple[str, str, str, float, dict[str, str]]]:
    """The inserted bmc_* readings, as the API's text formats write them, API order."""
    rows = [
        (t.strftime("%Y-%m-%dT%H:%M:%S.%f+00:00"), d, m, v, lab)
        for t, d, m, v, lab in scenario.rows
        if m.startswith("bmc_")
    ]
    return sorted(rows, key=lambda r: r[:3])


def test_get_csv_to_a_file(api_url: str, scenario: Scenario, tmp_path: Path) -> None:
    out = tmp_path / "out.csv"
    done = run(api_url, "get", "--job", scenario.job_id, "--metrics", "bmc_*", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout == done.stderr == b""  # not a terminal: no progress
    with out.open(newline="") as f:
        got = [
            (
                r["timestamp"],
                r["device_id"],
                r["metric_id"],
                float(r["value"]),
                json.loads(r["labels"]),
            )
            for r in csv.DictReader(f)
        ]
    assert got == bmc_rows(scenario)


def test_get_parquet(api_url: str, scenario: Scenario, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    done = run(
        api_url,
        "get",
        "--job",
        scenario.job_id,
        "--metrics",
        "bmc_*",
        "--format",
        "parquet",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    table = pq.read_table(out)
    got = [
        (
            r["timestamp"].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00"),
            r["device_id"],
            r["metric_id"],
            r["value"],
            dict(r["labels"]),
        )
        for r in table.to_pylist()
    ]
    assert got == bmc_rows(scenario)


def test_get_ndjson_to_stdout(api_url: str, scenario: Scenario) -> None:
    done = run(
        api_url,
        "get",
        "--job",
        scenario.job_id,
        "--metrics",
        "bmc_power_watt",
        "--format",
        "ndjson",
    )
    assert done.returncode == 0 and done.stderr == b""
    got = [json.loads(line) for line in done.stdout.splitlines()]
    expected = [r for r in bmc_rows(scenario) if r[2] == "bmc_power_watt"]
    assert [
        (r["timestamp"], r["device_id"], r["metric_id"], r["value"], r["labels"]) for r in got
    ] == expected


def test_progress_on_a_terminal(api_url: str, scenario: Scenario, tmp_path: Path) -> None:
    """On a pseudo-terminal the export shows its bar with the readings and bytes written."""
    out = tmp_path / "out.csv"
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [str(JOBSCOPE), "--api", api_url, "get", "--job", scenario.job_id, "-o", str(out)],
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
        env={**os.environ, "TERM": "xterm", "COLUMNS": "200"},
    )
    os.close(terminal)
    shown = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 1)
        if ready:
            try:
                data = os.read(controller, 65536)
            except OSError:  # the terminal closed: the process exited
                break
            if not data:
                break
            shown += data
    os.close(controller)
    assert process.wait(timeout=30) == 0, shown
    text = shown.decode(errors="replace")
    assert f"{len(scenario.rows):,} readings" in text, text
    assert f"{out.stat().st_size / 1000:.1f}" in text, text  # bytes written, in kB


def test_jobs_table(api_url: str, scenario: Scenario) -> None:
    done = run(api_url, "jobs", "--user", scenario.user, "--state", "terminated")
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    assert scenario.job_id in text and ",".join(scenario.nodes) in text
    none = run(api_url, "jobs", "--user", f"{scenario.user}-nobody")
    assert none.returncode == 0 and scenario.job_id not in none.stdout.decode()


def test_summary_table_with_energy(api_url: str, scenario: Scenario) -> None:
    done = run(api_url, "summary", scenario.job_id)
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    summary = Client(api_url).summary(scenario.job_id)
    assert "energy (J)" in text and "energy total (J)" in text
    for energy in summary["energy"]:
        assert energy["node"] in text and f"{energy['joules']:.6g}" in text
    assert f"{summary['energy_total'][0]['joules']:.6g}" in text


def test_api_error_is_one_line(api_url: str, scenario: Scenario) -> None:
    done = run(api_url, "get", "--job", scenario.job_id, "--start-time", "soonish")
    assert done.returncode == 1
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and "400" in lines[0] and "start_time" in lines[0], lines
    missing = run(api_url, "summary", f"{scenario.job_id}-absent")
    assert missing.returncode == 1
    lines = missing.stderr.decode().splitlines()
    assert len(lines) == 1 and "404" in lines[0] and f"{scenario.job_id}-absent" in lines[0]


def test_connection_refused_names_the_url() -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        done = subprocess.run(  # the URL from the environment this time
            [str(JOBSCOPE), "jobs"],
            capture_output=True,
            timeout=30,
            check=False,
            env={**os.environ, "JOBSCOPE_API": url},
        )
    assert done.returncode == 1
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and f"cannot reach the jobscope API at {url}" in lines[0], lines


def test_token_create_and_push(
    api_url: str, api_tokens: dict[str, str], post_job: Any, tmp_path: Path
) -> None:
    """An admin creates a pusher token; its user pushes readings for the node of a running
    job of theirs (a JSON array file, then NDJSON on stdin); `get` returns them."""
    prefix = f"push-{uuid.uuid4().hex[:8]}"
    node, user = f"{prefix}-node", f"{prefix}-user"
    start = datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=5)
    post_job(
        job_id=f"{prefix}-job",
        user=user,
        nodes=[node],
        start=start.isoformat() + "Z",
        state="running",
    )
    created = run(
        api_url,
        "--token",
        api_tokens["admin"],
        "token",
        "create",
        "--user",
        user,
        "--role",
        "pusher",
    )
    assert created.returncode == 0, created.stderr
    token = created.stdout.decode().strip()
    assert token and "\n" not in token
    now = datetime.now(UTC).replace(microsecond=0)
    readings = [
        {
            "timestamp": (now - timedelta(seconds=i)).isoformat(),
            "device_id": node,
            "metric_id": "app_phase",
            "value": float(i),
        }
        for i in range(4)
    ]
    array = tmp_path / "readings.json"
    array.write_text(json.dumps(readings[:2]))
    pushed = run(api_url, "--token", token, "push", str(array))
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout.decode().strip() == "2 readings accepted"
    ndjson = "".join(json.dumps(r) + "\n" for r in readings[2:]).encode()
    piped = run(api_url, "push", stdin=ndjson, JOBSCOPE_TOKEN=token)
    assert piped.returncode == 0, piped.stderr
    refused = run(api_url, "push", stdin=ndjson)  # no token
    assert refused.returncode == 1 and "401" in refused.stderr.decode()
    client = Client(api_url)
    window = {
        "start_time": (now - timedelta(minutes=1)).isoformat(),
        "end_time": (now + timedelta(minutes=1)).isoformat(),
    }
    wait_until(
        lambda: len(client.metrics(devices=node, **window)) == 4,
        timeout=30,
        what="the pushed readings in ClickHouse",
    )
    frame = client.metrics(devices=node, **window)
    assert sorted(frame["value"]) == [0.0, 1.0, 2.0, 3.0]
    assert {lab.get("source") for lab in frame["labels"]} == {f"user:{user}"}


def test_tail_replays_an_ended_job_as_ndjson_and_exits(api_url: str, scenario: Scenario) -> None:
    done = run(
        api_url,
        "tail",
        "--job",
        scenario.job_id,
        "--since",
        scenario.start.isoformat(),
        "--metrics",
        "bmc_*",
        "--format",
        "ndjson",
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.decode().splitlines()]
    got = [(r["timestamp"], r["device_id"], r["metric_id"], r["value"], r["labels"]) for r in rows]
    assert got == bmc_rows(scenario)
    assert f"job {scenario.job_id} has ended" in done.stderr.decode()


def test_tail_prints_a_running_jobs_readings_as_they_arrive(
    api_url: str, api_tokens: dict[str, str]
) -> None:
    """A running job; readings pushed after `jobscope tail` started show up on its stdout."""
    prefix = f"tail-{uuid.uuid4().hex[:6]}"
    node = f"{prefix}-n1"
    admin = Client(api_url, api_tokens["admin"])
    start = datetime.now(UTC) - timedelta(minutes=1)
    admin._json(
        "POST",
        "/api/jobs",
        json={"job_id": prefix, "nodes": [node], "start": start.isoformat(), "state": "running"},
    )
    process = subprocess.Popen(
        [str(JOBSCOPE), "--api", api_url, "tail", "--job", prefix],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    os.set_blocking(process.stdout.fileno(), False)
    out = b""

    def printed(metric: str) -> bool:
        """Push one reading now (the stream shows what arrives once it is open), then take
        what tail printed so far."""
        nonlocal out
        reading = {"timestamp": time.time(), "device_id": node, "metric_id": metric, "value": 42.5}
        admin.push([reading])
        if select.select([process.stdout], [], [], 0.5)[0]:
            out += process.stdout.read() or b""
        return metric.encode() in out

    try:
        wait_until(lambda: printed("app_phase_total"), 60, "the pushed reading in tail's output")
    finally:
        process.terminate()
        process.wait(10)
    line = next(ln for ln in out.decode().splitlines() if "app_phase_total" in ln)
    assert node in line and "42.5" in line and "source=user:admin" in line
