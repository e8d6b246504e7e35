"""The schedule tolerance policy (tests/schedules.py) on synthetic series: it lets through
only the ticks the producer reported skipped."""

from __future__ import annotations

import pytest

from tests.schedules import assert_every_tick, assert_unbroken, reported_skips, ticks_of

PERIOD_US = 200_000
SERIES = [t * PERIOD_US + 1_000 for t in range(100, 110)]
"""Ticks 100 to 109, each polled 1 ms after its tick."""
LOG = """\
2026-01-01 00:00:00,000 WARNING producers.runtime: node-a: tick took longer than its \
200 ms period: 2 tick(s) skipped from 20600000 us
2026-01-01 00:00:01,000 WARNING producers.runtime: node-b: woke 250 ms after its tick, \
past its period: 1 tick(s) skipped from 20200000 us
"""


def test_a_complete_series_passes_however_late_within_its_period() -> None:
    late = [t * PERIOD_US + PERIOD_US - 1 for t in range(100, 110)]
    assert_every_tick(late, PERIOD_US, [(100, 109)])
    assert_every_tick(SERIES, PERIOD_US, [(100, 104), (106, 109)])


def test_the_log_lines_name_the_skipped_ticks() -> None:
    assert reported_skips(LOG, PERIOD_US) == {"node-a": {103, 104}, "node-b": {101}}
    assert reported_skips("INFO producers.runtime: polling 3 entries", PERIOD_US) == {}


def test_reported_skips_are_allowed() -> None:
    gappy = [s for s in SERIES if s // PERIOD_US not in (103, 104)]
    assert_every_tick(gappy, PERIOD_US, [(100, 109)], reported_skips(LOG, PERIOD_US)["node-a"])


def test_an_unreported_gap_fails_listing_the_missing_ticks() -> None:
    gappy = [s for s in SERIES if s // PERIOD_US not in (103, 107)]
    with pytest.raises(AssertionError, match=r"node-a: 1 tick\(s\) missing .*: 21400000$"):
        assert_every_tick(gappy, PERIOD_US, [(100, 109)], {103, 104}, "node-a")


def test_a_skip_reported_elsewhere_does_not_excuse_a_gap() -> None:
    """A count of skips would let tick 107 through on tick 101's report; names do not."""
    gappy = [s for s in SERIES if s // PERIOD_US != 107]
    with pytest.raises(AssertionError, match="21400000"):
        assert_every_tick(gappy, PERIOD_US, [(100, 109)], {101})


def test_a_tick_reported_skipped_yet_stamped_fails() -> None:
    with pytest.raises(AssertionError, match="reported skipped, yet stamped: 20600000"):
        assert_every_tick(SERIES, PERIOD_US, [(100, 109)], {103})


def test_a_tick_stamped_twice_fails() -> None:
    with pytest.raises(AssertionError, match="ticks stamped twice: 20000000"):
        ticks_of([*SERIES, 100 * PERIOD_US + 5_000], PERIOD_US)


def test_a_series_is_unbroken_from_its_first_tick_to_its_last_but_for_reported_skips() -> None:
    gapped = [t for t in SERIES if t // PERIOD_US not in (103, 104)]
    assert assert_unbroken(gapped, PERIOD_US, LOG, "node-a") == [100, 101, 102, *range(105, 110)]
    with pytest.raises(AssertionError, match="2 tick"):
        assert_unbroken(gapped, PERIOD_US, LOG, "node-b")  # its report is of another tick
