"""The shipped entries for common exporters (producers/plugins/prometheus/exporters/) read
an exporter's exposition as jobscope's metrics: names renamed (`rename.`), labels renamed
(`relabel.`), values scaled to base units, every name described by the metric registry.

No GPU and none of these exporters here: each exposition is written in its exporter's
documented format (dcgm-exporter's default counters, nvidia_gpu_exporter's METRICS.md,
node_exporter's RAPL collector) with the values of the H100 recorded in
stack/simulators/gpu/, and served on loopback (the mocked part: the exporter itself)."""

from __future__ import annotations

import asyncio
import csv
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from api.registry import SHIPPED, load
from kafka.reading import Reading
from producers.config import load_devices
from producers.plugins import plugin_for
from producers.plugins.base import Plugin, Skips
from stack.config import REPO_ROOT
from tests import ports

(PORT,) = ports.ports("exporters")
EXPORTERS = REPO_ROOT / "producers" / "plugins" / "prometheus" / "exporters"
T = 1_800_000_000_000_000
ROW = next(
    row
    for row in csv.DictReader(
        (REPO_ROOT / "stack/simulators/gpu/nvidia-smi-query.load.csv").open(),
        skipinitialspace=True,
    )
    if float(row["utilization.gpu [%]"].split()[0]) > 50
)
"""A recorded row of the H100 under load."""
UUID = ROW["uuid"]


def _number(field: str) -> float:
    return float(ROW[field].split()[0])


POWER, UTIL, MEM_UTIL = _number("power.draw [W]"), _number("utilization.gpu [%]"), 12.0
TEMP, MEM_TEMP = _number("temperature.gpu"), _number("temperature.memory")
USED_MIB, SM_MHZ = _number("memory.used [MiB]"), _number("clocks.current.sm [MHz]")
ENERGY_MJ = 2_445_425.0

DCGM = "\n".join(
    f'{name}{{gpu="{gpu}",UUID="{UUID}{gpu}",device="nvidia{gpu}",'
    f'modelName="NVIDIA H100 80GB HBM3",Hostname="node-1"}} {value + gpu}'
    for gpu in (0, 1)
    for name, value in (
        ("DCGM_FI_DEV_SM_CLOCK", SM_MHZ),
        ("DCGM_FI_DEV_MEMORY_TEMP", MEM_TEMP),
        ("DCGM_FI_DEV_GPU_TEMP", TEMP),
        ("DCGM_FI_DEV_POWER_USAGE", POWER),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", ENERGY_MJ),
        ("DCGM_FI_DEV_GPU_UTIL", UTIL),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", MEM_UTIL),
        ("DCGM_FI_DEV_FB_USED", USED_MIB),
        ("DCGM_FI_DEV_XID_ERRORS", 0),
    )
)
NVIDIA_GPU_EXPORTER = "\n".join(
    f'{name}{{uuid="{UUID.removeprefix("GPU-")}"}} {value}'
    for name, value in (
        ("nvidia_smi_power_draw_watts", POWER),
        ("nvidia_smi_enforced_power_limit_watts", 700.0),
        ("nvidia_smi_memory_used_bytes", USED_MIB * 1048576),
        ("nvidia_smi_memory_total_bytes", 81559 * 1048576),
        ("nvidia_smi_temperature_gpu", TEMP),
        ("nvidia_smi_clocks_current_sm_clock_hz", SM_MHZ * 1e6),
        ("nvidia_smi_clocks_event_reasons_active", 4),
        ("nvidia_smi_utilization_gpu_ratio", UTIL / 100),
        ("nvidia_smi_utilization_memory_ratio", MEM_UTIL / 100),
        ("nvidia_smi_pstate", 0),
    )
)
RAPL = "\n".join(
    f'{name}{{index="{i}",path="/sys/class/powercap/intel-rapl:{i}"}} {value + i}'
    for i in (0, 1)
    for name, value in (
        ("node_rapl_package_joules_total", 81234.5),
        ("node_rapl_dram_joules_total", 9876.25),
        ("node_rapl_core_joules_total", 51234.5),
    )
)


class Exporter(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = (self.server.exposition + "\n").encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", PORT), Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _read(file: str, exposition: str, server: ThreadingHTTPServer, tmp_path: Path) -> dict:
    """(metric, labels) -> value of one poll of every entry of `file`, pointed at `server`."""
    server.exposition = exposition  # type: ignore[attr-defined]
    text = (EXPORTERS / file).read_text()
    local = tmp_path / file
    local.write_text(
        text.replace("node-1:9400", f"127.0.0.1:{PORT}")
        .replace("node-1:9835", f"127.0.0.1:{PORT}")
        .replace("node-1:9100", f"127.0.0.1:{PORT}")
    )
    entries = load_devices(local)
    readings: list[Reading] = []
    for plugin in plugin_for(entries[0].url).build(entries):
        plugin.skips = Skips(logging.getLogger("test"))
        readings += asyncio.run(_poll_once(plugin))
        assert plugin.skips.count == 0
    got = {}
    for r in readings:
        key = (r.metric_id, tuple(sorted(r.labels.items())))
        assert key not in got, f"{key} read twice"
        got[key] = r.value
    return got


async def _poll_once(plugin: Plugin) -> list[Reading]:
    try:
        return await plugin.poll(T)
    finally:
        await plugin.close()


def _described(metrics: set[str]) -> None:
    """Every name the entries give has an entry of its own in the shipped registry."""
    registry = load(SHIPPED)
    assert [m for m in sorted(metrics) if registry.lookup(m).inferred] == []


def test_dcgm_exporter_reads_as_gpu_metrics(exporter: ThreadingHTTPServer, tmp_path: Path) -> None:
    got = _read("dcgm-exporter.yaml", DCGM, exporter, tmp_path)
    by_gpu = {}
    for (metric, labels), value in got.items():
        label = dict(labels)
        assert label["gpu_uuid"] == UUID + label["gpu"] and "UUID" not in label
        by_gpu[(metric, label["gpu"])] = value
    assert by_gpu == {
        (metric, str(g)): (exposed + g) * scale  # as the exporter's unit, then scaled
        for g in (0, 1)
        for metric, exposed, scale in (
            ("gpu_power_watt", POWER, 1),
            ("gpu_utilization_percent", UTIL, 1),
            ("gpu_memory_utilization_percent", MEM_UTIL, 1),
            ("gpu_temp_celsius", TEMP, 1),
            ("gpu_memory_temp_celsius", MEM_TEMP, 1),
            ("gpu_energy_joules_total", ENERGY_MJ, 0.001),
            ("gpu_memory_used_bytes", USED_MIB, 1048576),
            ("gpu_sm_clock_hertz", SM_MHZ, 1e6),
        )
    }
    _described({metric for metric, _ in got})


def test_nvidia_gpu_exporter_reads_as_gpu_metrics(
    exporter: ThreadingHTTPServer, tmp_path: Path
) -> None:
    got = _read("nvidia_gpu_exporter.yaml", NVIDIA_GPU_EXPORTER, exporter, tmp_path)
    labels = (("gpu_uuid", UUID.removeprefix("GPU-")),)
    assert got == {
        ("gpu_power_watt", labels): POWER,
        ("gpu_power_limit_watt", labels): 700.0,
        ("gpu_memory_used_bytes", labels): USED_MIB * 1048576,
        ("gpu_memory_total_bytes", labels): 81559 * 1048576,
        ("gpu_temp_celsius", labels): TEMP,
        ("gpu_sm_clock_hertz", labels): SM_MHZ * 1e6,
        ("gpu_clocks_event_reasons", labels): 4.0,
        ("gpu_utilization_percent", labels): pytest.approx(UTIL),
        ("gpu_memory_utilization_percent", labels): pytest.approx(MEM_UTIL),
    }
    _described({metric for metric, _ in got})


def test_node_exporter_rapl_reads_as_cpu_and_memory_energy(
    exporter: ThreadingHTTPServer, tmp_path: Path
) -> None:
    got = _read("node_exporter-rapl.yaml", RAPL, exporter, tmp_path)
    assert got == {
        (metric, (("package", str(i)), ("path", f"/sys/class/powercap/intel-rapl:{i}"))): v + i
        for i in (0, 1)
        for metric, v in (
            ("cpu_energy_joules_total", 81234.5),
            ("memory_energy_joules_total", 9876.25),
        )
    }
    _described({metric for metric, _ in got})
    registry = load(SHIPPED)
    assert {registry.lookup(m).energy_role for m, _ in got} == {"rapl"}


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("rename.a=not-a-name", "rename.a=not-a-name: not a metric name"),
        ("relabel.UUID=_device_alias", "relabel.UUID=_device_alias: not a label"),
        ("relabel._site=x", "relabel._site=x: not a label"),
    ],
)
def test_a_bad_rename_is_refused_when_the_file_loads(
    query: str, error: str, tmp_path: Path
) -> None:
    """A relabel may not make a reserved label (`_device_alias` would sum the value into
    another node's power), nor rename one."""
    file = tmp_path / "bad.yaml"
    file.write_text(
        f'- {{name: x, device_id: node-1, url: "prometheus://127.0.0.1:{PORT}/metrics?{query}"}}\n'
    )
    with pytest.raises(Exception, match=error.replace(".", r"\.")):
        load_devices(file)
