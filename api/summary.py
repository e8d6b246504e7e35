"""A job's summary shaped from its statistics rows (api/queries/summary.py runs the query):
units and kinds from the metric registry, counters' increase and rate, energy per node and
source with the site's preferred source, the spread between sources of one node, and the
job's energy. No SQL here.

Which source is "the" energy of a node: the registry's `energy_priority` ranks energy roles
(wattmeter before pdu before bmc ...); among rows of one role, the one covering more of the
job. The spread compares the node-level sources only: a metric whose registry scope is the
node, or the devices aliased to the node (a PDU's outlets, a wattmeter's channel), never a
part of it (RAPL's packages, a GPU).

The job's energy is the sum of its nodes' preferred energies; its coverage the least any of
its nodes has (a node without any energy source: 0), so that a figure quoted with a
coverage of 0.98 misses at most 2% of any node's time. On a node the job shares, its part of
the node's energy is the site's policy's (api/sharing.py, applied after `shape`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.registry import Kind, MetricInfo, Registry

J_PER_UNIT = {"J": 1.0, "mJ": 1e-3, "uJ": 1e-6, "kJ": 1e3, "Wh": 3600.0, "kWh": 3.6e6}
"""Joules per unit of an energy counter: its delta as energy."""

COUNTERS = (Kind.COUNTER, Kind.ENERGY_COUNTER)


@dataclass(frozen=True)
class Kinds:
    """What the statistics query needs to know of the scope's metrics."""

    power: list[str]
    counters: list[str]
    counter_bits: dict[str, int]


def kinds(metric_ids: list[str], reg: Registry) -> Kinds:
    """Power gauges (unit W) are integrated; counters are summed up as increases."""
    infos = {m: reg.lookup(m) for m in metric_ids}
    return Kinds(
        power=sorted(m for m, i in infos.items() if i.kind == Kind.GAUGE and i.unit == "W"),
        counters=sorted(m for m, i in infos.items() if i.kind in COUNTERS),
        counter_bits={m: i.counter_bits or 0 for m, i in infos.items() if i.kind in COUNTERS},
    )


def empty(job_id: str, start: str | None, end: str | None) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "start": start,
        "end": end,
        "duration_s": 0.0,
        "metrics": [],
        "energy": [],
        "energy_total": [],
        "energy_nodes": [],
        "energy_job": None,
        "footprint": [],
        "notes": [],
        "record": None,
    }


def metric_row(row: dict[str, Any], info: MetricInfo) -> dict[str, Any]:
    counter = info.kind in COUNTERS
    covered = row["counter_covered_s"]
    return {
        "device_id": row["device_id"],
        "metric_id": row["metric_id"],
        "min": row["min"],
        "avg": row["avg"],
        "max": row["max"],
        "last": row["last"],
        "count": row["count"],
        "pushed": row["pushed"],
        "unit": info.unit,
        "kind": info.kind.value,
        "p95": None if counter else row["p95"],
        "delta": row["delta"] if counter else None,
        "rate": row["rate"] if counter and covered > 0 else None,
        "resets": row["resets"] if counter else None,
    }


def energy_row(row: dict[str, Any], info: MetricInfo, nodes: set[str]) -> dict[str, Any] | None:
    """The energy of a node by this row's source: integrated power, or an energy counter's
    increase in joules; None for any other row."""
    if row["power"]:
        joules, covered, readings = row["joules"], row["covered_s"], row["power_readings"]
    elif (
        info.kind == Kind.ENERGY_COUNTER
        and info.unit in J_PER_UNIT
        and row["device_id"] in nodes
        and row["counter_covered_s"] > 0
    ):
        joules = row["delta"] * J_PER_UNIT[info.unit]
        covered, readings = row["counter_covered_s"], row["count"]
    else:
        return None
    node = row["device_id"]
    return {
        "node": node,
        "metric_id": row["metric_id"],
        "sources": row["sources"],
        "joules": joules,
        "covered_s": covered,
        "readings": readings,
        "pushed": row["pushed"],
        "role": info.energy_role,
        "preferred": False,
        # not in the answer: whether the source measures the whole node (see the docstring)
        "_whole": info.scope == "node" or row["sources"] != [node],
    }


def shape(
    rows: list[dict[str, Any]], summary: dict[str, Any], nodes: list[str], reg: Registry
) -> None:
    """Fill `summary` (start, end and duration_s set) from the statistics rows."""
    totals: dict[tuple[str, bool], tuple[float, int]] = {}
    node_set = set(nodes)
    for row in rows:
        info = reg.lookup(row["metric_id"])
        summary["metrics"].append(metric_row(row, info))
        energy = energy_row(row, info, node_set)
        if energy is not None:
            summary["energy"].append(energy)
            key = (energy["metric_id"], energy["pushed"])
            joules, count = totals.get(key, (0.0, 0))
            totals[key] = (joules + energy["joules"], count + 1)
    summary["energy_total"] = [
        {"metric_id": m, "joules": j, "nodes": n, "pushed": p}
        for (m, p), (j, n) in sorted(totals.items())
    ]
    summary["energy_nodes"] = energy_nodes(summary["energy"], summary["duration_s"], reg)
    summary["energy_job"] = energy_job(summary["energy_nodes"], nodes, summary["duration_s"])
    for energy in summary["energy"]:
        del energy["_whole"]


def _rank(row: dict[str, Any], priority: list[str]) -> tuple[int, float, str]:
    role = row["role"]
    place = priority.index(role) if role in priority else len(priority)
    return place, -row["covered_s"], row["metric_id"]


def energy_nodes(
    energy: list[dict[str, Any]], duration_s: float, reg: Registry
) -> list[dict[str, Any]]:
    """Per measured node: its preferred source's energy (marked `preferred` in `energy`),
    and the spread of its node-level sources."""
    by_node: dict[str, list[dict[str, Any]]] = {}
    for row in energy:
        if not row["pushed"]:
            by_node.setdefault(row["node"], []).append(row)
    answer = []
    for node, rows in sorted(by_node.items()):
        best = min(rows, key=lambda r: _rank(r, reg.energy_priority))
        best["preferred"] = True
        whole = [r["joules"] for r in rows if r["_whole"]]
        spread = None
        if len(whole) > 1:
            low, high = min(whole), max(whole)
            spread = {
                "min_joules": low,
                "max_joules": high,
                "relative": (high - low) / high if high > 0 else 0.0,
            }
        answer.append(
            {
                "node": node,
                "joules": best["joules"],
                "metric_id": best["metric_id"],
                "role": best["role"],
                "covered_s": best["covered_s"],
                "coverage": _share(best["covered_s"], duration_s),
                "sources_count": len(whole),
                "spread": spread,
            }
        )
    return answer


def energy_job(
    nodes_energy: list[dict[str, Any]], nodes: list[str], duration_s: float
) -> dict[str, Any] | None:
    """The job's energy by its nodes' preferred sources; None when no node has any."""
    if not nodes_energy:
        return None
    roles = {n["role"] for n in nodes_energy}
    coverage = {n["node"]: n["coverage"] for n in nodes_energy}
    return {
        "joules": sum(n["joules"] for n in nodes_energy),
        "role": roles.pop() if len(roles) == 1 else "mixed",
        "coverage": min(coverage.get(node, 0.0) for node in nodes) if nodes else 0.0,
        "nodes": len(nodes_energy),
    }


def _share(covered_s: float, duration_s: float) -> float:
    return min(1.0, covered_s / duration_s) if duration_s > 0 else 0.0
