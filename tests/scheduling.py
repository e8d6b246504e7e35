"""How `make test` spreads the suite over pytest-xdist workers (`-n N --dist loadscope`).

Each worker runs its own test stack (tests/ports.py), so the unit of work is what shares
set-up: a test module, or a folder whose tests share a costly session fixture (Superset,
Kafka Connect, kube-apiserver). Units go out heaviest first (tests/durations.json, measured
seconds per unit; `python -m tests.scheduling JUNIT_XML` rewrites it from a run's
`--junitxml`), so the long ones do not start last. Tests marked `disruptive` (they stop, kill
or freeze the stack's Kafka or ClickHouse) form one unit, the last one of the first worker:
once its share of the other units is done, it runs them and takes nothing after, so no other
test inherits their restarts and consumer-group rebalances. Their ids end in `@disruptive`,
as xdist's loadgroup would name them (its own renaming no longer reaches pytest 9's node ids).

Loaded by tests/conftest.py; without xdist it changes nothing but those ids.
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest
from _pytest.nodeid import NodeId
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

DURATIONS = Path(__file__).with_name("durations.json")
DISRUPTIVE = "disruptive"
# Tests (by path prefix) sharing a session fixture too costly to start on several workers.
SHARED_SETUP = {
    # The OpenID Connect provider's tests (tests/oidc_provider.py) share Superset's worker: the
    # provider starts once, and the identity tests run before Superset's set-up.
    "tests/superset/": "superset",
    "tests/connectors/test_oar": "connect",
    "tests/connectors/test_connector_files.py": "connect",
    "tests/helm/": "helm",
    "tests/identity/": "superset",
}


def unit_of(nodeid: str) -> str:
    """The work unit of a test: see the module's docstring."""
    if nodeid.endswith(f"@{DISRUPTIVE}"):
        return DISRUPTIVE
    path = nodeid.split("::", 1)[0]
    return next((unit for start, unit in SHARED_SETUP.items() if path.startswith(start)), path)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker(DISRUPTIVE):
            item._id = NodeId.parse(f"{item.nodeid}@{DISRUPTIVE}")


class SuiteScheduling(LoadScopeScheduling):
    """xdist's loadscope over the units above, the heaviest first, the disruptive one last."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self.weights: dict[str, float] = json.loads(DURATIONS.read_text())
        self.unknown = statistics.median(self.weights.values()) if self.weights else 1.0
        self.given: dict[str, float] = defaultdict(float)  # seconds of units sent, per worker
        self.share = 0.0

    def weight(self, unit: str) -> float:
        return self.weights.get(unit, self.unknown)

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def _next_unit(self, worker: str) -> str:
        """The heaviest unit left. On the first worker, while the disruptive unit waits: the
        heaviest that leaves room for it in the worker's share, then the disruptive one; on
        any worker, the disruptive one when nothing else is left."""
        if not self.share:
            self.share = sum(map(self.weight, self.workqueue)) / len(self.nodes)
        others = [unit for unit in self.workqueue if unit != DISRUPTIVE]
        if DISRUPTIVE in self.workqueue and worker == "gw0":
            room = self.share - self.given[worker] - self.weight(DISRUPTIVE)
            others = [unit for unit in others if self.weight(unit) <= room]
        return max(others, key=self.weight, default=DISRUPTIVE)

    def _assign_work_unit(self, node: WorkerController) -> None:
        unit = self._next_unit(node.gateway.id)
        self.given[node.gateway.id] += self.weight(unit)
        self.workqueue.move_to_end(unit, last=False)
        super()._assign_work_unit(node)
        if unit == DISRUPTIVE:
            node.shutdown()  # the worker ends after this unit and takes nothing else


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> SuiteScheduling | None:
    return SuiteScheduling(config, log) if config.getvalue("dist") == "loadscope" else None


def durations_from_junit(path: Path) -> dict[str, float]:
    """Seconds per work unit in a `--junitxml` report (setup, call and teardown)."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(path).getroot().iter("testcase"):
        # classname: tests.api.test_fuzz (the module) or tests.api.test_x.TestClass
        parts = case.get("classname", "").split(".")
        while parts and not parts[-1].startswith("test_"):
            parts.pop()
        nodeid = f"{'/'.join(parts)}.py::{case.get('name', '')}"  # a disruptive name ends @...
        totals[unit_of(nodeid)] += float(case.get("time", "0"))
    return {unit: round(seconds, 1) for unit, seconds in sorted(totals.items())}


if __name__ == "__main__":
    DURATIONS.write_text(json.dumps(durations_from_junit(Path(sys.argv[1])), indent=1) + "\n")
