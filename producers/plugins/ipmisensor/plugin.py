"""`ipmisensor://`: BMC sensors read with FreeIPMI's `ipmi-sensors`, as Kwollect does.

One instance polls every entry of one BMC (same host, port, user, password and options):
one `ipmi-sensors` run per BMC and tick, with the SDR kept in a cache directory instead of
downloaded at every poll. The runs of the whole process are bounded by a semaphore, each
run by a timeout; a cancelled or overdue run is killed.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from kafka.reading import Reading
from producers.plugins import command
from producers.plugins.base import OneRequestPlugin, ProcessLimit, validated

if TYPE_CHECKING:
    from producers.entry import DeviceEntry

IPMI_SENSORS = "/usr/sbin/ipmi-sensors"
DEFAULT_PORT = 623
MAX_CONCURRENT_BMCS = int(os.environ.get("JOBSCOPE_IPMI_MAX_CONCURRENT", "32"))
"""How many `ipmi-sensors` runs the process allows at once (over all BMCs)."""
SDR_CACHE_DIR = Path(
    os.environ.get(
        "JOBSCOPE_IPMI_SDR_CACHE_DIR",
        Path(__file__).resolve().parents[3] / "state" / "ipmi-sdr-cache",
    )
)
"""Where `ipmi-sensors` keeps each BMC's SDR (its sensor list) between polls."""
_STALE_CACHE = ("out of date", "invalid", "corrupt")
"""Words of an `SDR Cache ...` error: the cache is rebuilt and the run retried once."""


class IpmiOptions(BaseModel):
    """The `options` of an `ipmisensor://` entry (all optional: Kwollect's have none)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    password_env: str | None = Field(
        None, description="environment variable holding the password (instead of the URL)"
    )
    timeout_s: float = Field(5.0, gt=0, le=300, description="one poll of the BMC, at most")
    privilege: Literal["user", "operator", "admin"] = "user"
    cipher_suite_id: int = Field(3, ge=0, le=17, description="RMCP+ cipher suite")
    workarounds: tuple[str, ...] = Field(
        (), description="FreeIPMI -W workarounds, e.g. opensesspriv (ipmi_sim needs it)"
    )


@dataclass(frozen=True)
class Bmc:
    """Who to ask and how: entries with equal BMCs (and periods) share one poll."""

    host: str
    port: int
    user: str
    password: SecretStr = field(repr=False)
    options: IpmiOptions

    def __str__(self) -> str:
        return f"{self.user or '(null user)'}@{self.host}:{self.port}"


@dataclass(frozen=True)
class Target:
    """One entry: the sensor (record ID or name) it reads."""

    entry: DeviceEntry
    sensor: str
    scale: float


def parse(entry: DeviceEntry) -> tuple[Bmc, str]:
    """The BMC and sensor of an `ipmisensor://` entry; ValueError naming what is wrong."""
    parts = urlsplit(entry.url)
    if parts.query or parts.fragment:
        raise ValueError("ipmisensor:// takes no ?query: jobscope's settings go in `options`")
    if not parts.hostname:
        raise ValueError(
            "ipmisensor:// needs a host: ipmisensor://user[:password]@host[:port]/SENSOR"
        )
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise ValueError(f"bad port: {exc}") from None
    sensor = unquote(parts.path).lstrip("/")
    if not sensor:
        raise ValueError(
            "ipmisensor:// needs a sensor name or record ID as its path: .../Inlet Temp"
        )
    options = validated(entry.options, IpmiOptions)
    password = unquote(parts.password) if parts.password is not None else None
    if options.password_env:
        if password is not None:
            raise ValueError("give the password in the URL or in options.password_env, not both")
        password = os.environ.get(options.password_env)
        if password is None:
            raise ValueError(f"environment variable {options.password_env} (password) is not set")
    user = unquote(parts.username or "")
    for what, value, longest in (("user", user, 16), ("password", password or "", 20)):
        if len(value.encode()) > longest or any(c.isspace() or c == "#" for c in value):
            raise ValueError(f"{what}: at most {longest} bytes, no spaces or '#' (IPMI 2.0)")
    return Bmc(parts.hostname, port, user, SecretStr(password or ""), options), sensor


_runs = ProcessLimit(MAX_CONCURRENT_BMCS)


class IpmiSensorPlugin(OneRequestPlugin):
    scheme = "ipmisensor"

    def __init__(self, entries: Sequence[DeviceEntry], bmc: Bmc) -> None:
        self.entries = tuple(entries)
        self.bmc = bmc
        self.targets = [
            Target(entry, parse(entry)[1], entry.scale_factor or 1.0) for entry in entries
        ]
        self.runs = 0
        """`ipmi-sensors` runs so far (tests check one run per poll)."""

    @classmethod
    def parse(cls, entry: DeviceEntry) -> tuple[Hashable, object]:
        """(the BMC, the entry's sensor): one `ipmi-sensors` run per poll."""
        return parse(entry)

    async def poll(self, timestamp_us: int) -> list[Reading]:
        by_id, by_name = parse_table(await self.read_table())
        readings: list[Reading] = []
        for target in self.targets:
            entry = target.entry
            what = f"{entry.name} (sensor {target.sensor!r})"
            matches = by_id.get(target.sensor) or by_name.get(target.sensor, [])
            if not matches:
                self.skips.skip(entry.device_id, what, f"no such sensor name or ID on {self.bmc}")
            elif len(matches) > 1:
                ids = ", ".join(sensor_id for sensor_id, _ in matches)
                self.skips.skip(entry.device_id, what, f"several sensors (IDs {ids}): use an ID")
            elif (value := _number(matches[0][1])) is None:
                self.skips.skip(entry.device_id, what, f"reading {matches[0][1]!r}")
            else:
                readings.append(
                    Reading(
                        timestamp_us,
                        entry.device_id,
                        entry.name,
                        value * target.scale,
                        entry.labels,
                    )
                )
        return readings

    async def read_table(self) -> str:
        """The output of one `ipmi-sensors` run (two if the cached SDR is stale)."""
        async with _runs():
            code, out, err = await self._run(recreate_cache=False)
            if code != 0 and _stale_cache(err):
                code, out, err = await self._run(recreate_cache=True)
        if code != 0:
            lines = [line.strip() for line in err.splitlines() if line.strip()]
            reason = lines[-1].removeprefix(f"{IPMI_SENSORS}:").strip() if lines else ""
            raise RuntimeError(f"ipmi-sensors on {self.bmc}: {reason or f'exit status {code}'}")
        return out

    async def _run(self, recreate_cache: bool) -> tuple[int, str, str]:
        """Run `ipmi-sensors` once; the password goes through a pipe, never the command line."""
        options = self.bmc.options
        SDR_CACHE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        argv = [
            IPMI_SENSORS,
            "--driver-type=LAN_2_0",
            f"--hostname={self.bmc.host}:{self.bmc.port}",
            f"--privilege-level={options.privilege}",
            f"--cipher-suite-id={options.cipher_suite_id}",
            f"--session-timeout={int(options.timeout_s * 1000)}",
            f"--retransmission-timeout={min(1000, int(options.timeout_s * 500))}",
            f"--sdr-cache-directory={SDR_CACHE_DIR}",
            "--quiet-cache",
            "--bridge-sensors",
            "--no-header-output",
        ]
        if self.bmc.user:
            argv.append(f"--username={self.bmc.user}")
        if options.workarounds:
            argv.append(f"--workaround-flags={','.join(options.workarounds)}")
        if recreate_cache:
            argv.append("--sdr-cache-recreate")
        read_fd, write_fd = os.pipe()
        try:
            password = self.bmc.password.get_secret_value()
            os.write(write_fd, f"password {password}\n".encode() if password else b"")
            os.close(write_fd)
            write_fd = -1
            argv.append(f"--config-file=/dev/fd/{read_fd}")
            self.runs += 1
            try:
                return await command.run(
                    argv, options.timeout_s, f"ipmi-sensors on {self.bmc}", (read_fd,)
                )
            except FileNotFoundError:
                raise RuntimeError(
                    f"{IPMI_SENSORS} not found: install the Debian package freeipmi-tools"
                ) from None
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)


def parse_table(
    text: str,
) -> tuple[dict[str, list[tuple[str, str]]], dict[str, list[tuple[str, str]]]]:
    """(by record ID, by name) -> [(record ID, reading)] from `ipmi-sensors` output rows
    `ID | Name | Type | Reading | Units | Event`."""
    by_id: dict[str, list[tuple[str, str]]] = {}
    by_name: dict[str, list[tuple[str, str]]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) < 4:
            continue
        sensor_id, name, reading = cells[0], cells[1], cells[3]
        by_id.setdefault(sensor_id, []).append((sensor_id, reading))
        by_name.setdefault(name, []).append((sensor_id, reading))
    return by_id, by_name


def _stale_cache(stderr: str) -> bool:
    text = stderr.lower()
    return "sdr cache" in text and any(word in text for word in _STALE_CACHE)


def _number(reading: str) -> float | None:
    """The reading as a float; None for N/A (or anything else that is not a number)."""
    try:
        return float(reading)
    except ValueError:
        return None
