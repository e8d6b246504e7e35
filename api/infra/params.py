"""Query parameters as Kwollect spells them, parsed once, each error naming its parameter.

Times are ISO 8601 or Unix seconds; a time without an offset is UTC. Device names lose
their domain suffix (`node-1.site.example.org` is `node-1`), as in Kwollect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import re2

from api.infra.errors import ParameterError

TIME_HELP = "an ISO 8601 time (e.g. 2026-11-21T10:00:00+01:00; UTC without offset) or Unix seconds"


def parse_list(parameter: str, value: str | None) -> tuple[str, ...]:
    items = tuple(part.strip() for part in (value or "").split(",") if part.strip())
    if value is not None and not items:
        raise ParameterError(parameter, "expected a comma-separated list of names")
    return items


def device_name(name: str) -> str:
    """A node's id without its domain suffix, as Kwollect matches them."""
    return name.split(".", 1)[0]


def parse_devices(parameter: str, value: str | None) -> tuple[str, ...]:
    return tuple(dict.fromkeys(device_name(d) for d in parse_list(parameter, value)))


# `...T10:00:00+01:00` typed into a URL without encoding arrives as `...T10:00:00 01:00`.
_UNENCODED_PLUS = re.compile(r"^(\d{4}-\d\d-\d\d[T ][\d:.]+) (\d\d(?::?\d\d)?)$")


def to_time(value: str | float) -> datetime:
    """ISO 8601 (naive means UTC) or Unix seconds -> naive UTC datetime; ValueError if not."""
    if isinstance(value, int | float) or _is_number(value):
        return datetime.fromtimestamp(float(value), UTC).replace(tzinfo=None)
    text = _UNENCODED_PLUS.sub(r"\1+\2", str(value).strip())
    parsed = datetime.fromisoformat(text.replace(" ", "T", 1))
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed


_EPOCH = datetime(1970, 1, 1)


def to_us(t: datetime) -> int:
    """Naive UTC datetime -> Unix microseconds, exactly."""
    return (t - _EPOCH) // timedelta(microseconds=1)


def iso(t: datetime) -> str:
    """Kwollect's timestamp of a naive UTC datetime: ISO 8601, microseconds, `+00:00`."""
    return t.isoformat(timespec="microseconds") + "+00:00"


def parse_time(parameter: str, value: str | None) -> datetime | None:
    if value is None or value == "":
        return None
    try:
        return to_time(value)
    except (ValueError, OverflowError, OSError) as exc:
        raise ParameterError(parameter, f"{value!r} is not {TIME_HELP}") from exc


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


_STEP_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_STEP = re.compile(r"^(\d+)([smhd])$")
MAX_STEP_S = 366 * 86400


def parse_step(value: str | None) -> int | None:
    """`10s`, `1m`, `1h`, `1d` -> seconds."""
    if value is None or value == "":
        return None
    match = _STEP.match(value.strip())
    seconds = int(match.group(1)) * _STEP_UNITS[match.group(2)] if match else 0
    if not 0 < seconds <= MAX_STEP_S:
        raise ParameterError("step", f"{value!r} is not a duration such as 10s, 1m, 1h or 1d")
    return seconds


@dataclass(frozen=True)
class NamePatterns:
    """Names given exactly (served by the primary key) and globs (`bmc_*`, `?`)."""

    exact: tuple[str, ...] = ()
    globs: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.exact or self.globs)

    @property
    def like(self) -> tuple[str, ...]:
        """The globs as SQL LIKE patterns (bound as parameters, never pasted)."""
        return tuple(_glob_to_like(g) for g in self.globs)


def parse_patterns(parameter: str, value: str | None) -> NamePatterns:
    names = parse_list(parameter, value)
    exact = tuple(n for n in names if not set(n) & {"*", "?"})
    globs = tuple(n for n in names if set(n) & {"*", "?"})
    return NamePatterns(exact, globs)


def _glob_to_like(glob: str) -> str:
    escaped = glob.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%").replace("?", "_")


def glob_to_re2(glob: str) -> str:
    """The RE2 source of a glob as LIKE reads it: `*` any text, `?` one character, the rest
    literal (matched in full, with `dot_nl`)."""
    return "".join(".*" if c == "*" else "." if c == "?" else re2.escape(c) for c in glob)


def parse_labels(values: list[str] | None) -> dict[str, str]:
    """`label=key=value`, repeated: readings whose label `key` equals `value`."""
    labels: dict[str, str] = {}
    for item in values or []:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ParameterError("label", f"{item!r} is not key=value")
        labels[key.strip()] = val
    return labels
