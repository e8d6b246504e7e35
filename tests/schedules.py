"""The one tolerance policy for schedules in the tests: a tick the producer reported as
skipped is allowed, an unreported gap fails; strict latency figures live in the bench.

A producer polls each group on aligned ticks (multiples of its period since the epoch) and
stamps the readings with the instant the poll started, always within the tick's period: a
tick whose poll cannot start before the next tick (a slow poll, a process short of CPU) is
not polled, and the producer logs it (`<group>: <why>: <n> tick(s) skipped from <first> us`)
and counts it (`jobscope_producer_missed_ticks_total`). So, on any machine however loaded:

- every expected tick has a reading stamped in [tick, tick + period), or was reported
  skipped; a missing tick that was not reported fails, and the failure lists it;
- a tick reported skipped has no reading (the report is true);
- no tick is stamped twice in one series.

How late within its period a poll started is a latency figure, not correctness: a loaded
2-core runner makes it anything up to the period. The producer exposes it
(`jobscope_producer_tick_lateness_seconds`, p99 on its stats line) and the bench measures
it (`snmp_tick_lateness_p99_ms`); tests assert none of it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

SKIPPED = re.compile(r"(\S+): [^:\n]+: (\d+) tick\(s\) skipped from (\d+) us$", re.M)


def reported_skips(log: str, period_us: int) -> dict[str, set[int]]:
    """The ticks (numbered `instant // period_us`) each group reported skipped in `log`, a
    producer's log or pytest's caplog text; a tester:// group is named after its device."""
    skipped: dict[str, set[int]] = {}
    for group, count, first in SKIPPED.findall(log):
        tick = int(first) // period_us
        skipped.setdefault(group, set()).update(range(tick, tick + int(count)))
    return skipped


def ticks_of(stamps: Iterable[int], period_us: int) -> list[int]:
    """The ticks of a series' timestamps (µs), in order; fails if one tick is stamped twice."""
    ticks = sorted(stamp // period_us for stamp in stamps)
    doubled = sorted(tick for tick, n in Counter(ticks).items() if n > 1)
    assert not doubled, f"ticks stamped twice: {_instants(doubled, period_us)}"
    return ticks


def assert_every_tick(
    stamps: Iterable[int],
    period_us: int,
    spans: Iterable[tuple[int, int]],
    skipped: set[int] = frozenset(),  # type: ignore[assignment]
    what: str = "the series",
) -> None:
    """Every tick of each inclusive (first, last) span of tick numbers has a reading in
    `stamps` (µs) or is in `skipped` (from `reported_skips`); a reported tick has none."""
    present = set(ticks_of(stamps, period_us))
    expected = {tick for first, last in spans for tick in range(first, last + 1)}
    missing = sorted(expected - present - skipped)
    assert not missing, (
        f"{what}: {len(missing)} tick(s) missing that the producer did not report skipped "
        f"(period {period_us} us; {len(skipped)} reported): {_instants(missing, period_us)}"
    )
    untrue = sorted(present & skipped)
    assert not untrue, f"{what}: reported skipped, yet stamped: {_instants(untrue, period_us)}"


def assert_unbroken(stamps: list[int], period_us: int, log: str, group: str) -> list[int]:
    """`assert_every_tick` from the series' first tick to its last, with the skips `group`
    reported in `log`; the series' ticks."""
    ticks = ticks_of(stamps, period_us)
    skipped = reported_skips(log, period_us).get(group, set())
    assert_every_tick(stamps, period_us, [(ticks[0], ticks[-1])], skipped, group)
    return ticks


def _instants(ticks: list[int], period_us: int, most: int = 20) -> str:
    shown = ", ".join(str(tick * period_us) for tick in ticks[:most])
    return shown + (f" and {len(ticks) - most} more" if len(ticks) > most else "")
