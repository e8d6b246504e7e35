"""The metric registry: what each metric is (unit, kind, scope, energy role, scale,
thresholds), read from a typed YAML file (api/registry.yaml, or JOBSCOPE_METRIC_REGISTRY)
validated at the API's start. Errors name file, line and field. A metric without an entry
gets defaults inferred from its name's suffix (`inferred: true`), so lookups never fail.

`python -m api.registry check FILE` validates a site's file without starting the API."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from enum import StrEnum
from fnmatch import fnmatchcase
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SHIPPED = Path(__file__).with_name("registry.yaml")
"""The registry jobscope ships (the default of JOBSCOPE_METRIC_REGISTRY)."""

PROM_PREFIX = "prom_"
"""Kwollect names a Prometheus sample prom_<name>: without an entry of its own, <name>'s."""

Aggregation = Literal["sum", "mean", "max", "min"]
EnergyRole = Literal["bmc", "pdu", "wattmeter", "rapl", "gpu"]


class RegistryError(ValueError):
    """An invalid registry file: each line reads `file:line: field: problem`."""


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    ENERGY_COUNTER = "energy_counter"


class Thresholds(BaseModel):
    """Levels of a gauge: above caution (or below, higher_is_worse false) is worth a look."""

    model_config = ConfigDict(extra="forbid")

    normal: float | None = None
    caution: float | None = None
    alert: float | None = None
    higher_is_worse: bool = True


class MetricInfo(BaseModel):
    """One entry: an exact metric_id or a glob pattern ('*', '?') and what it measures."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, examples=["bmc_node_power_watt", "bmc_*_temp_celsius"])
    unit: str = Field(min_length=1, examples=["W", "J", "B", "Cel", "%", "1"])
    kind: Kind
    scope: str = Field(min_length=1)
    node_aggregation: Aggregation | None = None
    energy_role: EnergyRole | None = None
    counter_bits: Literal[32, 64] | None = None
    key: bool = False
    idle: float | None = None
    peak: float | None = None
    thresholds: Thresholds | None = None
    description: str = ""
    inferred: bool = False

    @property
    def is_pattern(self) -> bool:
        return "*" in self.name or "?" in self.name or "[" in self.name

    @model_validator(mode="after")
    def _consistent(self) -> MetricInfo:
        if self.idle is not None and self.peak is not None and self.idle >= self.peak:
            raise ValueError(f"idle ({self.idle}) must be below peak ({self.peak})")
        if self.counter_bits is not None and self.kind == Kind.GAUGE:
            raise ValueError("counter_bits is for counters, not gauges")
        if self.energy_role is not None and self.unit not in ("W", "J"):
            raise ValueError(f"an energy_role needs unit W (power) or J, not {self.unit!r}")
        return self


class Registry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    energy_priority: list[EnergyRole] = Field(
        default_factory=lambda: ["wattmeter", "pdu", "bmc", "rapl", "gpu"],
        examples=[["wattmeter", "pdu", "bmc", "rapl", "gpu"]],
    )
    metrics: list[MetricInfo] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> Registry:
        seen: set[str] = set()
        for entry in self.metrics:
            if entry.name in seen:
                raise ValueError(f"metric {entry.name!r} has two entries")
            seen.add(entry.name)
        if len(set(self.energy_priority)) != len(self.energy_priority):
            raise ValueError("energy_priority names a role twice")
        return self

    def lookup(self, metric_id: str) -> MetricInfo:
        """The exact entry, else the first pattern matching (file order), else inferred."""
        return _lookup(self, metric_id)

    def public(self) -> dict[str, Any]:
        """The JSON answer of GET /api/metrics/registry."""
        return self.model_dump(mode="json")

    def __hash__(self) -> int:
        return id(self)


@lru_cache(maxsize=4096)
def _lookup(reg: Registry, metric_id: str) -> MetricInfo:
    for entry in reg.metrics:
        if not entry.is_pattern and entry.name == metric_id:
            return entry
    for entry in reg.metrics:
        if entry.is_pattern and fnmatchcase(metric_id, entry.name):
            return entry
    if metric_id.startswith(PROM_PREFIX) and len(metric_id) > len(PROM_PREFIX):
        found = _lookup(reg, metric_id[len(PROM_PREFIX) :])
        if not found.inferred:
            return found
    return infer(metric_id)


_SUFFIXES: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("_joules_total", "_joule", "_joules"), {"unit": "J", "kind": Kind.ENERGY_COUNTER}),
    (("_bytes_total",), {"unit": "B", "kind": Kind.COUNTER, "node_aggregation": "sum"}),
    (("_seconds_total",), {"unit": "s", "kind": Kind.COUNTER}),
    (("_total",), {"unit": "1", "kind": Kind.COUNTER}),
    (("_watt", "_watts"), {"unit": "W", "kind": Kind.GAUGE, "node_aggregation": "sum"}),
    (("_celsius",), {"unit": "Cel", "kind": Kind.GAUGE, "node_aggregation": "max"}),
    (("_percent",), {"unit": "%", "kind": Kind.GAUGE, "node_aggregation": "mean"}),
    (("_ratio",), {"unit": "1", "kind": Kind.GAUGE, "node_aggregation": "mean"}),
    (("_bytes",), {"unit": "B", "kind": Kind.GAUGE, "node_aggregation": "sum"}),
    (("_volt", "_volts"), {"unit": "V", "kind": Kind.GAUGE}),
    (("_amp", "_amps", "_ampere"), {"unit": "A", "kind": Kind.GAUGE}),
    (("_rpm",), {"unit": "{rpm}", "kind": Kind.GAUGE}),
]


def infer(metric_id: str) -> MetricInfo:
    """Defaults from the name's suffix (Prometheus conventions); no energy role, no scale."""
    lowered = metric_id.lower()
    fields: dict[str, Any] = {"unit": "1", "kind": Kind.GAUGE}
    for suffixes, found in _SUFFIXES:
        if lowered.endswith(suffixes):
            fields = found
            break
    return MetricInfo(
        name=metric_id,
        scope="device",
        description="no registry entry: unit and kind inferred from the name",
        inferred=True,
        **fields,
    )


def load(path: Path) -> Registry:
    """The registry of `path`; RegistryError naming file:line: field: problem otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RegistryError(f"{path}:0: (file): {exc.strerror or exc}") from exc
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        line = (exc.problem_mark.line + 1) if exc.problem_mark else 0
        context = exc.context_mark and f" ({exc.context} at line {exc.context_mark.line + 1})"
        raise RegistryError(f"{path}:{line}: (yaml): {exc.problem}{context or ''}") from exc
    if not isinstance(data, dict):
        raise RegistryError(f"{path}:1: (file): a mapping with energy_priority and metrics")
    if twice := list(_duplicate_keys(root, "")):
        raise RegistryError(
            "\n".join(f"{path}:{line}: {field}: given twice" for line, field in twice)
        )
    try:
        return Registry.model_validate(data)
    except ValidationError as exc:
        lines = [_located(path, root, error) for error in exc.errors()]
        raise RegistryError("\n".join(lines)) from exc


def _located(path: Path, root: yaml.Node | None, error: Any) -> str:
    """One pydantic error as `file:line: field: problem`, the line read from the YAML node."""
    loc = [part for part in error["loc"] if not str(part).startswith("function-")]
    node, line = root, 1
    for part in loc:
        child = _child(node, part)
        if child is None:
            break
        node, line = child
    field = _field_name(root, loc) or "(file)"
    return f"{path}:{line}: {field}: {error['msg']}"


def _duplicate_keys(node: yaml.Node | None, where: str) -> Iterator[tuple[int, str]]:
    """Keys a mapping gives twice (YAML loaders keep the last silently): line, field."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            field = f"{where}.{key.value}" if where else str(key.value)
            if key.value in seen:
                yield key.start_mark.line + 1, field
            seen.add(key.value)
            yield from _duplicate_keys(value, field)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            name = _entry_name(node, i)
            yield from _duplicate_keys(item, f"{where}[{name or i}]")


def _child(node: yaml.Node | None, part: Any) -> tuple[yaml.Node, int] | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == str(part):
                return value, key.start_mark.line + 1
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        item = node.value[part]
        return item, item.start_mark.line + 1
    return None


def _field_name(root: yaml.Node | None, loc: list[Any]) -> str:
    """metrics[3].unit reads `metrics[node_power].unit`: the entry by its name."""
    out: list[str] = []
    node = root
    for part in loc:
        if isinstance(part, int):
            name = _entry_name(node, part)
            out[-1:] = [f"{out[-1] if out else ''}[{name or part}]"]
        else:
            out.append(str(part))
        child = _child(node, part)
        node = child[0] if child else None
    return ".".join(out)


def _entry_name(node: yaml.Node | None, index: int) -> str | None:
    if isinstance(node, yaml.SequenceNode) and index < len(node.value):
        found = _child(node.value[index], "name")
        if found and isinstance(found[0], yaml.ScalarNode):
            return found[0].value
    return None


def describe(metric_id: str) -> dict[str, Any]:
    """The registry's fields a catalog row carries (unit, kind, scope, description, inferred)."""
    info = registry().lookup(metric_id)
    return {
        "unit": info.unit,
        "kind": info.kind.value,
        "scope": info.scope,
        "description": info.description,
        "inferred": info.inferred,
    }


_current: Registry | None = None


def use(path: Path) -> Registry:
    """Load `path` as the API's registry (create_app calls it: a bad file stops the start)."""
    global _current
    _current = load(path)
    return _current


def registry() -> Registry:
    """The API's registry: the one create_app loaded, else JOBSCOPE_METRIC_REGISTRY's file."""
    if _current is None:
        return use(Path(os.environ.get("JOBSCOPE_METRIC_REGISTRY") or SHIPPED))
    return _current


def main(argv: list[str]) -> int:
    """`python -m api.registry check FILE...`: 0 when every file is valid."""
    if len(argv) < 2 or argv[0] != "check":
        print("usage: python -m api.registry check FILE...", file=sys.stderr)
        return 2
    status = 0
    for name in argv[1:]:
        try:
            reg = load(Path(name))
        except RegistryError as exc:
            print(exc, file=sys.stderr)
            status = 1
            continue
        print(f"{name}: {len(reg.metrics)} entries, energy_priority {reg.energy_priority}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
