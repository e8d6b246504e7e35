"""What a job was given inside each of its nodes (CPU ids or a count, GPU indexes and UUIDs,
memory), and which readings that makes the job's.

A job's `allocations` maps a node to `{"cpus": "0-15,32" | 16, "gpus": ["0", "1"],
"gpu_uuids": ["GPU-..."], "memory_mb": 64000}` (every key optional); a node without an entry,
or a job without allocations, is the job's whole. The API, the jobs topic (kafka/jobs.py) and
ClickHouse's `jobs.allocations` (JSON text) carry this one form; `normalized` checks it and
writes it canonically.

A reading labelled `gpu` (an index or a UUID) or `gpu_uuid` on a node where the job holds
GPUs belongs to the job only if that GPU is one of them; one labelled `cpu` (else `core`)
with a CPU id (decimal digits), on a node where the job holds CPU ids, only if that CPU is.
Other readings (node-level, or a `core="all"`) stay in every job on the node. `Allocated`
applies the rule in Python (live streams), api/queries/metrics.py in SQL: both read the
labels below the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

KEYS = ("cpus", "gpus", "gpu_uuids", "memory_mb")
MAX_CPU_ID = 65_535
"""Linux builds for at most 8192 CPUs; an id above this is a mistake (or an attack on the
expansion of a range)."""
MAX_GPUS = 256
"""GPU indexes or UUIDs per node (MIG instances included)."""
MAX_GPU_INDEX = 4095
MAX_MEMORY_MB = 1 << 40
GPU_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./:-]{0,127}")
"""NVIDIA's `GPU-<uuid>` and `MIG-<uuid>` (older MIG ids: `MIG-GPU-<uuid>/1/0`), AMD's
hex ids."""
_CPUSET_ITEM = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?")
CPU_ID_LABEL = re.compile(r"[0-9]{1,9}")
"""A `cpu`/`core` label value that names one CPU (SQL: `match(v, '^[0-9]{1,9}$')`)."""


def parse_cpuset(text: str) -> list[int]:
    """The sorted CPU ids of a Linux cpuset list (`0-15,32`, cpuset(7)); ValueError if it is
    not one, or names an id above MAX_CPU_ID."""
    ids: set[int] = set()
    for item in text.strip().split(","):
        found = _CPUSET_ITEM.fullmatch(item.strip())
        if found is None:
            raise ValueError(f"{text[:64]!r} is not a CPU list such as 0-15,32")
        first = int(found[1])
        last = int(found[2]) if found[2] is not None else first
        if last < first or last > MAX_CPU_ID:
            raise ValueError(f"{item.strip()!r}: ids run from 0 to {MAX_CPU_ID}, upwards")
        ids.update(range(first, last + 1))
    return sorted(ids)


def format_cpuset(ids: list[int]) -> str:
    """Sorted ids as the shortest cpuset list: [0, 1, 2, 5] is `0-2,5`."""
    ranges: list[list[int]] = []
    for i in ids:
        if ranges and i == ranges[-1][1] + 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def normalized_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One node's allocation in canonical form (a cpuset rewritten shortest, GPUs sorted and
    unique, empty keys dropped); ValueError naming the key if it is not one."""
    if not isinstance(entry, Mapping):
        raise ValueError("an allocation is an object")
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a key of an allocation ({', '.join(KEYS)})")
    out: dict[str, Any] = {}
    cpus = entry.get("cpus")
    if isinstance(cpus, bool) or not isinstance(cpus, str | int | None):
        raise ValueError("cpus: a CPU list such as 0-15,32, or a count, is required")
    if isinstance(cpus, int):
        if not 0 < cpus <= MAX_CPU_ID + 1:
            raise ValueError(f"cpus: a count from 1 to {MAX_CPU_ID + 1} is required")
        out["cpus"] = cpus
    elif cpus is not None and cpus.strip():
        out["cpus"] = format_cpuset(_named("cpus", parse_cpuset, cpus))
    gpus = _strings("gpus", entry.get("gpus"))
    for gpu in gpus:
        if not CPU_ID_LABEL.fullmatch(gpu) or int(gpu) > MAX_GPU_INDEX:
            raise ValueError(f"gpus: {gpu[:64]!r} is not a GPU index (0 to {MAX_GPU_INDEX})")
    if gpus:
        out["gpus"] = [str(i) for i in sorted({int(g) for g in gpus})]
    uuids = _strings("gpu_uuids", entry.get("gpu_uuids"))
    for uuid in uuids:
        if not GPU_UUID.fullmatch(uuid):
            raise ValueError(f"gpu_uuids: {uuid[:64]!r} is not a GPU or MIG UUID")
    if uuids:
        out["gpu_uuids"] = list(dict.fromkeys(uuids))
    memory = entry.get("memory_mb")
    if memory is not None:
        if isinstance(memory, bool) or not isinstance(memory, int):
            raise ValueError("memory_mb: an integer is required")
        if not 0 <= memory <= MAX_MEMORY_MB:
            raise ValueError(f"memory_mb: 0 to {MAX_MEMORY_MB} is required")
        out["memory_mb"] = memory
    return out


def normalized(allocations: Any, nodes: list[str]) -> dict[str, dict[str, Any]]:
    """`allocations` in canonical form, nodes without anything left out; ValueError starting
    with the node (`node-1.cpus: ...`) if it is not a valid one for a job on `nodes`."""
    if not isinstance(allocations, Mapping):
        raise ValueError("an object of nodes is required")
    known = set(nodes)
    out: dict[str, dict[str, Any]] = {}
    for node, entry in allocations.items():
        if node not in known:
            raise ValueError(f"{str(node)[:64]}: not a node of the job")
        try:
            checked = normalized_entry(entry)
        except ValueError as exc:
            raise ValueError(f"{node}.{exc}") from None
        if checked:
            out[node] = checked
    return out


def _named(name: str, parse: Any, value: str) -> Any:
    try:
        return parse(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _strings(name: str, value: Any) -> list[str]:
    """A list of ids (integers read as their digits), at most MAX_GPUS."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_GPUS:
        raise ValueError(f"{name}: a list of at most {MAX_GPUS} ids is required")
    out = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            item = str(item)
        if not isinstance(item, str) or not item:
            raise ValueError(f"{name}: ids are non-empty strings")
        out.append(item)
    return out


@dataclass(frozen=True)
class Allocated:
    """A job's allocated ids per node, as scopes filter readings by them: `gpus` holds each
    node's indexes and UUIDs together (a `gpu` label may hold either), `cpus` its CPU ids
    (a node given only a count has none: its per-CPU readings all stay)."""

    gpus: tuple[tuple[str, tuple[str, ...]], ...] = ()
    cpus: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @classmethod
    def of(cls, allocations: Mapping[str, Mapping[str, Any]]) -> Allocated | None:
        """The ids of canonical `allocations`; None when they name no GPU and no CPU id."""
        gpus, cpus = [], []
        for node, entry in sorted(allocations.items()):
            ids = (*entry.get("gpus", ()), *entry.get("gpu_uuids", ()))
            if ids:
                gpus.append((node, tuple(ids)))
            if isinstance(entry.get("cpus"), str):
                cpus.append((node, tuple(parse_cpuset(entry["cpus"]))))
        if not gpus and not cpus:
            return None
        return cls(tuple(gpus), tuple(cpus))

    @cached_property
    def _gpu_sets(self) -> dict[str, frozenset[str]]:
        return {node: frozenset(ids) for node, ids in self.gpus}

    @cached_property
    def _cpu_sets(self) -> dict[str, frozenset[int]]:
        return {node: frozenset(ids) for node, ids in self.cpus}

    def admits(self, node: str, labels: Mapping[str, str]) -> bool:
        """Whether a reading of `node` (its device, or the node its `_device_alias` names)
        with these labels belongs to the job."""
        gpu, uuid = labels.get("gpu", ""), labels.get("gpu_uuid", "")
        if gpu or uuid:
            held = self._gpu_sets.get(node)
            if held is not None and gpu not in held and uuid not in held:
                return False
        cpu = labels.get("cpu") or labels.get("core", "")
        if CPU_ID_LABEL.fullmatch(cpu):
            cpus = self._cpu_sets.get(node)
            if cpus is not None and int(cpu) not in cpus:
                return False
        return True
