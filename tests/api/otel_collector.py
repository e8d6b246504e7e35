"""The tests' OpenTelemetry Collector: a real OTLP sender, built from Go modules
(tests/otelcol/: ocb's sources, `bash tests/otelcol/install.sh`, which `make test` runs) into
the tools cache helm/install-tools.sh also fills.

    collector = OtelCollector(state_dir, config(...), receiver_port, telemetry_port, env)
    collector.start()             # waits until its receiver and its own /metrics answer
    collector.own_metrics()       # otelcol_* counters: what it received, sent, failed to send
    collector.log_records()       # its JSON log lines
    collector.stop()

It has an OTLP receiver (HTTP only) and the otlphttp exporter, nothing else: it forwards what
it receives, as a site's collector in front of jobscope would.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

from stack.config import REPO_ROOT, cache_home
from stack.processes import port_in_use
from stack.simulators.base import ChildProcess

SOURCES = REPO_ROOT / "tests" / "otelcol"
TOKEN_VARIABLE = "JOBSCOPE_AGENT_TOKEN"
"""The environment variable the exporter's Authorization header reads (never in the file)."""


def version() -> str:
    """The collector release tests/otelcol/versions.env pins."""
    for line in (SOURCES / "versions.env").read_text().splitlines():
        if line.startswith("OTELCOL_VERSION="):
            return line.split("=", 1)[1].strip()
    raise AssertionError("tests/otelcol/versions.env names no OTELCOL_VERSION")


def binary() -> Path:
    """The built collector; FileNotFoundError saying how to build it when it is missing."""
    bin_dir = Path(os.environ.get("JOBSCOPE_TOOLS_BIN") or cache_home() / "bin")
    path = bin_dir / f"otelcol-jobscope-{version()}"
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(
            f"{path} is missing: run `bash tests/otelcol/install.sh` (`make test` does)"
        )
    return path


def config(
    receiver_port: int,
    telemetry_port: int,
    metrics_url: str,
    encoding: Literal["proto", "json"],
    compression: Literal["gzip", "none"],
) -> str:
    """A pipeline from an OTLP/HTTP receiver on 127.0.0.1:`receiver_port` to `metrics_url`
    (jobscope's POST /v1/metrics) with the agent token of $JOBSCOPE_AGENT_TOKEN; its own
    counters on 127.0.0.1:`telemetry_port`/metrics, its log as JSON lines. Retries are short
    so that a refused or failed send shows in its counters within seconds."""
    settings: dict[str, Any] = {
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{receiver_port}"}}}},
        "exporters": {
            "otlp_http": {
                "metrics_endpoint": metrics_url,
                "encoding": encoding,
                "compression": compression,
                "headers": {"Authorization": f"Bearer ${{env:{TOKEN_VARIABLE}}}"},
                "retry_on_failure": {
                    "initial_interval": "100ms",
                    "max_interval": "1s",
                    "max_elapsed_time": "10s",
                },
            }
        },
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["otlp_http"]}},
            "telemetry": {
                "logs": {"level": "info", "encoding": "json"},
                "metrics": {
                    "level": "detailed",
                    "readers": [
                        {
                            "pull": {
                                "exporter": {
                                    "prometheus": {"host": "127.0.0.1", "port": telemetry_port}
                                }
                            }
                        }
                    ],
                },
            },
        },
    }
    return yaml.safe_dump(settings, sort_keys=False)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


class OtelCollector(ChildProcess):
    """One collector process with the configuration `config_text` (YAML), started with
    `env` added to this process's environment."""

    def __init__(
        self,
        state_dir: Path,
        config_text: str,
        receiver_port: int,
        telemetry_port: int,
        env: Mapping[str, str],
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.config_text = config_text
        self.receiver_port = receiver_port
        self.telemetry_port = telemetry_port
        self.env = dict(env)
        self.log_file = self.state_dir / "otelcol.log"

    @property
    def endpoint(self) -> str:
        """Its OTLP/HTTP metrics URL."""
        return f"http://127.0.0.1:{self.receiver_port}/v1/metrics"

    def __repr__(self) -> str:
        return f"OtelCollector(127.0.0.1:{self.receiver_port}, pid={self.pid})"

    def start(self, timeout: float = 30.0) -> None:
        """Fresh state dir, the configuration written, the collector started; returns once
        its receiver listens and its /metrics answers (RuntimeError with its log otherwise)."""
        if self.pid is not None:
            return
        command = binary()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.state_dir.mkdir(parents=True)
        path = self.state_dir / "otelcol.yaml"
        path.write_text(self.config_text)
        self._spawn(
            [str(command), f"--config=file:{path}"],
            lambda: (
                port_in_use("127.0.0.1", self.receiver_port)
                and _answers(f"http://127.0.0.1:{self.telemetry_port}/metrics")
            ),
            timeout,
            f"listen on 127.0.0.1:{self.receiver_port}",
            env={**os.environ, **self.env},
        )

    def own_metrics(self) -> dict[str, float]:
        """Its own counters: `name{labels}` -> value, from its Prometheus /metrics."""
        url = f"http://127.0.0.1:{self.telemetry_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line and not line.startswith("#")
        }

    def counted(self, name: str) -> float:
        """The sum over every series of one of its counters (e.g.
        `otelcol_exporter_sent_metric_points`); 0 when it has none yet."""
        prefix = (name, f"{name}{{")
        return sum(v for k, v in self.own_metrics().items() if k.startswith(prefix))

    def log_records(self) -> list[dict[str, Any]]:
        """Its JSON log lines (anything else it printed is left out)."""
        records = []
        for line in self.log_file.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                records.append(json.loads(line))
        return records
