"""Prometheus expositions as samples: the text format (0.0.4, node_exporter's and its textfile
collector's) and OpenMetrics, for `prometheus://` and `file://`.

Text lines go through a strict fast path: one regular expression for the lines exporters
write (`name{label="value",...} value [timestamp_ms]`, no escapes). A line outside it is
handed, alone, to prometheus_client's parser, whose verdict stands: what it accepts is a
sample, what it refuses is a malformed line. The fast path accepts nothing that parser
refuses and reads every line it accepts the same (tests compare them on node_exporter's
output): it exists because that parser costs 13-18 µs per sample, 7-10x the fast path, and
would be most of a scrape's CPU (figures in README.md and `make bench ONLY=prometheus`).

Sample names are kept as exposed: prometheus_client's family view renames a counter
declared without `_total`, Kwollect (and jobscope) name readings after the line itself.
OpenMetrics goes through prometheus_client's parser whole (its `# EOF` and types checked).
"""

from __future__ import annotations

import re

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, dict[str, str], float, int | None]
"""(name, labels, value, timestamp in µs or None): one line of an exposition. A plain tuple:
a scrape makes thousands. Labels with an empty value are left out (Prometheus reads them as
absent; node_exporter's textfile collector adds them); the labels dict may be shared with
other samples and parses: never change it."""

TYPES = frozenset(("counter", "gauge", "histogram", "summary", "untyped"))

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_NAME = r"(?:[a-zA-Z]|_[a-zA-Z0-9])[a-zA-Z0-9_]*"  # `__*` is reserved
_LABEL = _LABEL_NAME + r'="[^"\\\n]*"'
_LINE = re.compile(
    rf"({_NAME})(?:\{{((?:{_LABEL}(?:,{_LABEL})*,?)?)\}})?[ \t]+([0-9a-zA-Z.+-]+)"
    r"(?:[ \t]+(-?[0-9]{1,16}))?"  # ms; longer ones are checked by _us
)
_LABELS = re.compile(rf'({_LABEL_NAME})="([^"\\\n]*)"')
_MAX_SECONDS = 2**62 / 1e6
"""Sample timestamps beyond this many seconds from 1970 are refused (readings hold µs in
64 bits)."""
_MAX_SHOWN = 120
"""Characters of a malformed line quoted in its error."""
_NO_LABELS: dict[str, str] = {}
_LABEL_SETS: dict[str, dict[str, str]] = {}
"""Label text -> labels, shared by all parses (an exporter repeats its series at every
scrape): returned dicts are shared, never to be changed."""
_GOOD_TYPES: set[str] = set()
"""`# TYPE` lines already checked."""
_MAX_LABEL_SETS = 200_000
"""Either cache is emptied when it reaches this size (an exporter whose series never
repeat)."""


class ExpositionError(ValueError):
    """An exposition that cannot be read; the message names the line and what is wrong."""


def parse_text(text: str) -> list[Sample]:
    """The samples of a text-format exposition, in order; ExpositionError at the first
    malformed line (comments other than a bad `# TYPE` line are ignored)."""
    samples: list[Sample] = []
    append = samples.append
    fullmatch = _LINE.fullmatch
    label_sets = _LABEL_SETS
    for number, raw in enumerate(text.split("\n"), start=1):
        match = fullmatch(raw)
        if match is None:
            line = raw.strip()
            if not line:
                continue
            if line[0] == "#":
                if line.startswith("# TYPE") and line not in _GOOD_TYPES:
                    _check_type(line, number)
                continue
            match = fullmatch(line)
        if match is not None:
            name, label_text, value_text, ms = match.groups()
            labels = label_sets.get(label_text) if label_text else _NO_LABELS
            if labels is None:
                labels = _label_set(label_text)
            if labels is not None:
                try:
                    value = float(value_text)
                except ValueError:  # e.g. `0x1p3`: the reference parser decides
                    pass
                else:
                    append((name, labels, value, None if ms is None else int(ms) * 1000))
                    continue
        append(_slow_line(raw.strip(), number))
    return samples


def _label_set(text: str) -> dict[str, str] | None:
    """The labels of a fast-path label text, empty values left out, kept for the next
    scrapes; None when a label is given twice (the reference parser says so)."""
    pairs = _LABELS.findall(text)
    labels = dict(pairs)
    if len(labels) != len(pairs):
        return None
    if "" in labels.values():
        labels = {k: v for k, v in labels.items() if v}
    if len(_LABEL_SETS) >= _MAX_LABEL_SETS:
        _LABEL_SETS.clear()
    _LABEL_SETS[text] = labels
    return labels


def parse_openmetrics(text: str) -> list[Sample]:
    """The samples of an OpenMetrics exposition (`# EOF` required), in order."""
    try:
        return [
            (s.name, {k: v for k, v in s.labels.items() if v}, float(s.value), _us(s.timestamp))
            for family in openmetrics_families(text)
            for s in family.samples
        ]
    except ValueError as exc:
        raise ExpositionError(f"malformed OpenMetrics: {exc or 'syntax error'}") from None


def _slow_line(line: str, number: int) -> Sample:
    """One line the fast path left: prometheus_client's parser reads it or refuses it."""
    try:
        (family,) = text_string_to_metric_families(line)
        (s,) = family.samples
        labels = {k: v for k, v in s.labels.items() if v}
        return (s.name, labels, float(s.value), _us(s.timestamp))
    except ValueError as exc:
        reason = str(exc) or "syntax error"
        raise ExpositionError(f"line {number}: {reason}: {_shown(line)}") from None


def _check_type(line: str, number: int) -> None:
    """`# TYPE name type` must name a metric and a known type (as node_exporter requires)."""
    parts = line.split(None, 3)
    if parts[1] == "TYPE" and (
        len(parts) != 4 or not re.fullmatch(_NAME, parts[2]) or parts[3] not in TYPES
    ):
        raise ExpositionError(f"line {number}: bad TYPE line: {_shown(line)}")
    if len(_GOOD_TYPES) >= _MAX_LABEL_SETS:
        _GOOD_TYPES.clear()
    _GOOD_TYPES.add(line)


def _us(timestamp: object) -> int | None:
    """A prometheus_client timestamp (seconds, float or Timestamp) in µs; ValueError if it
    does not fit the readings' 64-bit microseconds."""
    if timestamp is None:
        return None
    seconds = float(timestamp)  # type: ignore[arg-type]
    if not abs(seconds) < _MAX_SECONDS:  # NaN too
        raise ValueError(f"timestamp {timestamp} is out of range")
    return round(seconds * 1_000_000)


def _shown(line: str) -> str:
    return repr(line if len(line) <= _MAX_SHOWN else line[:_MAX_SHOWN] + "...")
