"""nvidiasmi:// through a stand-in for nvidia-smi: there is no GPU here, so the simulator
(stack/simulators/nvidiasmi.py) answers each `--query-gpu` run with outputs recorded on an
NVIDIA H100 (stack/simulators/gpu/). The plugin runs it as it would run nvidia-smi: a real
process per poll, its real output parsed."""

from __future__ import annotations

import asyncio
import csv
import logging
import re
import sys
from pathlib import Path

import pytest

from api.registry import Kind, registry
from producers.config import load_devices
from producers.entry import DeviceEntry
from producers.plugins import plugin_for
from producers.plugins.base import Skips
from producers.plugins.nvidiasmi import plugin as smi
from producers.runtime import build_groups
from stack.processes import wait_until
from stack.simulators import nvidiasmi as sim

SAMPLE = Path(smi.__file__).parent / "sample.yaml"
SIMULATOR = [sys.executable, "-m", "stack.simulators.nvidiasmi"]
UUID = "GPU-225b1ae3-99ca-fc27-4ec1-4946edc42424"
TS = 1_795_717_825_406_000


def recorded(name: str) -> list[dict[str, str]]:
    """The recorded CSV read apart from the plugin: field -> value without its unit."""
    with (sim.RECORDINGS / f"nvidia-smi-query.{name}.csv").open(newline="") as file:
        lines = list(csv.reader(file, skipinitialspace=True))
    fields = [header.split(" [")[0] for header in lines[0]]
    strip = re.compile(r" (W|%|MiB|MHz)$")
    return [{f: strip.sub("", v) for f, v in zip(fields, row, strict=True)} for row in lines[1:]]


def entry(*args: str, device_id: str = "node-1", **options: object) -> DeviceEntry:
    return DeviceEntry(
        name="gpu_nvidiasmi",
        device_id=device_id,
        url="nvidiasmi://",
        options={"command": [*SIMULATOR, *args], **options},
    )


def build(entries: list[DeviceEntry]) -> smi.NvidiaSmiPlugin:
    (plugin,) = plugin_for(entries[0].url).build(entries)
    assert isinstance(plugin, smi.NvidiaSmiPlugin)
    plugin.skips = Skips(logging.getLogger("test"))
    return plugin


def poll(plugin: smi.NvidiaSmiPlugin) -> dict[tuple[str, str, str], float]:
    """(device, metric, gpu) -> value of one poll; a reading given twice fails."""
    got: dict[tuple[str, str, str], float] = {}
    for r in asyncio.run(plugin.poll(TS)):
        key = (r.device_id, r.metric_id, r.labels["gpu"])
        assert key not in got, f"{key} read twice"
        got[key] = r.value
    return got


def expected(row: dict[str, str], fields: tuple[str, ...] = smi.DEFAULT_FIELDS) -> dict:
    """metric -> value in base units of a recorded row (the energy counter aside)."""
    return {
        smi.FIELDS[f].metric: float(int(row[f], 16))
        if smi.FIELDS[f].hex
        else float(row[f]) * smi.FIELDS[f].factor
        for f in fields
        if f != sim.ENERGY_FIELD and not row[f].startswith("[")
    }


@pytest.mark.parametrize("name", ["idle", "load"])
def test_every_recorded_row_is_read_in_base_units(name: str, tmp_path: Path) -> None:
    """Each poll replays the next recorded row; every field comes back in base units (W, B,
    Hz, %, Cel, the bitmask as a number), in one run per poll."""
    rows = recorded(name)
    plugin = build([entry("--recording", name, "--state", str(tmp_path / "count"))])
    for i, row in enumerate(rows):
        got = poll(plugin)
        values = {metric: value for (_, metric, _), value in got.items()}
        energy = values.pop("gpu_energy_joules_total")
        assert values == pytest.approx(expected(row)), f"row {i}"
        assert plugin.runs == i + 1
        assert energy == pytest.approx(
            sim.energy_at(sim.row_instant(row), *sim.energy_counter()) / 1e3, abs=1e-3
        )
    assert name == "idle" or {float(r["power.draw"]) for r in rows} >= {70.67, 699.92}
    # the load's throttle reasons: idle (1), then software power cap (4)
    assert {int(r["clocks_event_reasons.active"], 16) for r in rows} <= {1, 4}


def test_recorded_line_without_units_parses() -> None:
    line = "0, GPU-225b1ae3-99ca-fc27-4ec1-4946edc42424, 70.67, 81559, [N/A], 0x0000000000000001\n"
    fields = [
        "index",
        "uuid",
        "power.draw",
        "memory.total",
        "fan.speed",
        "clocks_event_reasons.active",
    ]
    assert smi.parse_rows(line, fields) == [
        dict(zip(fields, ["0", UUID, "70.67", "81559", "[N/A]", "0x0000000000000001"], strict=True))
    ]
    with pytest.raises(ValueError, match="line 1 has 5 values for 6 fields"):
        smi.parse_rows(line.replace(", [N/A]", ""), fields)


def test_sample_names_units_labels_one_run_per_command() -> None:
    """The sample: node-1's two GPUs (every default field), two of node-2's four GPUs chosen
    by index and UUID; each metric registered with its unit, labelled gpu and gpu_uuid."""
    groups = build_groups(load_devices(SAMPLE))
    assert [len(group.members) for group in groups] == [1, 1]
    readings = []
    for group in groups:
        (plugin,) = group.members
        readings += asyncio.run(plugin.poll(TS))
        assert isinstance(plugin, smi.NvidiaSmiPlugin) and plugin.runs == 1
    node1 = [r for r in readings if r.device_id == "node-1"]
    assert len(node1) == 2 * len(smi.DEFAULT_FIELDS)
    assert {(r.labels["gpu"], r.labels["gpu_uuid"]) for r in node1} == {
        ("0", UUID),
        ("1", UUID[:-4] + "0001"),
    }
    units = {r.metric_id: registry().lookup(r.metric_id) for r in node1}
    assert {m: (i.unit, i.scope, i.inferred) for m, i in units.items()} == {
        "gpu_power_watt": ("W", "gpu", False),
        "gpu_energy_joules_total": ("J", "gpu", False),
        "gpu_utilization_percent": ("%", "gpu", False),
        "gpu_memory_utilization_percent": ("%", "gpu", False),
        "gpu_memory_used_bytes": ("B", "gpu", False),
        "gpu_memory_total_bytes": ("B", "gpu", False),
        "gpu_temp_celsius": ("Cel", "gpu", False),
        "gpu_memory_temp_celsius": ("Cel", "gpu", False),
        "gpu_sm_clock_hertz": ("Hz", "gpu", False),
        "gpu_clocks_event_reasons": ("1", "gpu", False),
    }
    assert units["gpu_energy_joules_total"].kind == Kind.ENERGY_COUNTER
    assert {units[m].energy_role for m in ("gpu_power_watt", "gpu_energy_joules_total")} == {"gpu"}
    node2 = sorted(
        (r.metric_id, r.labels["gpu"], r.labels["rack"])
        for r in readings
        if r.device_id == "node-2"
    )
    assert node2 == [
        ("gpu_energy_joules_total", "0", "b104"),
        ("gpu_energy_joules_total", "3", "b104"),
        ("gpu_power_watt", "0", "b104"),
        ("gpu_power_watt", "3", "b104"),
    ]


def test_entries_of_one_command_share_a_run_each_its_gpus_and_fields(tmp_path: Path) -> None:
    """Four GPUs, three entries (two devices) on one command: one run per poll; each GPU its
    own recorded row; a GPU an entry names that the host lacks is a skip."""
    args = ("--gpus", "4", "--state", str(tmp_path / "count"))
    entries = [
        entry(*args, device_id="gpu-a", gpus=[0, "1"], fields=["power.draw"]),
        entry(
            *args,
            device_id="gpu-b",
            gpus=[UUID[:-4] + "0003", "7"],
            fields=["memory.used", "clocks.sm"],
        ),
        entry(*args, device_id="node-1", fields=["utilization.gpu"]),
    ]
    plugin = build(entries)
    got = poll(plugin)
    rows = recorded("load")
    assert plugin.runs == 1
    assert got == {
        ("gpu-a", "gpu_power_watt", "0"): float(rows[0]["power.draw"]),
        ("gpu-a", "gpu_power_watt", "1"): float(rows[1]["power.draw"]),
        ("gpu-b", "gpu_memory_used_bytes", "3"): float(rows[3]["memory.used"]) * 2**20,
        ("gpu-b", "gpu_sm_clock_hertz", "3"): float(rows[3]["clocks.current.sm"]) * 1e6,
        **{
            ("node-1", "gpu_utilization_percent", str(g)): float(rows[g]["utilization.gpu"])
            for g in range(4)
        },
    }
    assert plugin.skips.count == 1  # gpu-b's GPU 7


def test_na_and_not_supported_are_skipped_never_zero(tmp_path: Path) -> None:
    plugin = build(
        [entry("--na", "power.draw", "--not-supported", "temperature.memory", "--gpus", "2")]
    )
    got = poll(plugin)
    metrics = {metric for _, metric, _ in got}
    assert "gpu_power_watt" not in metrics and "gpu_memory_temp_celsius" not in metrics
    assert len(got) == 2 * (len(smi.DEFAULT_FIELDS) - 2)
    assert plugin.skips.count == 4  # two fields of two GPUs


def test_a_value_that_is_not_finite_is_skipped() -> None:
    """A program answering nan or inf (a wrapper, a broken driver) publishes no such value:
    ClickHouse would refuse it, and a summary would carry it."""
    answer = "0, GPU-a, nan, 30\n1, GPU-b, inf, 31\n"
    plugin = build(
        [
            DeviceEntry(
                name="gpu_nvidiasmi",
                device_id="node-1",
                url="nvidiasmi://",
                options={
                    "command": [sys.executable, "-c", f"print({answer!r}, end='')"],
                    "fields": ["power.draw", "temperature.gpu"],
                },
            )
        ]
    )
    assert poll(plugin) == {
        ("node-1", "gpu_temp_celsius", "0"): 30.0,
        ("node-1", "gpu_temp_celsius", "1"): 31.0,
    }
    assert plugin.skips.count == 2


def test_a_field_this_nvidia_smi_lacks_is_left_out_and_the_others_read() -> None:
    """An older driver's nvidia-smi refuses total_energy_consumption: the run is repeated
    without it, once; later polls no longer ask for it."""
    plugin = build([entry("--no-energy")])
    got = poll(plugin)
    assert plugin.runs == 2 and plugin.unknown == {"total_energy_consumption"}
    assert len(got) == len(smi.DEFAULT_FIELDS) - 1
    assert ("node-1", "gpu_energy_joules_total", "0") not in got
    poll(plugin)
    assert plugin.runs == 3 and plugin.skips.count == 2


def test_a_failing_command_says_why(tmp_path: Path) -> None:
    message = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )
    plugin = build([entry("--fail", "9", "--fail-message", message)])
    with pytest.raises(
        RuntimeError,
        match=r"stack\.simulators\.nvidiasmi --fail 9 .*: exit status 9: NVIDIA-SMI has failed",
    ):
        asyncio.run(plugin.poll(TS))
    missing = build([entry(device_id="x", command=["/nonexistent/nvidia-smi"])])
    with pytest.raises(RuntimeError, match="/nonexistent/nvidia-smi cannot run: No such file"):
        asyncio.run(missing.poll(TS))
    pid_file = tmp_path / "child.pid"
    hung = build(
        [
            entry(
                command=["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait", "sh"], timeout_s=0.3
            )
        ]
    )

    async def poll_hung() -> None:
        with pytest.raises(
            RuntimeError, match=r"sh -c 'sleep 300 .*: no answer within 0.3 s, killed"
        ):
            async with asyncio.timeout(20):  # not a speed bound: a child left alive holds the
                await hung.poll(TS)  # pipes, and the poll would wait for it (300 s)
        # the program's own children (ssh's, a wrapper's) are killed with it, at once
        stat = Path(f"/proc/{pid_file.read_text().strip()}/stat")
        wait_until(
            lambda: not stat.exists() or stat.read_text().split()[2] == "Z", 5, "child killed"
        )

    asyncio.run(poll_hung())
    garbled = build([entry(command=["sh", "-c", "echo 0, GPU-x", "sh"])])
    with pytest.raises(RuntimeError, match="line 1 has 2 values for 12 fields: '0, GPU-x'"):
        asyncio.run(garbled.poll(TS))


@pytest.mark.parametrize(
    ("url", "extra", "error"),
    [
        ("nvidiasmi://node-3", {}, "for another host set options.command"),
        ("nvidiasmi:///power.draw", {}, "no path or"),
        ("nvidiasmi://?gpus=0", {}, "no path or"),
        ("nvidiasmi://", {"scale_factor": 2.0}, "no scale_factor"),
        ("nvidiasmi://", {"labels": {"gpu": "0"}}, "labels gpu are the plugin's"),
        ("nvidiasmi://", {"options": {"fields": ["fan.speed"]}}, "unknown field 'fan.speed'"),
        (
            "nvidiasmi://",
            {"options": {"fields": ["power.draw", "power.draw.instant"]}},
            "both give gpu_power_watt",
        ),
        ("nvidiasmi://", {"options": {"timeout": 3}}, "timeout: Extra inputs"),
    ],
)
def test_bad_entries_are_refused_naming_why(url: str, extra: dict, error: str) -> None:
    bad = DeviceEntry(name="gpu", device_id="node-1", url=url, **extra)
    with pytest.raises(ValueError, match=error):
        plugin_for(url).check(bad)


def test_command_given_as_a_string_is_split_as_a_shell_would() -> None:
    options = smi.NvidiaSmiOptions(command="ssh 'node 1' nvidia-smi")
    assert options.command == ("ssh", "node 1", "nvidia-smi")
