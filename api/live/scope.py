"""Which live readings belong to a job's stream, and how they are shown: the same rules as
`/api/jobs/{id}/metrics` (api/queries/metrics.py), applied in Python to decoded messages.

A reading is in scope when its device is one of the job's nodes, or it carries
`_device_alias=<node>` for one of them (then it is shown under its own id without that
label, and also summed under the node with the devices summed in `_device_orig`); its
metric matches `metrics=`, its labels `label=`, and its time lies in [start, end]; a
reading labelled with a GPU or CPU of a node where the job holds some is in scope only for
those it holds (kafka/allocations.py, as the SQL of api/queries/metrics.py).

`Seam` keeps, per series, the newest time the replay from ClickHouse returned: a live
reading of that series not newer is one the replay already sent (see api/live/stream.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from api.infra.params import NamePatterns, glob_to_re2
from api.queries.metrics import ALIAS
from kafka.allocations import Allocated
from kafka.message import iso_us
from kafka.patterns import NameMatcher, compile_regex
from kafka.reading import Reading

ORIGINS = "_device_orig"
Row = dict[str, Any]
"""One reading as the API shows it: timestamp (Kwollect's ISO text), device_id, metric_id,
value, labels."""
SeriesKey = tuple[str, str, tuple[tuple[str, str], ...]]


def glob_regex(patterns: NamePatterns) -> NameMatcher | None:
    """The exact names and the globs (as SQL's LIKE reads them: `*` any text, `?` one
    character), matched in full in time linear in the name (RE2); None: every metric.
    The route bounds the globs (api/readings.py `check_metrics`)."""
    if not patterns:
        return None
    regexes = [compile_regex(glob_to_re2(glob), dot_nl=True) for glob in patterns.globs]
    text = ",".join(patterns.exact + patterns.globs)
    return NameMatcher(text, regexes, whole=True, exact=frozenset(patterns.exact))


def series_key(row: Row) -> SeriesKey:
    return row["device_id"], row["metric_id"], tuple(sorted(row["labels"].items()))


@dataclass
class Seam:
    """The newest timestamp (ISO text: it sorts as time does) the replay returned, per series
    of readings shown under their own id."""

    newest: dict[SeriesKey, str] = field(default_factory=dict)

    def note(self, rows: Iterable[Row]) -> None:
        newest = self.newest
        for row in rows:
            if ORIGINS in row["labels"]:  # a sum: made again from the raw readings live
                continue
            key = series_key(row)
            if row["timestamp"] > newest.get(key, ""):
                newest[key] = row["timestamp"]

    def replayed(self, row: Row) -> bool:
        return row["timestamp"] <= self.newest.get(series_key(row), "")


@dataclass
class LiveScope:
    """A job's scope for live readings; `nodes` and `aliased` change when the job does."""

    nodes: frozenset[str]
    start_us: int
    end_us: int | None
    metrics: NameMatcher | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    only: frozenset[str] = frozenset()
    aliased: frozenset[str] = frozenset()
    """Devices seen measuring a node (`device_aliases`): their messages are read too."""
    allocated: Allocated | None = None
    """The job's GPUs and CPU ids per node; None: whole nodes."""

    @property
    def keys(self) -> frozenset[str]:
        """The message keys (device ids) whose messages may hold readings in scope."""
        return self.nodes | self.aliased

    def rows(self, readings: Iterable[Reading], seam: Seam | None = None) -> list[Row]:
        """The readings in scope as the API shows them, oldest first, node sums included."""
        out: list[Row] = []
        sums: dict[tuple[int, str, str], list[Reading]] = {}
        for r in readings:
            alias = r.labels.get(ALIAS)
            own = r.device_id in self.nodes
            if not own and alias not in self.nodes:
                continue
            if not self._wanted(r):
                continue
            if self.allocated is not None and not self.allocated.admits(
                r.device_id if alias is None else alias, r.labels
            ):
                continue
            labels = r.labels
            if alias is not None:
                labels = {k: v for k, v in labels.items() if k != ALIAS}
            row = {
                "timestamp": iso_us(r.timestamp_us),
                "device_id": r.device_id,
                "metric_id": r.metric_id,
                "value": r.value,
                "labels": labels,
            }
            if seam is not None and seam.replayed(row):
                continue
            out.append(row)
            if alias is not None and alias in self.nodes:
                sums.setdefault((r.timestamp_us, alias, r.metric_id), []).append(r)
        out.extend(_summed(key, group) for key, group in sums.items())
        if self.only:
            out = [row for row in out if row["device_id"] in self.only]
        out.sort(key=lambda row: (row["timestamp"], row["device_id"], row["metric_id"]))
        return out

    def _wanted(self, r: Reading) -> bool:
        if r.timestamp_us < self.start_us:
            return False
        if self.end_us is not None and r.timestamp_us > self.end_us:
            return False
        if self.metrics is not None and not self.metrics.match(r.metric_id):
            return False
        return all(r.labels.get(k) == v for k, v in self.labels.items())


def _summed(key: tuple[int, str, str], group: list[Reading]) -> Row:
    """Kwollect's node row of aliased readings at one instant: the sum, the labels they all
    share (without the alias), and the devices summed."""
    timestamp_us, node, metric = key
    shared = {k: v for k, v in group[0].labels.items() if k != ALIAS}
    for r in group[1:]:
        shared = {k: v for k, v in shared.items() if r.labels.get(k) == v}
    shared[ORIGINS] = ",".join(sorted({r.device_id for r in group}))
    return {
        "timestamp": iso_us(timestamp_us),
        "device_id": node,
        "metric_id": metric,
        "value": sum(r.value for r in group),
        "labels": shared,
    }
