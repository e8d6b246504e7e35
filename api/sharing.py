"""Energy attribution on shared nodes: how much of a node's energy is a job's, by the site's
policy (JOBSCOPE_ENERGY_SHARING, docs/jobs.md "Allocations"). No SQL here.

- `exclusive`: the node's energy (its preferred source, api/summary.py) is the job's whole.
- `cores`: node energy x the job's CPUs on the node / the node's CPUs.
- `gpus`: the job's GPUs' measured energy (role gpu, its own GPUs' readings) + the node's
  remaining energy (node energy - the energy of all the node's GPUs over the job; the node
  energy if that is unknown) x the job's CPU share; never below the GPUs' own energy.

A node where the job has no allocation (or no CPUs in it), or whose CPU count is unknown
(JOBSCOPE_NODE_CPUS 0, or an object that does not name the node), is exclusive whatever the
policy. A node whose preferred source is
its GPUs (no whole-node meter) keeps its figure: the GPU readings are already the job's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kafka.allocations import parse_cpuset

Policy = Literal["exclusive", "cores", "gpus"]


@dataclass(frozen=True)
class Sharing:
    """The site's policy and the CPU count of its nodes: one for all, or one per node (a
    node not named, or 0: unknown)."""

    policy: Policy = "exclusive"
    node_cpus: int | Mapping[str, int] = 0

    def cpus_of(self, node: str) -> int:
        """The node's CPU count; 0 when unknown."""
        if isinstance(self.node_cpus, int):
            return self.node_cpus
        return self.node_cpus.get(node, 0)


EXCLUSIVE = Sharing()


def cpus_held(entry: Mapping[str, Any] | None) -> int | None:
    """The CPUs an allocation names (a cpuset's ids or a count); None without any."""
    cpus = (entry or {}).get("cpus")
    if isinstance(cpus, int):
        return cpus
    if isinstance(cpus, str) and cpus:
        return len(parse_cpuset(cpus))
    return None


def shared_nodes(sharing: Sharing, allocations: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The nodes whose energy the policy splits: those where the job holds CPUs, when the
    policy is not exclusive and the node's CPU count is known."""
    if sharing.policy == "exclusive":
        return []
    return sorted(
        n for n, entry in allocations.items() if cpus_held(entry) and sharing.cpus_of(n) > 0
    )


def gpu_energy(energy: list[dict[str, Any]], node: str) -> dict[str, Any] | None:
    """The node's measured GPU energy row (role gpu) covering most of the job."""
    rows = [r for r in energy if r["node"] == node and r["role"] == "gpu" and not r["pushed"]]
    return min(rows, key=lambda r: (-r["covered_s"], r["metric_id"]), default=None)


def attribute(
    summary: dict[str, Any],
    sharing: Sharing,
    allocations: Mapping[str, Mapping[str, Any]],
    all_gpus: Mapping[tuple[str, str], float],
) -> None:
    """Apply the policy to `summary`'s energy_nodes (shaped, node energies whole) and its
    energy_job. `all_gpus`: (node, metric) -> joules of all the node's GPUs over the job,
    for the nodes `shared_nodes` gives under `gpus`."""
    shared = set(shared_nodes(sharing, allocations))
    for row in summary["energy_nodes"]:
        node = row["node"]
        whole = row["joules"]
        row.update(node_joules=whole, attribution="exclusive", share=1.0, cpu_share=None)
        row.update(gpu_joules=None, node_gpu_joules=None)
        if node not in shared or row["role"] == "gpu":
            continue
        cpu_share = min(1.0, (cpus_held(allocations[node]) or 0) / sharing.cpus_of(node))
        joules = whole * cpu_share
        if sharing.policy == "gpus":
            held = allocations[node].get("gpus") or allocations[node].get("gpu_uuids")
            own = gpu_energy(summary["energy"], node) if held else None
            mine = own["joules"] if own else 0.0
            metric = own["metric_id"] if own else _any_gpu_metric(all_gpus, node)
            node_gpus = all_gpus.get((node, metric)) if metric else None
            remaining = max(0.0, whole - node_gpus) if node_gpus is not None else whole
            joules = mine + remaining * cpu_share
            row.update(gpu_joules=mine, node_gpu_joules=node_gpus)
        row.update(
            joules=joules,
            attribution=sharing.policy,
            share=joules / whole if whole > 0 else cpu_share,
            cpu_share=cpu_share,
        )
    job = summary.get("energy_job")
    if job is not None:
        _job_attribution(job, summary["energy_nodes"], sharing)


def _any_gpu_metric(all_gpus: Mapping[tuple[str, str], float], node: str) -> str | None:
    return min((m for n, m in all_gpus if n == node), default=None)


def _job_attribution(job: dict[str, Any], rows: list[dict[str, Any]], sharing: Sharing) -> None:
    """The job's figures from its nodes' attributed ones: `attribution` the nodes' (mixed if
    they differ), `share` its joules over its nodes' whole energy."""
    kinds = {r["attribution"] for r in rows}
    whole = sum(r["node_joules"] for r in rows)
    joules = sum(r["joules"] for r in rows)
    job.update(
        joules=joules,
        node_joules=whole,
        policy=sharing.policy,
        attribution=kinds.pop() if len(kinds) == 1 else "mixed",
        share=joules / whole if whole > 0 else 1.0,
    )
