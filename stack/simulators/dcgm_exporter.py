"""A stand-in for NVIDIA's dcgm-exporter where there is no GPU (`make up DEVICES=sample`, tests):
its default counters, in its exposition format, with the values recorded on an H100
(stack/simulators/gpu/, replayed as `stack.simulators.nvidiasmi` replays them).

    python -m stack.simulators.dcgm_exporter --port 11400 --gpus 2 --hostname node-3

    exporter = DcgmExporter(state_dir, port=11400, gpus=2, hostname="node-3")
    exporter.start()          # waits until /metrics answers
    exporter.stop()

GPU k presents the recording's row of the wall clock (500 ms rows, in a loop) k rows ahead, as
index k with the recorded UUID's last four digits replaced by k; its energy counter
(`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`, mJ) is the recorded NVML counter, growing from one
loop to the next. Units are dcgm-exporter's: W, %, C, MiB, MHz, mJ.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from stack.simulators import nvidiasmi
from stack.simulators.base import ChildProcess
from stack.simulators.node_exporter import serves_metrics

MODEL = "NVIDIA H100 80GB HBM3"
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "clocks.current.sm"),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "clocks.current.memory"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "temperature.memory"),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "temperature.gpu"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "power.draw"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", nvidiasmi.ENERGY_FIELD),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "utilization.gpu"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "utilization.memory"),
    ("DCGM_FI_DEV_FB_USED", "gauge", "memory.used"),
)
"""(dcgm-exporter's name, its type, the recorded nvidia-smi field holding its value)."""


@functools.cache
def _recorded() -> tuple[list[dict[str, str]], nvidiasmi.Energy]:
    """The recording's rows and the GPU's energy counter, read once per process."""
    return nvidiasmi.recording("load")[1], nvidiasmi.energy_counter()


def exposition(gpus: int, hostname: str, at: float | None = None) -> str:
    """What dcgm-exporter's /metrics answers for `gpus` GPUs at `at` (default now)."""
    rows, energy = _recorded()
    row_of_now = int((time.time() if at is None else at) / nvidiasmi.RECORDED_PERIOD_S)
    by_gpu = [nvidiasmi.gpu_row(rows, row_of_now + gpu, gpu, energy) for gpu in range(gpus)]
    lines = []
    for name, kind, field in COUNTERS:
        lines += [f"# HELP {name} {field}.", f"# TYPE {name} {kind}"]
        for gpu, row in enumerate(by_gpu):
            text = nvidiasmi.value(row[field], units=False)
            labels = (
                f'gpu="{gpu}",UUID="{row["uuid"]}",pci_bus_id="{row["pci.bus_id"]}",'
                f'device="nvidia{gpu}",modelName="{MODEL}",Hostname="{hostname}"'
            )
            lines.append(f"{name}{{{labels}}} {text}")
    return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        body = exposition(self.server.gpus, self.server.hostname).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    gpus: int
    hostname: str


def serve(host: str, port: int, gpus: int, hostname: str) -> None:
    server = _Server((host, port), _Handler)
    server.gpus, server.hostname = gpus, hostname
    server.serve_forever()


class DcgmExporter(ChildProcess):
    """`python -m stack.simulators.dcgm_exporter` on `host:port` as a child process."""

    def __init__(
        self, state_dir: Path, port: int, gpus: int, hostname: str, host: str = "127.0.0.1"
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.port, self.gpus, self.hostname, self.host = port, gpus, hostname, host
        self.log_file = self.state_dir / "dcgm_exporter.log"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def __repr__(self) -> str:
        return f"DcgmExporter({self.host}:{self.port}, {self.gpus} GPUs, pid={self.pid})"

    def start(self, timeout: float = 30.0) -> None:
        if self.pid is not None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "stack.simulators.dcgm_exporter", "--host", self.host]
        argv += ["--port", str(self.port), "--gpus", str(self.gpus), "--hostname", self.hostname]
        self._spawn(argv, lambda: serves_metrics(self.url), timeout, f"serve {self.url}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9400)
    p.add_argument("--gpus", type=int, default=2, help="GPUs presented (default 2)")
    p.add_argument("--hostname", default="node-1", help="the Hostname label")
    args = p.parse_args(argv)
    serve(args.host, args.port, args.gpus, args.hostname)
    return 0


if __name__ == "__main__":
    sys.exit(main())
