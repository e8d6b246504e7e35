"""The configuration of a `wattmeter://` entry: where its frames come from, their layout, the
node mapping, and jobscope's own settings; validated when the devices file loads."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from producers.plugins.base import url_options, validated

if TYPE_CHECKING:
    from producers.entry import DeviceEntry

PORT_DEVICE = re.compile(r"^(?P<meter>.+)-port(?P<port>\d+)$")
"""A port's device id: `<meter device_id>-port<N>`, N from 0 (Kwollect's naming)."""


class WattmeterQuery(BaseModel):
    """The query string of a `wattmeter://` URL: Kwollect's `wattmetre_version` and
    `mapping_file_path`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(2, description="frame layout: 2 or 3 (Kwollect's default: 2)")
    mapping: Path | None = Field(
        None, description="YAML file: node -> its ports (`<meter>-port<N>`), or one port"
    )

    @field_validator("version")
    @classmethod
    def _known_layout(cls, version: int) -> int:
        if version not in (2, 3):
            raise ValueError("2 or 3 (the frame layouts Kwollect reads)")
        return version


class WattmeterOptions(BaseModel):
    """The `options` of a `wattmeter://` entry (all optional for a meter read over TCP)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: tuple[str, ...] | None = Field(
        None,
        min_length=1,
        description="read the frames from this program's standard output instead of TCP "
        "(URL without a host): argv, no shell",
    )
    timeout_s: float = Field(
        5.0, gt=0, le=300, description="connecting, and silence before the stream is restarted"
    )
    retry_max_s: float = Field(
        30.0, gt=0, le=3600, description="longest wait between two reconnections"
    )
    buffer_bytes: int = Field(
        4 << 20,
        ge=64 << 10,
        le=1 << 30,
        description="unpolled data kept at most (beyond it the oldest frames are dropped)",
    )


@dataclass(frozen=True)
class Tcp:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"command {' '.join(self.argv)}"


@dataclass(frozen=True)
class Meter:
    """One entry, validated: the meter's frames, their layout and how ports map to nodes."""

    source: Tcp | Command
    version: int
    aliases: dict[str, str]
    """port device id -> the node it measures (the mapping file, this meter's ports)."""
    options: WattmeterOptions


def parse(entry: DeviceEntry) -> Meter:
    """The meter of a `wattmeter://` entry; ValueError naming what is wrong."""
    parts = urlsplit(entry.url)
    if parts.fragment or parts.path not in ("", "/"):
        raise ValueError(
            "wattmeter:// takes host:port and ?version=&mapping= only: "
            "wattmeter://HOST:PORT/?version=2&mapping=FILE"
        )
    query = url_options(entry.url, WattmeterQuery)
    options = validated(entry.options, WattmeterOptions)
    source: Tcp | Command
    if parts.netloc:
        if options.command is not None:
            raise ValueError("give either a host (TCP) or options.command, not both")
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"bad port: {exc}") from None
        if not parts.hostname or port is None:
            raise ValueError("wattmeter:// needs host and port: wattmeter://HOST:PORT/")
        if parts.username is not None:
            raise ValueError("wattmeter:// takes no user or password")
        source = Tcp(parts.hostname, port)
    elif options.command is not None:
        source = Command(options.command)
    else:
        raise ValueError(
            "wattmeter:// needs a host (wattmeter://HOST:PORT/) or, with no host "
            "(wattmeter:///?version=...), options.command"
        )
    aliases = {}
    if query.mapping is not None:
        aliases = {
            port: node
            for port, node in load_mapping(query.mapping).items()
            if _meter_of(port) == entry.device_id
        }
    return Meter(source, query.version, aliases, options)


def load_mapping(path: Path) -> dict[str, str]:
    """port device id -> node, from Kwollect's mapping file (`node: [port, ...]`, a single
    port also accepted); ValueError naming what is wrong. Relative paths start from the
    working directory."""
    try:
        document: Any = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"mapping: cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"mapping: {path} is not YAML: {exc}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ValueError(f"mapping: {path} must map each node to its ports")
    aliases: dict[str, str] = {}
    for node, ports in document.items():
        listed = [ports] if isinstance(ports, str) else ports
        if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
            raise ValueError(f"mapping: {path}: {node}: a port or a list of ports")
        for port in listed:
            if PORT_DEVICE.match(port) is None:
                raise ValueError(f"mapping: {path}: {node}: {port!r} is not <meter>-port<N>")
            if port in aliases and aliases[port] != str(node):
                raise ValueError(
                    f"mapping: {path}: {port} is mapped to both {aliases[port]} and {node}"
                )
            aliases[port] = str(node)
    return aliases


def _meter_of(port_device: str) -> str | None:
    match = PORT_DEVICE.match(port_device)
    return match["meter"] if match else None


def port_device(meter_id: str, port: int) -> str:
    return f"{meter_id}-port{port}"
