"""What an entry keeps of an exposition and what its readings are: shared by `prometheus://`
and `file://`, so that a value reads the same whether node_exporter serves it or the
producer reads its file.

- A sample is kept when its name is listed (`metrics`) or matches `match` (all samples when
  neither is given), and its labels pass every `label.NAME=REGEX` (keep) and
  `label.NAME!=REGEX` (drop) filter; names and labels as exposed.
- Its reading is `<prefix><name>` (`prom_node_load1`, as Kwollect names them), or the name
  `rename.<name>` gives, with its labels (`relabel.` renames them; empty ones are left out,
  as Prometheus reads them as absent: see exposition.py) and the entry's
  (which win: a clashing exposed label is kept as `exported_<name>`, as Prometheus does),
  its value times the entry's scale_factor, at the tick's time or the sample's own.
- Kwollect's convention: `kwollect_custom{_metric_id="<name>", _timestamp="<epoch s>", ...}`
  becomes a reading named `<name>` (`<prefix>kwollect_custom` without one), at that time
  (the tick's without one), its other labels kept plus `_metric_origin=prom_kwollect_custom`.
- A sample with its own time is published once: while its time (and value) stays the same,
  the next polls leave it out (a pushed value is not stored again at every tick).
- What users write cannot reach other users' jobs (textfiles are theirs): labels starting
  with `_` are reserved (`_device_alias` would sum the value into another node's power), so
  a sample carrying one is dropped and reported, unless the entry's own labels set it (the
  entry's value wins; the operator's device files keep working); `kwollect_custom`'s
  `_metric_id` and `_timestamp` are its syntax, not labels. A sample's own time must lie
  within [tick - time_max_age_s, tick + time_max_ahead_s], else it is dropped and reported:
  a new tenant of a node cannot backdate values into the previous tenant's job.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kafka.reading import Reading
from producers.plugins.base import Options, url_options
from producers.plugins.prometheus.exposition import Sample

if TYPE_CHECKING:
    from producers.entry import DeviceEntry
    from producers.plugins.base import Skips

CUSTOM = "kwollect_custom"
"""Kwollect's sample name for values users push through node_exporter's textfile collector."""
CUSTOM_ORIGIN = {"_metric_origin": "prom_kwollect_custom"}
"""The label Kwollect adds to such readings (same value for file://, same series)."""
_CUSTOM_LABELS = frozenset(("_metric_id", "_timestamp"))
RESERVED_PREFIX = "_"
"""Labels starting with it are jobscope's and the operator's, never a sample's own."""
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_KEY = re.compile(r"label\.([a-zA-Z_][a-zA-Z0-9_]*)(!?)")
_RENAME_KEY = re.compile(r"(rename|relabel)\.(.+)")
_LABEL_NAME = re.compile(r"[a-zA-Z][a-zA-Z0-9_]*")
"""A label a sample's may be renamed to (not reserved: no leading `_`)."""
_MAX_SECONDS = 2**62 / 1e6
_MAX_NAMES = 100_000


class SelectOptions(BaseModel):
    """The selection and naming options of a `prometheus://` or `file://` URL's query
    string: `metrics=a,b`, `match=REGEX`, `label.NAME=REGEX`, `label.NAME!=REGEX`, `prefix=`,
    `rename.NAME=METRIC`, `relabel.LABEL=NEW`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metrics: frozenset[str] | None = Field(
        None, description="sample names to keep, comma-separated in the URL"
    )
    match: re.Pattern[str] | None = Field(
        None, description="keep samples whose whole name matches this regular expression"
    )
    keep_labels: Mapping[str, re.Pattern[str]] = Field(
        default_factory=dict, description="label.NAME=REGEX: keep when the value matches"
    )
    drop_labels: Mapping[str, re.Pattern[str]] = Field(
        default_factory=dict, description="label.NAME!=REGEX: drop when the value matches"
    )
    rename: Mapping[str, str] = Field(
        default_factory=dict,
        description="rename.NAME=METRIC: the reading of sample NAME is called METRIC "
        "(no prefix), e.g. an exporter's names as jobscope's (gpu_power_watt)",
    )
    relabel: Mapping[str, str] = Field(
        default_factory=dict,
        description="relabel.LABEL=NEW: a sample's label LABEL is called NEW (UUID -> gpu_uuid)",
    )
    prefix: str = Field(
        "prom_",
        pattern=r"^([a-zA-Z_:][a-zA-Z0-9_:]*)?$",
        description="put before every sample name (Kwollect's prom_)",
    )
    time_max_age_s: float = Field(
        60,
        ge=0,
        description="a sample's own time (`_timestamp`, or the exposition's) older than the "
        "tick by more: dropped, reported (keep it under the period and the gap between jobs)",
    )
    time_max_ahead_s: float = Field(
        10, ge=0, description="a sample's own time later than the tick by more: dropped, reported"
    )

    @model_validator(mode="before")
    @classmethod
    def _from_query(cls, data: Any) -> Any:
        """`metrics=a,b` as a set; `label.NAME=`/`label.NAME!=` keys as label filters."""
        if not isinstance(data, dict):
            return data
        fields: dict[str, Any] = {}
        keep: dict[str, str] = {}
        drop: dict[str, str] = {}
        renames: dict[str, dict[str, str]] = {"rename": {}, "relabel": {}}
        for key, value in data.items():
            label = _LABEL_KEY.fullmatch(key)
            renamed = _RENAME_KEY.fullmatch(key)
            if label is not None:
                (drop if label[2] else keep)[label[1]] = value
            elif renamed is not None:
                renames[renamed[1]][renamed[2]] = _renamed(renamed[1], renamed[2], value)
            elif key == "metrics" and isinstance(value, str):
                names = frozenset(n.strip() for n in value.split(",") if n.strip())
                bad = sorted(n for n in names if not _NAME.fullmatch(n))
                if bad or not names:
                    raise ValueError(f"metrics: not metric names: {', '.join(bad) or '(none)'}")
                fields["metrics"] = names
            else:
                fields[key] = value
        if keep:
            fields["keep_labels"] = keep
        if drop:
            fields["drop_labels"] = drop
        fields.update((option, mapping) for option, mapping in renames.items() if mapping)
        return fields


def _renamed(option: str, old: str, new: object) -> str:
    """`rename.NAME=METRIC` and `relabel.LABEL=NEW`, checked: names that can be, labels that
    are not reserved (`_...`: jobscope's own, as `_device_alias`)."""
    pattern = _NAME if option == "rename" else _LABEL_NAME
    if not isinstance(new, str) or not pattern.fullmatch(new) or not pattern.fullmatch(old):
        kind = "metric" if option == "rename" else "label (not starting with _)"
        raise ValueError(f"{option}.{old}={new}: not a {kind} name")
    return new


def query_options(url: str, model: type[Options]) -> Options:
    """`url_options`, with `+` taken literally: query strings read it as a space, and
    regular expressions need it (`match=node_.+`); a space is `%20`."""
    parts = urlsplit(url)
    return url_options(parts._replace(query=parts.query.replace("+", "%2B")).geturl(), model)


class Selection:
    """One entry's readings out of an exposition: the samples it keeps, named and labelled."""

    def __init__(self, entry: DeviceEntry, options: SelectOptions, source: str) -> None:
        self.device_id = entry.device_id
        self.options = options
        self.source = source
        """Where the samples come from, for the log (a URL, a file)."""
        self.scale = entry.scale_factor if entry.scale_factor is not None else 1.0
        self.entry_labels = dict(entry.labels)
        self._max_age_us = round(options.time_max_age_s * 1_000_000)
        self._max_ahead_us = round(options.time_max_ahead_s * 1_000_000)
        self._filtered = options.metrics is not None or options.match is not None
        self._seen: set[tuple[object, ...]] = set()
        """Samples with their own time published by the previous poll (not sent again)."""
        self._ids: dict[str, str] = {}
        """Sample name -> metric id (one string per metric, not one per reading)."""

    def readings(self, samples: Sequence[Sample], timestamp_us: int, skips: Skips) -> list[Reading]:
        """The readings of the kept samples; `timestamp_us` for those without a time."""
        options = self.options
        names, match = options.metrics, options.match
        keep, drop = options.keep_labels, options.drop_labels
        scale, device_id, metric_ids = self.scale, self.device_id, self._ids
        entry_labels, relabel = self.entry_labels, options.relabel
        listed_seen: set[str] = set()
        seen: set[tuple[object, ...]] = set()
        out: list[Reading] = []
        for name, labels, value, own_us in samples:
            if self._filtered:
                if names is not None and name in names:
                    listed_seen.add(name)
                elif match is None or match.fullmatch(name) is None:
                    continue
            if keep and any(p.fullmatch(labels.get(k, "")) is None for k, p in keep.items()):
                continue
            if drop and any(p.fullmatch(labels.get(k, "")) is not None for k, p in drop.items()):
                continue
            if name == CUSTOM:
                custom = self._custom(labels, skips)
                if custom is None:
                    continue
                metric, labels, custom_us = custom
                own_us = custom_us if custom_us is not None else own_us
            else:
                metric = metric_ids.get(name) or self._metric_id(name)
                if labels and self._reserved(name, labels, skips):
                    continue
            if relabel:
                labels = {relabel.get(k, k): v for k, v in labels.items()}
            if entry_labels:
                labels = self._with_entry_labels(labels)
            if scale != 1.0:
                value *= scale
            if own_us is None:
                out.append(Reading(timestamp_us, device_id, metric, value, labels))
                continue
            key = (metric, tuple(sorted(labels.items())), own_us, value)
            seen.add(key)
            if key not in self._seen and self._in_time(name, metric, own_us, timestamp_us, skips):
                out.append(Reading(own_us, device_id, metric, value, labels))
        self._seen = seen
        if names is not None and len(listed_seen) < len(names):
            for name in sorted(names - listed_seen - {CUSTOM}):  # nothing pushed is no fault
                skips.skip(device_id, f"{name} ({self.source})", "not in the exposition")
        return out

    def _metric_id(self, name: str) -> str:
        if len(self._ids) >= _MAX_NAMES:
            self._ids.clear()
        metric = self._ids[name] = self.options.rename.get(name) or self.options.prefix + name
        return metric

    def _custom(
        self, labels: dict[str, str], skips: Skips
    ) -> tuple[str, dict[str, str], int | None] | None:
        """A `kwollect_custom` sample's (metric, labels, time in µs or None); None, reported,
        when its `_timestamp` is not a time."""
        metric = labels.get("_metric_id") or self.options.prefix + CUSTOM
        own_us = None
        if stamp := labels.get("_timestamp"):
            try:
                seconds = float(stamp)
            except ValueError:
                seconds = math.nan
            if not abs(seconds) < _MAX_SECONDS:
                skips.skip(
                    self.device_id,
                    f"{CUSTOM} {metric} ({self.source})",
                    f"_timestamp {stamp!r} is not a Unix time in seconds",
                )
                return None
            own_us = round(seconds * 1_000_000)
        kept = {k: v for k, v in labels.items() if k not in _CUSTOM_LABELS}
        if self._reserved(f"{CUSTOM} {metric}", kept, skips):
            return None
        return metric, {**kept, **CUSTOM_ORIGIN}, own_us

    def _reserved(self, what: str, labels: Mapping[str, str], skips: Skips) -> bool:
        """Whether the sample carries a reserved label the entry does not set (reported)."""
        for key in labels:
            if key[:1] == RESERVED_PREFIX and key not in self.entry_labels:
                skips.skip(
                    self.device_id,
                    f"{what} ({self.source})",
                    f"label {key} is reserved (labels starting with {RESERVED_PREFIX!r} are "
                    "set by jobscope and device entries, not by samples)",
                )
                return True
        return False

    def _in_time(self, name: str, metric: str, own_us: int, tick_us: int, skips: Skips) -> bool:
        """Whether a sample's own time is near enough the tick's (reported when not)."""
        if tick_us - self._max_age_us <= own_us <= tick_us + self._max_ahead_us:
            return True
        skips.skip(
            self.device_id,
            f"{name} {metric} ({self.source})",
            f"its time {own_us / 1e6:.6f} is more than time_max_age_s="
            f"{self.options.time_max_age_s:g} before or time_max_ahead_s="
            f"{self.options.time_max_ahead_s:g} after the poll's {tick_us / 1e6:.6f}",
        )
        return False

    def _with_entry_labels(self, labels: Mapping[str, str]) -> dict[str, str]:
        """The entry's labels over the sample's; a clashing sample label becomes
        `exported_<name>` (Prometheus's honor_labels: false)."""
        ours = self.entry_labels
        if labels.keys().isdisjoint(ours):
            return {**labels, **ours}
        return {**{(f"exported_{k}" if k in ours else k): v for k, v in labels.items()}, **ours}
