"""Which device a series pushed by a standard protocol (Prometheus remote_write, Influx line
protocol, OTLP: api/otlp.py passes a resource's host.name as `host`, its
service.instance.id as `instance`) belongs to.

Such senders name the machine they scraped or run on by a label, `instance` (Prometheus:
`host:port`) or else `host` (Telegraf), never by a jobscope device id. The site's map
(JOBSCOPE_PUSH_DEVICES, a YAML file validated at start) turns that value into a device id and,
where the device measures another one (a PDU outlet, a wattmeter channel), the `_device_alias`
the producers' device entries give it:

    node-1.example.org:9100: node-1
    "10.0.0.7:9100": node-7
    pdu-3:9116: {device_id: pdu-3-outlet-4, device_alias: node-4}

A value the map does not hold names its device by its host name, the port and the domain
dropped (`node-1.example.org:9100` -> `node-1`), unless JOBSCOPE_PUSH_DEVICE_FROM_INSTANCE is
false; an IP address names no device. The token still decides which devices a push may write.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from api import push
from api.infra.config import ApiSettings
from api.infra.errors import ParameterError
from api.infra.params import device_name
from api.queries.metrics import ALIAS

DEVICE_LABELS = ("instance", "host")
"""The labels naming a sender's machine, the first one present wins."""
_DEVICE_ID = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$"
_HOST_PORT = re.compile(r"^(?P<host>[^:\[\]]+)(?::\d+)?$")
_HOST_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]*(\.[A-Za-z0-9-]+)*$")
"""A DNS name starting with a letter: never an IPv4 or IPv6 address."""


class Target(BaseModel):
    """The device a sender's value maps to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_id: str = Field(min_length=1, max_length=128, pattern=_DEVICE_ID)
    device_alias: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=_DEVICE_ID,
        description="the node this device measures: its readings carry `_device_alias`",
    )


_DeviceId = Annotated[str, Field(min_length=1, max_length=128, pattern=_DEVICE_ID)]
_MAP = TypeAdapter(dict[str, _DeviceId | Target])


class PushDevicesError(ValueError):
    """A map file that cannot be used; the message names the file and the bad entry."""


class PushDevices:
    """The site's map, and the fallback from a host name."""

    def __init__(self, mapping: dict[str, Target], from_instance: bool = True) -> None:
        self.mapping = mapping
        self.from_instance = from_instance

    @classmethod
    def load(cls, path: Path | None, from_instance: bool = True) -> PushDevices:
        """The map in `path` (none: an empty one); PushDevicesError naming what is wrong."""
        if path is None:
            return cls({}, from_instance)
        try:
            data = yaml.safe_load(path.read_text()) or {}
            entries = _MAP.validate_python(data)
        except (OSError, yaml.YAMLError) as exc:
            raise PushDevicesError(f"{path}: {exc}") from None
        except ValidationError as exc:
            raise PushDevicesError(f"{path}: {_problem(data, exc)}") from None
        mapping = {
            key: Target(device_id=value) if isinstance(value, str) else value
            for key, value in entries.items()
        }
        return cls(mapping, from_instance)

    def resolve(self, labels: dict[str, str]) -> tuple[str, Target | None]:
        """The label naming the sender's machine (`instance`, else `host`; '' if neither),
        and the device it maps to, None if it maps to none."""
        label = next((name for name in DEVICE_LABELS if labels.get(name)), "")
        if not label:
            return "", None
        value = labels[label]
        if value in self.mapping:
            return label, self.mapping[value]
        if not self.from_instance:
            return label, None
        match = _HOST_PORT.match(value)
        if match is None or not _HOST_NAME.match(match["host"]):
            return label, None
        return label, Target(device_id=device_name(match["host"]))

    def place(
        self,
        where: str,
        labels: dict[str, str],
        dropped: Collection[str],
        settings: ApiSettings,
        source: str,
    ) -> tuple[str, dict[str, str]]:
        """The device id and the checked labels (as a push's, plus `source` and the map's
        `_device_alias`) of a series with `labels`, less the label naming the device and
        `dropped`; a ParameterError naming `where` when it names no device or is invalid."""
        label, target = self.resolve(labels)
        if target is None:
            raise ParameterError(where, _no_device(label, labels))
        device = push.check_device_id(f"{where}.{label}", target.device_id, settings)
        kept = {k: v for k, v in labels.items() if k not in dropped and k != label}
        kept = push.check_labels(f"{where}.labels", kept, settings, source)
        if target.device_alias is not None:
            kept[ALIAS] = push.check_device_id(where, target.device_alias, settings)
        return device, kept


def _no_device(label: str, labels: dict[str, str]) -> str:
    if not label:
        return "no instance or host label: which device it belongs to is unknown"
    return (
        f"{label} {labels[label]!r} names no device: map it in JOBSCOPE_PUSH_DEVICES "
        "(an IP address, or any value when JOBSCOPE_PUSH_DEVICE_FROM_INSTANCE is false, "
        "is never taken as a device id)"
    )


def _problem(data: object, exc: ValidationError) -> str:
    """The first bad entry and what is wrong with it, as written (a device id or a mapping)."""
    errors = exc.errors()
    if not isinstance(data, dict):
        return "expected a mapping of `value: device_id` or `value: {device_id, device_alias}`"
    key = errors[0]["loc"][0]
    shape = "Target" if isinstance(data[key], dict) else "constrained-str"
    error = next((e for e in errors if e["loc"][:2] == (key, shape)), errors[0])
    field = "".join(f".{part}" for part in error["loc"][2:])
    return f"entry {key!r}{field}: {error['msg']}"
