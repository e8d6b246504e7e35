"""`remote_write_samples_per_core_s`: Prometheus remote_write received by jobscope's gateway
(`POST /api/v1/write`: decoded, checked, published to Kafka; the API process's CPU, its
Kafka client included) beside VictoriaMetrics receiving the same writes
(`/api/v1/write`, its whole process: decoded and stored), in the same run; then
`line_protocol_samples_per_core_s`: the same samples as Influx line protocol (one field per
line, millisecond timestamps) to jobscope's `POST /api/v2/write` and VictoriaMetrics' `/write`.

The writes are what Prometheus sends (protocol 1.0, snappy-compressed protobuf
`WriteRequest`s of `SAMPLES_PER_WRITE` samples, its default `max_samples_per_send`): SERIES
series (node_exporter-like names and labels over NODES nodes) with recent millisecond
timestamps, each write its own timestamps, all encoded before the clock starts. CLIENTS
clients post them back to back for the window; a receiver's samples per CPU-second = the
samples it answered 2xx for / the CPU seconds (user + system, all threads) its process
used over the window (bench/polling/cpu.py). Goal: jobscope >= 1.5x VictoriaMetrics per
CPU-second (it only decodes, validates and forwards). Every answer is checked: jobscope
accepts every sample (its answer counts them), VictoriaMetrics answers 204.
"""

from __future__ import annotations

import logging
import shutil
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cramjam
import httpx

from bench.polling.cpu import cpu_seconds
from bench.polling.producer import PollingStack
from bench.systems.victoriametrics import BINARY
from stack import secrets, services
from stack.processes import ManagedProcess, free_port, wait_until
from stack.transient import STARTING

log = logging.getLogger("bench.remote_write")
NODES = 50
METRICS = 20
SERIES = NODES * METRICS
SAMPLES_PER_WRITE = 2000  # Prometheus' max_samples_per_send
CLIENTS = 2
WINDOW_S = {True: 5.0, False: 30.0}
GOAL = 1.5
HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
    "User-Agent": "jobscope-bench",
}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def write_request(series: list[tuple[dict[str, str], list[tuple[float, int]]]]) -> bytes:
    """A `prometheus.WriteRequest` of (labels, [(value, unix ms)]) series, snappy-compressed."""
    body = bytearray()
    for labels, samples in series:
        ts = b"".join(
            _field(1, _field(1, k.encode()) + _field(2, v.encode()))
            for k, v in sorted(labels.items())
        )
        for value, ms in samples:
            ts += _field(2, b"\x09" + struct.pack("<d", value) + b"\x10" + _varint(ms))
        body += _field(1, ts)
    return bytes(cramjam.snappy.compress_raw(bytes(body)))


def writes(count: int, start_ms: int) -> list[bytes]:
    """`count` writes of SAMPLES_PER_WRITE samples, SERIES series in turn, 1 s apart."""
    per_series = SAMPLES_PER_WRITE // SERIES or 1
    out = []
    for w in range(count):
        series = []
        for s in range(SERIES):
            node, metric = s // METRICS, s % METRICS
            labels = {
                "__name__": f"node_bench_{metric:02d}",
                "instance": f"bench-node-{node:03d}:9100",
                "job": "node",
                "cpu": str(metric % 4),
            }
            ms = start_ms + (w * per_series) * 1000
            series.append((labels, [(float(w + s + i), ms + i * 1000) for i in range(per_series)]))
        out.append(write_request(series))
    return out


def lines(count: int, start_ms: int) -> list[bytes]:
    """The same samples as `writes`, as Influx line protocol (one field per line, ms)."""
    per_series = SAMPLES_PER_WRITE // SERIES or 1
    out = []
    for w in range(count):
        text = []
        for s in range(SERIES):
            node, metric = s // METRICS, s % METRICS
            ms = start_ms + (w * per_series) * 1000
            for i in range(per_series):
                text.append(
                    f"node_bench,host=bench-node-{node:03d},cpu={metric % 4} "
                    f"m{metric:02d}={float(w + s + i)} {ms + i * 1000}"
                )
        out.append(("\n".join(text) + "\n").encode())
    return out


def _post_for(
    url: str, headers: dict[str, str], bodies: list[bytes], seconds: float, ok: Callable
) -> int:
    """Post `bodies` in turn from CLIENTS threads for `seconds`; the samples answered ok."""
    sent = [0] * CLIENTS
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        with httpx.Client(timeout=60, headers=headers) as http:
            i = k
            while time.monotonic() < stop:
                response = http.post(url, content=bodies[i % len(bodies)])
                sent[k] += ok(response)
                i += CLIENTS

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(sent)


def _rate(
    pid: int, url: str, headers: dict[str, str], bodies: list[bytes], seconds: float, ok: Callable
) -> dict[str, float]:
    """Samples per CPU-second of the process `pid` receiving `bodies` for `seconds`."""
    before, began = cpu_seconds(pid), time.monotonic()
    samples = _post_for(url, headers, bodies, seconds, ok)
    cpu, wall = cpu_seconds(pid) - before, time.monotonic() - began
    return {"samples": samples, "cpu_s": cpu, "wall_s": wall, "per_core_s": samples / cpu}


def _jobscope_ok(response: httpx.Response) -> int:
    if response.status_code != 200:
        raise RuntimeError(f"jobscope answered {response.status_code}: {response.text[:300]}")
    accepted = response.json()["accepted"]
    if accepted != SAMPLES_PER_WRITE:
        raise RuntimeError(f"jobscope accepted {accepted} of {SAMPLES_PER_WRITE} samples")
    return accepted


def _line_ok(response: httpx.Response) -> int:
    if response.status_code != 204:
        raise RuntimeError(f"jobscope answered {response.status_code}: {response.text[:300]}")
    accepted = int(response.headers["X-Jobscope-Accepted"])
    if accepted != SAMPLES_PER_WRITE:
        raise RuntimeError(f"jobscope accepted {accepted} of {SAMPLES_PER_WRITE} fields")
    return accepted


def _vm_ok(response: httpx.Response) -> int:
    if response.status_code != 204:
        raise RuntimeError(f"VictoriaMetrics answered {response.status_code}: {response.text}")
    return SAMPLES_PER_WRITE


def measure(state_dir: Path, quick: bool, stack: PollingStack) -> dict[str, Any]:
    """The same writes to the API of `stack` and to a VictoriaMetrics of this benchmark's own;
    keys for the top level of bench-results.json."""
    if shutil.which(BINARY) is None:
        raise RuntimeError(f"{BINARY} is not installed: run bench/install-peers.sh")
    seconds = WINDOW_S[quick]
    bodies = writes(64, int(time.time() * 1000) - 3_600_000)
    work = state_dir.resolve() / "remote-write"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    vm_port = free_port()
    vm = ManagedProcess("victoria-metrics", work / "pids", work / "logs")
    try:
        settings = stack.need("kafka", "clickhouse", "api")
        token = secrets.load_or_create(settings.state_dir)["JOBSCOPE_ADMIN_TOKEN"]
        vm.start(
            [
                BINARY,
                f"-storageDataPath={work / 'victoria-metrics'}",
                f"-httpListenAddr=127.0.0.1:{vm_port}",
                "-retentionPeriod=100y",
            ],
            env={},
            cwd=work,
        )
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{vm_port}/health", timeout=2).status_code == 200,
            60,
            "VictoriaMetrics",
            transient=STARTING,
        )
        api_url = f"http://{settings.host}:{settings.api_port}/api/v1/write"
        jobscope_headers = {**HEADERS, "Authorization": f"Bearer {token}"}
        vm_url = f"http://127.0.0.1:{vm_port}/api/v1/write"
        for url, headers, ok in (
            (api_url, jobscope_headers, _jobscope_ok),
            (vm_url, HEADERS, _vm_ok),
        ):
            _post_for(url, headers, bodies[:4], 1.0, ok)  # warm: connections, first series
        api_pid = services.process(settings, "api").pid()
        vm_pid = vm.pid()
        assert api_pid is not None and vm_pid is not None
        proto = {
            "jobscope": _rate(api_pid, api_url, jobscope_headers, bodies, seconds, _jobscope_ok),
            "victoriametrics": _rate(vm_pid, vm_url, HEADERS, bodies, seconds, _vm_ok),
        }
        text = lines(64, int(time.time() * 1000) - 1_800_000)
        line_headers = {"Content-Type": "text/plain", "Authorization": f"Token {token}"}
        line_url = f"http://{settings.host}:{settings.api_port}/api/v2/write?precision=ms"
        vm_line_url = f"http://127.0.0.1:{vm_port}/write?precision=ms"
        _post_for(line_url, line_headers, text[:4], 1.0, _line_ok)
        line = {
            "jobscope": _rate(api_pid, line_url, line_headers, text, seconds, _line_ok),
            "victoriametrics": _rate(vm_pid, vm_line_url, {}, text, seconds, _vm_ok),
        }
    finally:
        vm.stop()
    out: dict[str, Any] = {"remote_write_goal": GOAL}
    for name, figures in (("remote_write", proto), ("line_protocol", line)):
        ours, theirs = figures["jobscope"]["per_core_s"], figures["victoriametrics"]["per_core_s"]
        log.info(
            "%s: jobscope %.0f samples per CPU-second, VictoriaMetrics %.0f: %.2fx",
            name,
            ours,
            theirs,
            ours / theirs,
        )
        out |= {
            f"{name}_samples_per_core_s": ours,
            f"{name}_victoriametrics_samples_per_core_s": theirs,
            f"{name}_vs_victoriametrics": ours / theirs,
            name: {**figures, "window_s": seconds},
        }
    return out
