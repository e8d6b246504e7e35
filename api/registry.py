"""The metric registry: what each metric is (unit, kind, scope, energy role, scale,
thresholds), read from a typed YAML file (api/registry.yaml, or JOBSCOPE_METRIC_REGISTRY)
validated at the API's start. Errors name file, line and field. A metric without an entry
gets defaults inferred from its name's suffix (`inferred: true`), so lookups never fail.

`python -m api.registry check FILE` validates a site's file without starting the API."""

from __future__ import annotations

import re
import sys
from enum import StrEnum
from fnmatch import fnmatchcase
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api import site_file
from api.site_file import SiteFileError

SHIPPED = Path(__file__).with_name("registry.yaml")
"""The registry jobscope ships (the default of JOBSCOPE_METRIC_REGISTRY)."""

PROM_PREFIX = "prom_"
"""Kwollect names a Prometheus sample prom_<name>: without an entry of its own, <name>'s."""

Aggregation = Literal["sum", "mean", "max", "min"]
EnergyRole = Literal["bmc", "pdu", "wattmeter", "rapl", "gpu"]


class RegistryError(SiteFileError):
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


FILE = site_file.SiteFile(
    Registry,
    shipped=SHIPPED,
    env="JOBSCOPE_METRIC_REGISTRY",
    entry_key="name",
    shape="a mapping with energy_priority and metrics",
    holds="a registry",
    error=RegistryError,
)


def unit_sql(reg: Registry, column: str = "metric_id") -> str:
    """A ClickHouse expression of `column`'s unit, as `reg.lookup` gives it (exact entries,
    then patterns in file order, then the entry of a prom_ name's rest, then the suffixes):
    Superset's datasets show units with it. Names are literals, patterns RE2 regexes."""
    rest = f"substring({column}, {len(PROM_PREFIX) + 1})"
    prefixed = (
        f"startsWith({column}, {_literal(PROM_PREFIX)}) AND {column} != {_literal(PROM_PREFIX)}"
    )
    branches = _entry_branches(reg, column)
    branches += [(f"{prefixed} AND {cond}", unit) for cond, unit in _entry_branches(reg, rest)]
    for suffixes, found in _SUFFIXES:
        ends = " OR ".join(f"endsWith(lower({column}), {_literal(x)})" for x in suffixes)
        branches.append((f"({ends})", _literal(found["unit"])))
    conditions = ", ".join(f"{cond}, {unit}" for cond, unit in branches)
    return f"multiIf({conditions}, {_literal(infer('x').unit)})"  # no suffix: infer's default


def _entry_branches(reg: Registry, column: str) -> list[tuple[str, str]]:
    """(condition, unit) SQL of the registry's entries for `column`, in lookup order."""
    exact = [e for e in reg.metrics if not e.is_pattern]
    branches = []
    if exact:
        names = f"[{', '.join(_literal(e.name) for e in exact)}]"
        units = f"[{', '.join(_literal(e.unit) for e in exact)}]"
        branches.append((f"has({names}, {column})", f"transform({column}, {names}, {units}, '')"))
    for entry in reg.metrics:
        if entry.is_pattern:
            regex = _literal(_regex(entry.name))
            branches.append((f"match({column}, {regex})", _literal(entry.unit)))
    return branches


def _regex(pattern: str) -> str:
    """An fnmatch pattern (*, ?, [...], [!...]) as an anchored RE2 regex."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        end = pattern.find("]", i + 2) if c == "[" else -1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif end > 0:
            body = pattern[i + 1 : end]
            negated = body.startswith("!")
            chars = "".join(ch if ch == "-" else re.escape(ch) for ch in body[negated:])
            out.append(f"[{'^' if negated else ''}{chars}]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "^" + "".join(out) + "$"


def _literal(text: str) -> str:
    """A ClickHouse string literal of `text`; braces escaped (Superset's SQL is Jinja)."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    return "'" + escaped.replace("{", "\\x7B").replace("}", "\\x7D") + "'"


def load(path: Path) -> Registry:
    """The registry of `path`; RegistryError naming file:line: field: problem otherwise."""
    return FILE.load(path)


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


def use(path: Path) -> Registry:
    """Load `path` as the API's registry (create_app calls it: a bad file stops the start)."""
    return FILE.use(path)


def registry() -> Registry:
    """The API's registry: the one create_app loaded, else JOBSCOPE_METRIC_REGISTRY's file."""
    return FILE.current()


def main(argv: list[str]) -> int:
    """`python -m api.registry check FILE...`: 0 when every file is valid."""
    return FILE.check(
        argv,
        "api.registry",
        lambda reg: f"{len(reg.metrics)} entries, energy_priority {reg.energy_priority}",
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
