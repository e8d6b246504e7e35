"""GET /api/jobs/{id}/live against the real API, Kafka and ClickHouse.

Readings are published straight to the readings topic with the producers' wire format, so
each test knows exactly what the stream must show: the job's scope only (nodes, devices
labelled `_device_alias=<node>` under their own id and summed under the node), a `since=`
replay joined to the live part without gap or duplicate, the end of the stream after the
job's end, and a client that stops reading dropped without harming another.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from kafka.reading import Reading
from stack import services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import ManagedProcess, free_port, wait_until
from stack.transient import STARTING
from tests.api.conftest import Listener

ALIAS = "_device_alias"


def now_us() -> int:
    return int(time.time() * 1e6)


def iso_of(us: int) -> str:
    t = datetime(1970, 1, 1) + timedelta(microseconds=us)
    return t.isoformat(timespec="microseconds") + "+00:00"


def running_job(post_job: Callable[..., dict[str, Any]], prefix: str, nodes: list[str]) -> str:
    job_id = f"{prefix}-job"
    start = datetime.now(UTC) - timedelta(minutes=1)
    post_job(job_id=job_id, user="alice", nodes=nodes, start=start.isoformat(), state="running")
    return job_id


def key(row: dict[str, Any]) -> tuple[str, str, str, tuple[tuple[str, str], ...]]:
    return (
        row["timestamp"],
        row["device_id"],
        row["metric_id"],
        tuple(sorted(row["labels"].items())),
    )


def test_live_readings_of_the_job_scope_only(
    api_url: str,
    post_job: Callable[..., dict[str, Any]],
    publish: Callable[[list[Reading]], None],
    reader_client: Any,
) -> None:
    prefix = f"lv-{uuid.uuid4().hex[:6]}"
    n1, n2, n3, pdu = (f"{prefix}-{name}" for name in ("n1", "n2", "n3", "pdu"))
    outlets = {
        "1": {"outlet": "1", ALIAS: n1, "room": "a"},
        "2": {"outlet": "2", ALIAS: n1, "room": "a"},
        "3": {"outlet": "3", ALIAS: n3, "room": "a"},
    }
    # the PDU has been measuring the nodes before: the API knows it measures n1
    earlier = now_us() - 30_000_000
    publish([Reading(earlier, pdu, "power_watt", 1.0, dict(o)) for o in outlets.values()])
    wait_until(
        lambda: (
            reader_client.command(
                "SELECT count() FROM device_aliases WHERE device_id = {d:String}",
                parameters={"d": pdu},
            )
            > 0
        ),
        30,
        "ClickHouse to see the PDU's aliases",
    )
    job_id = running_job(post_job, prefix, [n1, n2])
    everything = Listener(api_url, job_id)
    power_only = Listener(api_url, job_id, {"metrics": "power_*"})
    for listener in (everything, power_only):
        listener.wait(lambda lst=listener: "live" in lst.names(), 30, "the stream to be live")

    t = now_us()
    publish(
        [
            Reading(t, n1, "cpu_load", 0.5, {}),
            Reading(t, n2, "cpu_load", 0.7, {"core": "all"}),
            Reading(t, n3, "cpu_load", 0.9, {}),  # not the job's
            Reading(t - 3_600_000_000, n1, "cpu_load", 0.1, {}),  # before the job
            Reading(t, pdu, "power_watt", 10.0, dict(outlets["1"])),
            Reading(t, pdu, "power_watt", 5.0, dict(outlets["2"])),
            Reading(t, pdu, "power_watt", 7.0, dict(outlets["3"])),  # measures n3
        ]
    )
    marker = Reading(t + 1, n2, "marker", 1.0, {})
    publish([marker])
    ts = iso_of(t)
    expected = {
        (ts, n1, "cpu_load", ()),
        (ts, n2, "cpu_load", (("core", "all"),)),
        (ts, pdu, "power_watt", (("outlet", "1"), ("room", "a"))),
        (ts, pdu, "power_watt", (("outlet", "2"), ("room", "a"))),
        (ts, n1, "power_watt", (("_device_orig", pdu), ("room", "a"))),
        (iso_of(t + 1), n2, "marker", ()),
    }
    everything.wait(
        lambda: (
            any(r["metric_id"] == "marker" for r in everything.rows())
            and len(everything.rows()) >= len(expected)
        ),
        30,
        "the readings published after the stream went live",
    )
    rows = everything.rows()
    assert {key(r) for r in rows} == expected
    assert len(rows) == len(expected)
    summed = next(r for r in rows if r["device_id"] == n1 and r["metric_id"] == "power_watt")
    assert summed["value"] == 15.0
    power_only.wait(lambda: len(power_only.rows()) >= 3, 30, "the power readings")
    assert {key(r) for r in power_only.rows()} == {k for k in expected if k[2] == "power_watt"}


def test_since_replays_then_goes_live_without_gap_or_duplicate(
    api_url: str,
    post_job: Callable[..., dict[str, Any]],
    publish: Callable[[list[Reading]], None],
    reader_client: Any,
) -> None:
    """Readings flow every 20 ms per node the whole time; the stream asks for all of them
    since the job's start: each node's sequence numbers arrive once each, in one run."""
    prefix = f"ls-{uuid.uuid4().hex[:6]}"
    nodes = [f"{prefix}-n{i}" for i in range(3)]
    job_id = running_job(post_job, prefix, nodes)
    stop = threading.Event()
    sequence = {"n": 0}

    def flow() -> None:
        while not stop.is_set():
            n = sequence["n"]
            publish([Reading(now_us(), node, "seq", float(n), {}) for node in nodes])
            sequence["n"] = n + 1
            stop.wait(0.02)

    flowing = threading.Thread(target=flow, daemon=True)
    flowing.start()
    try:
        wait_until(
            lambda: (
                reader_client.command(
                    "SELECT count() FROM metrics WHERE device_id = {d:String}",
                    parameters={"d": nodes[0]},
                )
                > 50
            ),
            30,
            "readings of the job stored",
        )
        listener = Listener(api_url, job_id, {"since": 0})
        listener.wait(lambda: "live" in listener.names(), 60, "the replay to end")
        live_at = listener.names().index("live")
        replayed = dict(listener.events)["live"]["replayed"]
        assert replayed > 0 and live_at > 0
        reached = sequence["n"] + 50
        listener.wait(
            lambda: (
                min(
                    (max((r["value"] for r in listener.rows() if r["device_id"] == n), default=0))
                    for n in nodes
                )
                >= reached
            ),
            60,
            "live readings well after the switch",
        )
    finally:
        stop.set()
        flowing.join()
    rows = listener.rows()
    for node in nodes:
        values = [int(r["value"]) for r in rows if r["device_id"] == node]
        assert values == list(range(values[-1] + 1)), f"{node}: a gap or a duplicate"
    assert len(rows) >= replayed


def test_stream_ends_after_the_job_and_shows_nothing_after_its_end(
    api_url: str,
    api_tokens: dict[str, str],
    post_job: Callable[..., dict[str, Any]],
    publish: Callable[[list[Reading]], None],
) -> None:
    prefix = f"le-{uuid.uuid4().hex[:6]}"
    node = f"{prefix}-n1"
    end_us = now_us() - 2_000_000
    start = datetime.now(UTC) - timedelta(minutes=1)
    job_id = f"{prefix}-job"
    post_job(
        job_id=job_id,
        nodes=[node],
        start=start.isoformat(),
        end=iso_of(end_us),
        state="terminated",
    )
    listener = Listener(api_url, job_id)
    listener.wait(lambda: "live" in listener.names(), 30, "the stream to be live")
    publish(
        [
            Reading(end_us - 500_000, node, "late", 1.0, {}),  # reported late, in the job
            Reading(end_us + 500_000, node, "after", 2.0, {}),
        ]
    )
    listener.wait(lambda: "end" in listener.names(), 30, "the end of the stream")
    listener.thread.join(10)
    assert not listener.thread.is_alive(), "the server did not close the stream after `end`"
    assert [r["metric_id"] for r in listener.rows()] == ["late"]
    assert dict(listener.events)["end"]["end"] == iso_of(end_us)

    # a running job's stream ends once the scheduler reports the end
    running = running_job(post_job, f"{prefix}-r", [node])
    follower = Listener(api_url, running)
    follower.wait(lambda: "live" in follower.names(), 30, "the stream to be live")
    response = httpx.patch(
        f"{api_url}/api/jobs/{running}",
        json={"end": datetime.now(UTC).isoformat(), "state": "terminated"},
        headers={"Authorization": f"Bearer {api_tokens['scheduler']}"},
        timeout=30,
    )
    assert response.status_code in (200, 202), response.text
    follower.wait(lambda: "end" in follower.names(), 30, "the end of the running job's stream")


def test_unknown_job_and_bad_parameters_are_errors(api_url: str) -> None:
    assert httpx.get(f"{api_url}/api/jobs/no-such-job/live", timeout=10).status_code == 404
    response = httpx.get(f"{api_url}/api/jobs/x/live", params={"since": "yesterday"}, timeout=10)
    assert response.status_code == 400 and response.json()["parameter"] == "since"


@pytest.fixture
def small_api(clickhouse: StackSettings, tmp_path: Path) -> Iterator[tuple[str, ManagedProcess]]:
    """A second API process whose live streams hold at most 4 MiB and wait 10 s for a client: a
    third of the test's 12 MB, so a good client that a loaded machine starves a moment stays."""
    port = free_port()
    proc = services.process(clickhouse, f"api-live-{port}")
    proc.start(
        [sys.executable, "-m", "api"],
        env={
            **services.component_env(clickhouse),
            "JOBSCOPE_API_PORT": str(port),
            "JOBSCOPE_LIVE_BUFFER_BYTES": str(4 << 20),
            "JOBSCOPE_LIVE_SEND_TIMEOUT_S": "10",
        },
        cwd=REPO_ROOT,
        ports=[("127.0.0.1", port)],
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200,
            60,
            "the second API",
            transient=STARTING,
        )
        yield url, proc
    finally:
        proc.stop(timeout=30)


def test_a_client_that_stops_reading_is_dropped_and_the_other_gets_everything(
    small_api: tuple[str, ManagedProcess],
    post_job: Callable[..., dict[str, Any]],
    publish: Callable[[list[Reading]], None],
) -> None:
    url, proc = small_api
    prefix = f"ld-{uuid.uuid4().hex[:6]}"
    node = f"{prefix}-n1"
    job_id = running_job(post_job, prefix, [node])
    slow = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.sendall(f"GET /api/jobs/{job_id}/live HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    slow.settimeout(30)
    head = b""
    while b"event: live" not in head:
        head += slow.recv(4096)
    assert head.startswith(b"HTTP/1.1 200")
    good = Listener(url, job_id)
    good.wait(lambda: "live" in good.names(), 30, "the other stream to be live")

    # 12 MB of events at 10,000 readings/s: more than the slow client's socket buffers and
    # its 4 MiB hold, well within what the good client takes
    batches, per_batch = 300, 100
    label = {"padding": "x" * 300}
    base = now_us()
    for b in range(batches):
        publish(
            [
                Reading(base + b * per_batch + i, node, "v", float(i), label)
                for i in range(per_batch)
            ]
        )
        time.sleep(0.01)  # pacing the load, not waiting for an outcome
    good.wait(
        lambda: len(good.rows()) >= batches * per_batch, 60, "every reading at the good client"
    )
    assert len({r["timestamp"] for r in good.rows()}) == batches * per_batch
    wait_until(
        lambda: (
            "a client was dropped" in proc.log_file.read_text()
            or "took nothing for" in proc.log_file.read_text()
        ),
        30,
        "the slow client to be dropped",
    )
    wait_until(
        lambda: httpx.get(f"{url}/health", timeout=5).json()["live_streams"] == 1,
        30,
        "the slow client's stream to be released (the good one remains)",
    )
    slow.close()
    assert "end" not in good.names() and good.thread.is_alive()
