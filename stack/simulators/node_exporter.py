"""A real Prometheus exporter for tests and `make up`: Debian's `prometheus-node-exporter`.

    exporter = NodeExporter(state_dir / "node-exporter", port=9100)
    exporter.start()                                  # fresh state, waits until /metrics answers
    exporter.push("job.prom", 'kwollect_custom{_metric_id="my_metric"} 42\\n')
    exporter.pause() / exporter.resume()              # SIGSTOP/SIGCONT: scrapes time out
    exporter.stop()

It exposes the host's own metrics (~500 samples on a small VM: CPU, memory, disks,
network...) on http://127.0.0.1:`port`/metrics, plus what `*.prom` files in its textfile
folder hold (node_exporter's textfile collector: how Kwollect users push `kwollect_custom`
values). Files, all under `state_dir` (deleted by `start`): `textfiles/` and
`node_exporter.log`. The systemd collector is off: it needs systemd's bus.
"""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

from stack.simulators.base import ChildProcess

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"


def serves_metrics(url: str, timeout: float = 1.0) -> bool:
    """Whether `url` answers 200 with a Prometheus exposition."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200 and b"# TYPE " in response.read()
    except (OSError, urllib.error.URLError):
        return False


class NodeExporter(ChildProcess):
    """One node_exporter process on `address:port`, its textfile folder in `state_dir`."""

    def __init__(
        self,
        state_dir: Path,
        port: int,
        address: str = "127.0.0.1",
        node_exporter: str = NODE_EXPORTER,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.address = address
        self.port = port
        self.node_exporter = node_exporter
        self.textfile_dir = self.state_dir / "textfiles"
        self.log_file = self.state_dir / "node_exporter.log"

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/metrics"

    def __repr__(self) -> str:
        return f"NodeExporter({self.address}:{self.port}, pid={self.pid})"

    def start(self, timeout: float = 10.0) -> None:
        """Delete the state dir, start node_exporter and wait until /metrics answers.
        RuntimeError (with its log) if it exits or does not answer within `timeout` s."""
        if self.pid is not None:
            return
        if not Path(self.node_exporter).exists():
            raise RuntimeError(
                f"{self.node_exporter} not found: install the Debian package "
                "prometheus-node-exporter (stack/install-system-deps.sh)"
            )
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.textfile_dir.mkdir(parents=True)
        self._spawn(
            [
                self.node_exporter,
                f"--web.listen-address={self.address}:{self.port}",
                f"--collector.textfile.directory={self.textfile_dir}",
                "--no-collector.systemd",
            ],
            lambda: serves_metrics(self.url),
            timeout,
            f"answer on {self.url}",
        )

    def push(self, name: str, text: str) -> Path:
        """Write textfile `name` (e.g. `job.prom`) atomically, as node_exporter's docs ask:
        to a temporary name, then renamed. Its samples show from the next scrape on."""
        if "/" in name or not name.endswith(".prom"):
            raise ValueError(f"{name!r}: a file name ending in .prom")
        path = self.textfile_dir / name
        partial = path.with_name(f".{name}.{os.getpid()}.tmp")
        partial.write_text(text)
        partial.replace(path)
        return path
