"""The two frame layouts of Omegawatt wattmeters, as Kwollect's `kwollector_wattmetre` reads
them: one CSV line per sample (50 per second), the power of every port in each.

    version 2:  F0,F1,TIMESTAMP,OK,P0,P1,...,Pn-1
                the flag (4th field) is `OK`; the ports are every field after it
    version 3:  TIMESTAMP,true,F2,F3,F4,F5,P0,X0,P1,X1,...,Pn-1,Xn-1,T1,T2,T3,T4,T5
                the flag (2nd field) is `true`; 11 + 2n fields, port i's power is field 6 + 2i

TIMESTAMP is the meter's own clock, seconds since the Unix epoch with a fraction. A port
whose field is empty or `nan` has no value in that frame (as in Kwollect: no reading). Other
fields are not read. A frame that does not follow its layout raises `FrameError` (Kwollect
logs and skips it), so does an infinite value or a timestamp outside 2000-2100.
"""

from __future__ import annotations

import math
from collections.abc import Callable

NAN = math.nan
_MIN_TIMESTAMP_S = 946_684_800.0  # 2000-01-01, as ClickHouse's ingestion accepts
_MAX_TIMESTAMP_S = 4_102_444_800.0  # 2100-01-01


class FrameError(ValueError):
    """A line that is not a frame of its layout: `what` names the kind (for Skips)."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(reason)
        self.what = what


def parse_v2(line: bytes) -> tuple[int, list[float]]:
    """(timestamp µs, power of each port, NaN where missing) of a version 2 frame."""
    fields = line.split(b",")
    if len(fields) < 5:
        raise FrameError("malformed frame", f"{len(fields)} fields; version 2 has 5 or more")
    if fields[3] != b"OK":
        raise FrameError("frame not OK", f"flag (4th field) is {_show(fields[3])}, not OK")
    return _timestamp(fields[2]), _values(fields[4:])


def parse_v3(line: bytes) -> tuple[int, list[float]]:
    """(timestamp µs, power of each port, NaN where missing) of a version 3 frame."""
    fields = line.split(b",")
    if len(fields) < 2:
        raise FrameError("malformed frame", f"{len(fields)} field(s); version 3 has 13 or more")
    if fields[1] != b"true":
        raise FrameError("frame not OK", f"flag (2nd field) is {_show(fields[1])}, not true")
    paired = len(fields) - 11
    if paired < 2 or paired % 2:
        raise FrameError(
            "malformed frame", f"{len(fields)} fields; version 3 has 11 + 2 per port (13 or more)"
        )
    return _timestamp(fields[0]), _values(fields[6 : 6 + paired : 2])


PARSERS: dict[int, Callable[[bytes], tuple[int, list[float]]]] = {2: parse_v2, 3: parse_v3}


def _timestamp(field: bytes) -> int:
    try:
        seconds = float(field)
    except ValueError:
        raise FrameError("malformed frame", f"timestamp {_show(field)} is not a number") from None
    if not _MIN_TIMESTAMP_S <= seconds < _MAX_TIMESTAMP_S:
        raise FrameError("malformed frame", f"timestamp {_show(field)} is not in 2000-2100")
    return round(seconds * 1_000_000)


def _values(fields: list[bytes]) -> list[float]:
    """Every field as a float; the fast path converts them at once and checks their sum."""
    try:
        values = list(map(float, fields))
        total = sum(values)
        if total - total == 0:  # neither NaN nor infinite: every value is a finite number
            return values
    except ValueError:
        pass
    return [_value(field) for field in fields]


def _value(field: bytes) -> float:
    """One port's power; NaN when the field is empty or `nan` (no value)."""
    if not field.strip():
        return NAN
    try:
        value = float(field)
    except ValueError:
        raise FrameError("malformed frame", f"power {_show(field)} is not a number") from None
    if math.isinf(value):
        raise FrameError("malformed frame", f"power {_show(field)} is infinite")
    return value


def _show(field: bytes) -> str:
    """A field for a log line: quoted, printable, at most 40 characters."""
    text = field[:40].decode("ascii", errors="backslashreplace")
    return repr(text + ("..." if len(field) > 40 else ""))
