"""`nvidiasmi://`: NVIDIA GPUs read with `nvidia-smi --query-gpu`, as Telegraf's nvidia_smi
input reads them, for sites without a GPU exporter.

One instance polls every entry of one command (the host's `nvidia-smi`, or `options.command`:
`ssh node nvidia-smi`, a simulator): one run per host and tick, asking the union of the
entries' fields; each entry picks its GPUs and fields from the answer. Every reading is
labelled with its GPU's `gpu` (index) and `gpu_uuid`; values are in base units (W, J, B, Hz).
"""

from __future__ import annotations

import csv
import math
import os
import re
import shlex
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kafka.reading import Reading
from producers.plugins import command
from producers.plugins.base import OneRequestPlugin, ProcessLimit, validated

if TYPE_CHECKING:
    from producers.entry import DeviceEntry

MAX_CONCURRENT_RUNS = int(os.environ.get("JOBSCOPE_NVIDIASMI_MAX_CONCURRENT", "32"))
"""How many `nvidia-smi` runs the process allows at once (over all hosts)."""
_UNKNOWN_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
GPU_LABELS = ("gpu", "gpu_uuid")
MIB = 1024 * 1024


@dataclass(frozen=True)
class QueryField:
    """One `--query-gpu` field: the metric it gives and the factor to base units."""

    metric: str
    factor: float = 1.0
    hex: bool = False


FIELDS: dict[str, QueryField] = {
    "power.draw": QueryField("gpu_power_watt"),
    "power.draw.average": QueryField("gpu_power_watt"),
    "power.draw.instant": QueryField("gpu_power_watt"),
    "total_energy_consumption": QueryField("gpu_energy_joules_total", 1e-3),
    "enforced.power.limit": QueryField("gpu_power_limit_watt"),
    "utilization.gpu": QueryField("gpu_utilization_percent"),
    "utilization.memory": QueryField("gpu_memory_utilization_percent"),
    "memory.used": QueryField("gpu_memory_used_bytes", MIB),
    "memory.total": QueryField("gpu_memory_total_bytes", MIB),
    "temperature.gpu": QueryField("gpu_temp_celsius"),
    "temperature.memory": QueryField("gpu_memory_temp_celsius"),
    "clocks.current.sm": QueryField("gpu_sm_clock_hertz", 1e6),
    "clocks.sm": QueryField("gpu_sm_clock_hertz", 1e6),
    "clocks_event_reasons.active": QueryField("gpu_clocks_event_reasons", hex=True),
    "clocks_throttle_reasons.active": QueryField("gpu_clocks_event_reasons", hex=True),
}
"""The fields an entry may ask for (nvidia-smi's names; several spellings of one value)."""
DEFAULT_FIELDS = (
    "power.draw",
    "total_energy_consumption",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "temperature.memory",
    "clocks.current.sm",
    "clocks_event_reasons.active",
)


class NvidiaSmiOptions(BaseModel):
    """The `options` of an `nvidiasmi://` entry (all optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: tuple[str, ...] = Field(
        ("nvidia-smi",),
        min_length=1,
        description="argv of the program (a string is split as a shell would): nvidia-smi, "
        "`ssh node-1 nvidia-smi`, a simulator; `--query-gpu=... --format=...` is appended",
    )
    gpus: tuple[str, ...] = Field(
        (), description="GPUs read, by index ('0') or UUID ('GPU-...'); empty: every GPU"
    )
    fields: tuple[str, ...] = Field(
        DEFAULT_FIELDS, min_length=1, description="nvidia-smi query fields read (see README)"
    )
    timeout_s: float = Field(5.0, gt=0, le=300, description="one run at most, then killed")

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return shlex.split(value) if isinstance(value, str) else value

    @field_validator("gpus", mode="before")
    @classmethod
    def _texts(cls, value: object) -> object:
        return [str(v) for v in value] if isinstance(value, list | tuple) else value

    @field_validator("fields")
    @classmethod
    def _known(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        metrics: dict[str, str] = {}
        for field in value:
            if field not in FIELDS:
                raise ValueError(f"unknown field {field!r}; known: {', '.join(FIELDS)}")
            metric = FIELDS[field].metric
            if metric in metrics:
                raise ValueError(f"{metrics[metric]!r} and {field!r} both give {metric}")
            metrics[metric] = field
        return value


@dataclass(frozen=True)
class Host:
    """Who to ask: entries with equal commands and timeouts (and periods) share one run."""

    command: tuple[str, ...]
    timeout_s: float

    def __str__(self) -> str:
        return shlex.join(self.command)


def parse(entry: DeviceEntry) -> tuple[Host, NvidiaSmiOptions]:
    """The host and options of an `nvidiasmi://` entry; ValueError naming what is wrong."""
    parts = urlsplit(entry.url)
    if parts.hostname not in (None, "localhost") or parts.port or parts.username:
        raise ValueError(
            "nvidiasmi:// reads this host's nvidia-smi (nvidiasmi:// or nvidiasmi://localhost); "
            "for another host set options.command, e.g. [ssh, node-1, nvidia-smi]"
        )
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise ValueError("nvidiasmi:// takes no path or ?query: GPUs and fields go in `options`")
    if entry.scale_factor is not None:
        raise ValueError("nvidiasmi:// gives each field in its base unit: no scale_factor")
    if taken := sorted(set(GPU_LABELS) & set(entry.labels)):
        raise ValueError(f"labels {', '.join(taken)} are the plugin's (each GPU's own)")
    options = validated(entry.options, NvidiaSmiOptions)
    return Host(options.command, options.timeout_s), options


_runs = ProcessLimit(MAX_CONCURRENT_RUNS)


class NvidiaSmiPlugin(OneRequestPlugin):
    scheme = "nvidiasmi"

    def __init__(self, entries: Sequence[DeviceEntry], host: Host) -> None:
        self.entries = tuple(entries)
        self.host = host
        self.targets = [(entry, parse(entry)[1]) for entry in entries]
        asked = {field for _, options in self.targets for field in options.fields}
        self.fields = [field for field in FIELDS if field in asked]
        """The fields asked, in FIELDS' order (one query for every entry)."""
        self.unknown: set[str] = set()
        """Fields this nvidia-smi does not know (found at a run, left out of later runs)."""
        self.runs = 0
        """`nvidia-smi` runs so far (tests check one run per poll)."""

    @classmethod
    def parse(cls, entry: DeviceEntry) -> tuple[Hashable, object]:
        return parse(entry)

    async def poll(self, timestamp_us: int) -> list[Reading]:
        gpus = await self.read_gpus()
        readings: list[Reading] = []
        for entry, options in self.targets:
            for gpu in self._selected(entry, options, gpus):
                labels = entry.labels | {"gpu": gpu["index"], "gpu_uuid": gpu["uuid"]}
                for field in options.fields:
                    value = self._value(entry, gpu, field)
                    if value is not None:
                        metric = FIELDS[field].metric
                        readings.append(
                            Reading(timestamp_us, entry.device_id, metric, value, labels)
                        )
        return readings

    def _selected(
        self, entry: DeviceEntry, options: NvidiaSmiOptions, gpus: list[dict[str, str]]
    ) -> list[dict[str, str]]:
        """The GPUs of `entry`; each one it names that the host lacks is a skip."""
        if not options.gpus:
            return gpus
        chosen = [
            gpu for gpu in gpus if gpu["index"] in options.gpus or gpu["uuid"] in options.gpus
        ]
        found = {gpu["index"] for gpu in chosen} | {gpu["uuid"] for gpu in chosen}
        for wanted in options.gpus:
            if wanted not in found:
                self.skips.skip(
                    entry.device_id, f"{entry.name} (gpu {wanted})", f"no such GPU on {self.host}"
                )
        return chosen

    def _value(self, entry: DeviceEntry, gpu: dict[str, str], field: str) -> float | None:
        """The field's value in base units; None (a skip) for [N/A], [Not Supported]..."""
        what = f"{entry.name} ({field}, gpu {gpu['index']})"
        if field in self.unknown:
            self.skips.skip(entry.device_id, what, f"a field {self.host} does not know")
            return None
        text = gpu[field]
        spec = FIELDS[field]
        try:
            number = float(int(text, 16)) if spec.hex else float(text)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            self.skips.skip(entry.device_id, what, f"reading {text!r}")
            return None
        return number * spec.factor

    async def read_gpus(self) -> list[dict[str, str]]:
        """One row per GPU (field -> text), from one run; a field the program does not know
        is left out and the run repeated (an older driver's nvidia-smi lacks some)."""
        while True:
            fields = ["index", "uuid", *(f for f in self.fields if f not in self.unknown)]
            async with _runs():
                code, out, err = await self._run(fields)
            unknown = _UNKNOWN_FIELD.search(out + err)
            if code != 0 and unknown and unknown.group(1) in fields[2:]:
                self.unknown.add(unknown.group(1))
                continue
            if code != 0:
                lines = [line.strip() for line in (err.strip() or out).splitlines() if line.strip()]
                reason = f"exit status {code}" + (f": {lines[-1]}" if lines else "")
                raise RuntimeError(f"{self.host}: {reason}")
            try:
                return parse_rows(out, fields)
            except ValueError as exc:
                raise RuntimeError(f"{self.host}: {exc}") from None

    async def _run(self, fields: list[str]) -> tuple[int, str, str]:
        """Run the command once, killed past its timeout or when the poll is cancelled."""
        argv = [
            *self.host.command,
            f"--query-gpu={','.join(fields)}",
            "--format=csv,noheader,nounits",
        ]
        self.runs += 1
        try:
            return await command.run(argv, self.host.timeout_s, str(self.host))
        except (FileNotFoundError, PermissionError) as exc:
            hint = " (the NVIDIA driver's utilities)" if argv[0] == "nvidia-smi" else ""
            raise RuntimeError(f"{argv[0]} cannot run{hint}: {exc.strerror}") from None


def parse_rows(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """The rows of `--format=csv,noheader,nounits` output (field -> text, one per GPU);
    ValueError for a line that has not one cell per field."""
    rows = []
    lines = text.splitlines()
    for number, cells in enumerate(csv.reader(lines, skipinitialspace=True), 1):
        if not cells:
            continue
        if len(cells) != len(fields):
            raise ValueError(
                f"line {number} has {len(cells)} values for {len(fields)} fields: "
                f"{lines[number - 1][:120]!r}"
            )
        rows.append(dict(zip(fields, (cell.strip() for cell in cells), strict=True)))
    return rows
