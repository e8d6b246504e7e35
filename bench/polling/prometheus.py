"""Prometheus scraping: samples per CPU-second of jobscope's producer and of Prometheus itself,
scraping the same node_exporter-sized targets at the same time.

The targets: TARGETS loopback HTTP endpoints (127.0.0.1, one port each), served by one
separate process (`python -m bench.polling.prometheus serve ...`, its CPU counted for
neither collector). Each answers a node_exporter exposition of a 64-CPU node: recorded at
the start of the run from Debian's node_exporter on this machine, its per-CPU series
repeated for 64 CPUs (~1,300 samples, ~1,000 on a host with few disks and interfaces; the
count is in the results), in VARIANTS versions whose values differ, served in turn, gzipped
when asked (as node_exporter does; both collectors ask).

Both collectors scrape every target every PERIOD_MS, at once, for the same window:
1. jobscope: `python -m producers` with one Kwollect-form entry per target
   (`prometheus://127.0.0.1:<port>/`: every sample, named prom_<name>), publishing to a real
   Kafka broker (the polling benchmarks' shared stack's); samples = readings received from
   the readings topic with a timestamp in the window.
2. Prometheus (Debian package `prometheus`), one static job with the same targets, writing
   its TSDB; samples = its `prometheus_tsdb_head_samples_appended_total` over the window,
   less the 5 series it adds per scrape (`up`, `scrape_duration_seconds`...).

The figure is samples over the CPU seconds (utime + stime, threads and children) of the
collector process in the window: not Kafka's, nor the target server's (printed beside).
Completeness (samples / samples served) shows each kept up. The exposition parser alone is
measured too, ours against prometheus_client's, on the same exposition: that is why the
plugin does not hand every line to prometheus_client (producers/plugins/prometheus/).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.polling.cpu import cpu_seconds
from bench.polling.producer import PollingStack, producer, tail
from bench.polling.topic import ReadingsCounter
from bench.systems.base import dpkg_version
from stack.config import REPO_ROOT
from stack.processes import free_port, free_ports, stop_child, wait_until
from stack.simulators.node_exporter import NodeExporter
from stack.transient import STARTING

log = logging.getLogger("bench.prometheus")

PERIOD_MS = 1000
CPUS = 64
VARIANTS = 8
# Keyed by quick (True) or full run (False):
TARGETS = {True: 20, False: 50}  # full: ~65,000 samples/s, half a core of the producer
MEASURE_S = {True: 6, False: 60}  # whole periods
WARMUP_S = {True: 2, False: 10}
START_TIMEOUT_S = 60.0
PROMETHEUS = "/usr/bin/prometheus"
SERIES_PER_SCRAPE = 5
"""Series Prometheus adds to each scrape's samples (up, scrape_duration_seconds,
scrape_samples_scraped, scrape_samples_post_metric_relabeling, scrape_series_added)."""
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
_CPU_LABEL = re.compile(r'\bcpu="([^"]*)"')


# -- the exposition ------------------------------------------------------------------------


def record_exposition(workdir: Path) -> str:
    """One scrape of Debian's node_exporter on this machine."""
    with (
        NodeExporter(workdir / "node-exporter", free_port()) as exporter,
        urllib.request.urlopen(exporter.url, timeout=10) as response,
    ):
        return str(response.read().decode())


def widen_to_cpus(text: str, cpus: int = CPUS) -> str:
    """The exposition of the same node with `cpus` CPUs: each family's series of its first
    CPU repeated for CPUs 0..cpus-1, those of the others dropped."""
    out: list[str] = []
    first_cpu: dict[str, str] = {}
    for line in text.splitlines():
        label = _CPU_LABEL.search(line)
        if line.startswith("#") or label is None:
            out.append(line)
            continue
        family = line.split("{", 1)[0]
        first = first_cpu.setdefault(family, label[1])
        if label[1] == first:
            out += [_CPU_LABEL.sub(f'cpu="{c}"', line, count=1) for c in range(cpus)]
    return "\n".join(out) + "\n"


def variant(text: str, k: int) -> str:
    """`text` with every value scaled by 1 + k/1000 (what changes between scrapes)."""
    if k == 0:
        return text
    lines = []
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head and not line.startswith("#"):
            with contextlib.suppress(ValueError):
                line = f"{head} {float(value) * (1 + k / 1000)!r}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def sample_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


# -- the target server (its own process) -----------------------------------------------------


async def _serve(bodies: list[tuple[bytes, bytes]], ports: list[int]) -> None:
    """Answer every GET on 127.0.0.1:<port> with the next variant, keep-alive, gzipped when
    the request accepts it."""
    turn = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal turn
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).lower()
                plain, zipped = bodies[turn % len(bodies)]
                turn += 1
                gzipped = b"accept-encoding:" in head and b"gzip" in head
                body = zipped if gzipped else plain
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: "
                    + CONTENT_TYPE
                    + b"\r\n"
                    + (b"Content-Encoding: gzip\r\n" if gzipped else b"")
                    + b"Content-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    servers = [await asyncio.start_server(handle, "127.0.0.1", port) for port in ports]
    await asyncio.gather(*(server.serve_forever() for server in servers))


def serve_main(argv: list[str]) -> None:
    """`serve FOLDER PORT...`: FOLDER holds variant-<k>.prom files."""
    folder, ports = Path(argv[0]), [int(p) for p in argv[1:]]
    texts = [p.read_bytes() for p in sorted(folder.glob("variant-*.prom"))]
    asyncio.run(_serve([(t, gzip.compress(t, 6)) for t in texts], ports))


@contextlib.contextmanager
def target_server(workdir: Path, text: str, ports: list[int]) -> Iterator[subprocess.Popen[bytes]]:
    folder = workdir / "targets"
    folder.mkdir(parents=True)
    for k in range(VARIANTS):
        (folder / f"variant-{k}.prom").write_text(variant(text, k))
    log_file = workdir / "targets.log"
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.polling.prometheus", "serve", str(folder)]
            + [str(p) for p in ports],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT,
        )
    try:
        for port in (ports[0], ports[-1]):
            wait_until(
                lambda port=port: _answers(f"http://127.0.0.1:{port}/metrics", proc, log_file),
                30,
                f"the target server on port {port}",
                transient=STARTING,
            )
        yield proc
    finally:
        stop_child(proc)


def _answers(url: str, proc: subprocess.Popen[bytes], log_file: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"{proc.args} exited:\n{tail(log_file)}")
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200


# -- the collectors ----------------------------------------------------------------------------


def start_prometheus(workdir: Path, ports: list[int]) -> tuple[subprocess.Popen[bytes], int]:
    """Prometheus scraping every target every PERIOD_MS; (process, its web port)."""
    if not Path(PROMETHEUS).exists():
        raise RuntimeError("prometheus is not installed: run bench/install-peers.sh")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    targets = ", ".join(f'"127.0.0.1:{p}"' for p in ports)
    config.write_text(
        f"global:\n  scrape_interval: {PERIOD_MS}ms\n  scrape_timeout: {PERIOD_MS}ms\n"
        f"scrape_configs:\n  - job_name: bench\n    static_configs:\n"
        f"      - targets: [{targets}]\n"
    )
    web_port = free_port()
    log_file = workdir / "prometheus.log"
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{web_port}",
                "--storage.tsdb.retention.time=1d",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited:\n{tail(log_file)}")
        return prometheus_counters(web_port)[1] > 0

    try:
        wait_until(ready, START_TIMEOUT_S, "Prometheus's first scrapes", transient=STARTING)
    except BaseException:
        stop_child(proc)
        raise
    return proc, web_port


def prometheus_counters(web_port: int) -> tuple[float, float]:
    """(samples appended to its TSDB, scrapes done) so far, from Prometheus's own /metrics."""
    url = f"http://127.0.0.1:{web_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    appended = scrapes = 0.0
    for line in text.splitlines():
        if line.startswith("prometheus_tsdb_head_samples_appended_total"):
            appended += float(line.rsplit(" ", 1)[1])
        elif line.startswith("prometheus_target_interval_length_seconds_count"):
            scrapes += float(line.rsplit(" ", 1)[1])
    return appended, scrapes


def write_devices_file(path: Path, ports: list[int]) -> Path:
    """Kwollect's form, one entry per target: every sample, named prom_<name>."""
    path.write_text(
        "".join(
            f"- {{name: prom_all, device_id: node-{i + 1:03d}, "
            f'url: "prometheus://127.0.0.1:{port}/", update_every: {PERIOD_MS}}}\n'
            for i, port in enumerate(ports)
        )
    )
    return path


# -- the parser alone -------------------------------------------------------------------------


def parse_rates(text: str, seconds: float = 0.5) -> dict[str, float]:
    """Samples per CPU-second of the exposition parser: ours, and prometheus_client's."""
    from prometheus_client.parser import text_string_to_metric_families

    from producers.plugins.prometheus.exposition import parse_text

    def rate(parse: Any) -> float:
        count, start = 0, time.process_time()
        while (spent := time.process_time() - start) < seconds:
            count += parse()
        return count / spent

    return {
        "jobscope_parser_samples_per_core_s": round(rate(lambda: len(parse_text(text)))),
        "prometheus_client_parser_samples_per_core_s": round(
            rate(lambda: sum(len(f.samples) for f in text_string_to_metric_families(text)))
        ),
    }


# -- the whole measurement -----------------------------------------------------------------------


def _cpu(pids: dict[str, int | None]) -> dict[str, float]:
    return {name: cpu_seconds(pid) if pid else 0.0 for name, pid in pids.items()}


def _window(periods: int, pids: dict[str, int | None], web_port: int) -> dict[str, Any]:
    """CPU seconds of each process and Prometheus's counters over `periods` whole periods,
    from half a period after a tick (when the tick's polls are done) to the same later."""
    period = PERIOD_MS / 1000
    time.sleep((time.time() // period + 1.5) * period - time.time())
    before, prom_before, t0 = _cpu(pids), prometheus_counters(web_port), time.time()
    time.sleep(t0 + periods * period - time.time())
    after, prom_after, t1 = _cpu(pids), prometheus_counters(web_port), time.time()
    return {
        "t0": t0,
        "t1": t1,
        "cpu": {name: after[name] - before[name] for name in pids},
        "appended": prom_after[0] - prom_before[0],
        "scrapes": prom_after[1] - prom_before[1],
    }


def measure(state_dir: Path, quick: bool, stack: PollingStack) -> dict[str, Any]:
    """The Prometheus scraping benchmark, jobscope's producer publishing to the Kafka of
    `stack`; keys for the top level of bench-results.json."""
    from stack import services

    work = state_dir.resolve() / "prometheus"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    n = TARGETS[quick]
    ports = free_ports(n)
    devices_file = write_devices_file(work / "devices.yaml", ports)
    started = time.monotonic()
    counter: ReadingsCounter | None = None
    prometheus: subprocess.Popen[bytes] | None = None
    with ThreadPoolExecutor(1) as pool:
        kafka = pool.submit(stack.need, "kafka")  # ~10 s unless started: meanwhile, the rest
        try:
            text = widen_to_cpus(record_exposition(work))
            per_target = sample_count(text)
            served_per_s = n * per_target * 1000 / PERIOD_MS
            log.info(
                "prometheus: %d targets x %d samples every %d ms (%s samples/s to each collector)",
                n,
                per_target,
                PERIOD_MS,
                f"{served_per_s:,.0f}",
            )
            with target_server(work, text, ports) as server:
                prometheus, web_port = start_prometheus(work / "prometheus", ports)
                settings = kafka.result()
                log.info(
                    "prometheus: targets, Prometheus and Kafka up in %.1f s",
                    time.monotonic() - started,
                )
                counter = ReadingsCounter(settings.kafka_bootstrap, "readings")
                counter.start()
                with producer(
                    stack,
                    devices_file,
                    lambda: bool(counter.messages),
                    "the first readings of jobscope's producer",
                    START_TIMEOUT_S,
                ) as jobscope:
                    time.sleep(WARMUP_S[quick])
                    pids = {
                        "jobscope": jobscope.pid(),
                        "prometheus": prometheus.pid,
                        "kafka": services.process(settings, "kafka").pid(),
                        "targets": server.pid,
                    }
                    window = _window(MEASURE_S[quick] * 1000 // PERIOD_MS, pids, web_port)
                    time.sleep(PERIOD_MS / 1000)  # the last readings reach Kafka
                counter.finish.set()
                counter.join(60)
                if counter.error is not None:
                    raise counter.error
        finally:
            if counter is not None:
                counter.finish.set()
            if prometheus is not None:
                stop_child(prometheus)
            with contextlib.suppress(Exception):
                kafka.result()  # its failure, if any, is already raised
    span = window["t1"] - window["t0"]
    cpu = window["cpu"]
    t0_us, t1_us = int(window["t0"] * 1e6), int(window["t1"] * 1e6)
    jobscope_samples = sum(c for ts, c in counter.messages if t0_us <= ts < t1_us)
    prom_samples = window["appended"] - SERIES_PER_SCRAPE * window["scrapes"]
    systems = {
        "jobscope": _system(jobscope_samples, cpu["jobscope"], span, served_per_s),
        "prometheus": _system(prom_samples, cpu["prometheus"], span, served_per_s),
    }
    systems["prometheus"]["scrapes"] = int(window["scrapes"])
    js, pr = systems["jobscope"]["samples_per_core_s"], systems["prometheus"]["samples_per_core_s"]
    parser = parse_rates(text)
    out: dict[str, Any] = {
        "prometheus_samples_per_core_s": js,
        "prometheus_server_samples_per_core_s": pr,
        "prometheus_vs_server": round(js / pr, 3) if js and pr else None,
        "prometheus_polling": {
            "targets": n,
            "samples_per_target": per_target,
            "cpus_in_exposition": CPUS,
            "period_ms": PERIOD_MS,
            "samples_served_per_s": served_per_s,
            "measure_s": MEASURE_S[quick],
            "warmup_s": WARMUP_S[quick],
            "window_s": round(span, 2),
            "kafka_cpu_cores": round(cpu["kafka"] / span, 3),
            "targets_cpu_cores": round(cpu["targets"] / span, 3),
            "parser": parser,
            "versions": {
                "prometheus": dpkg_version("prometheus"),
                "prometheus-node-exporter": dpkg_version("prometheus-node-exporter"),
            },
            "systems": systems,
        },
    }
    log.info("prometheus: done in %.1f s", time.monotonic() - started)
    print(markdown(out))
    return out


def _system(samples: float, cpu_s: float, span: float, served_per_s: float) -> dict[str, Any]:
    return {
        "samples": int(samples),
        "samples_per_s": round(samples / span, 1),
        "samples_per_core_s": round(samples / cpu_s) if cpu_s > 0 else None,
        "cpu_cores": round(cpu_s / span, 3),
        "completeness": round(samples / span / served_per_s, 4),
    }


def markdown(results: dict[str, Any]) -> str:
    """The step's own table (bench/report.py's polling table does not know it yet)."""
    p = results["prometheus_polling"]
    js, pr = p["systems"]["jobscope"], p["systems"]["prometheus"]
    ratio = results["prometheus_vs_server"]
    parser = p["parser"]
    rows = [
        (
            "Prometheus scraping: jobscope producer, samples per CPU-second",
            js["samples_per_core_s"],
        ),
        (
            f"Prometheus scraping: Prometheus {p['versions']['prometheus']}, samples per "
            "CPU-second",
            pr["samples_per_core_s"],
        ),
    ]
    lines = ["| prometheus step | value |", "|---|---|"]
    lines += [
        f"| {title} | {value:,} |" if value else f"| {title} | n/a |" for title, value in rows
    ]
    lines += [
        f"| Prometheus scraping: jobscope / Prometheus | {ratio:.3f}x |"
        if ratio
        else "| Prometheus scraping: jobscope / Prometheus | n/a |",
        "| exposition parser alone, samples per CPU-second: jobscope / prometheus_client | "
        f"{parser['jobscope_parser_samples_per_core_s']:,} / "
        f"{parser['prometheus_client_parser_samples_per_core_s']:,} |",
        "",
        f"Load: {p['targets']} targets x {p['samples_per_target']} samples (node_exporter, "
        f"{p['cpus_in_exposition']} CPUs) every {p['period_ms']} ms, "
        f"{p['samples_served_per_s']:,.0f} samples/s to each collector, both at once for "
        f"{p['window_s']} s; Kafka {p['kafka_cpu_cores']} cores, target server "
        f"{p['targets_cpu_cores']} cores.",
    ]
    for name, s in p["systems"].items():
        lines.append(
            f"- {name}: {s['samples_per_s']:,.0f} samples/s (completeness "
            f"{s['completeness']:.3f}), {s['cpu_cores']:.3f} cores"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        sys.exit("usage: python -m bench.polling.prometheus serve FOLDER PORT...")
    serve_main(sys.argv[2:])
