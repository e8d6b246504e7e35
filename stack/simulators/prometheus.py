"""A real Prometheus server for tests: Debian's `prometheus`, e.g. scraping node_exporter and
remote-writing to jobscope (`POST /api/v1/write`).

    server = Prometheus(state_dir / "prometheus", port=9090, config=yaml_text)
    server.start()                                  # fresh state, waits until /-/ready
    server.query('up[5m]')                          # its HTTP API's `data.result`
    server.stop()

Files, all under `state_dir` (deleted by `start`): `prometheus.yml`, `data/` (its TSDB and the
WAL its remote_write reads) and `prometheus.log`.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from stack.config import REPO_ROOT
from stack.simulators.base import ChildProcess

PROMETHEUS = "/usr/bin/prometheus"
EXAMPLES = REPO_ROOT / "examples" / "prometheus"
GPU_RULES = EXAMPLES / "dcgm-exporter.rules.yml"
"""dcgm-exporter's counters as jobscope's GPU metrics (recording rules)."""


def gpu_remote_write_config(
    exporter: str, instance: str, api_url: str, token_file: Path, interval_s: int = 5
) -> str:
    """A Prometheus scraping a dcgm-exporter at `exporter` (host:port) as `instance` and
    remote-writing jobscope's GPU metrics to `api_url`, as examples/prometheus/ ships it: the
    recording rules of dcgm-exporter.rules.yml, remote_write.yml's section with the URL and the
    token file replaced."""
    (remote,) = yaml.safe_load((EXAMPLES / "remote_write.yml").read_text())["remote_write"]
    remote |= {
        "url": f"{api_url}/api/v1/write",
        "authorization": {"credentials_file": str(token_file)},
        "queue_config": remote.get("queue_config", {}) | {"batch_send_deadline": "1s"},
    }
    config = {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "rule_files": [str(GPU_RULES)],
        "scrape_configs": [
            {
                "job_name": "dcgm",
                "static_configs": [{"targets": [exporter], "labels": {"instance": instance}}],
            }
        ],
        "remote_write": [remote],
    }
    return yaml.safe_dump(config, sort_keys=False)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


class Prometheus(ChildProcess):
    """One Prometheus process on 127.0.0.1:`port` with the configuration `config` (YAML)."""

    def __init__(
        self, state_dir: Path, port: int, config: str, prometheus: str = PROMETHEUS
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.port = port
        self.config = config
        self.prometheus = prometheus
        self.log_file = self.state_dir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __repr__(self) -> str:
        return f"Prometheus(127.0.0.1:{self.port}, pid={self.pid})"

    def start(self, timeout: float = 30.0) -> None:
        """Delete the state dir, write the configuration, start Prometheus and wait until it
        is ready. RuntimeError (with its log) if it exits or is not ready within `timeout` s."""
        if self.pid is not None:
            return
        if not Path(self.prometheus).exists():
            raise RuntimeError(
                f"{self.prometheus} not found: install the Debian package prometheus "
                "(stack/install-system-deps.sh)"
            )
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.state_dir.mkdir(parents=True)
        config = self.state_dir / "prometheus.yml"
        config.write_text(self.config)
        self._spawn(
            [
                self.prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.state_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=debug",
            ],
            lambda: _ready(self.url),
            timeout,
            f"be ready on {self.url}",
        )

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """The `data.result` of an instant query (a range selector gives the raw samples)."""
        params = {"query": promql, **({"time": repr(at)} if at is not None else {})}
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.load(response)
        if answer.get("status") != "success":
            raise RuntimeError(f"Prometheus answered {answer}")
        return answer["data"]["result"]

    def own_metrics(self) -> dict[str, float]:
        """Its own /metrics (remote_write's counters among them): series -> value."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line and not line.startswith("#")
        }
