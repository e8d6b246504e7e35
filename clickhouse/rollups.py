"""The rollups' refreshable views (clickhouse/migrations/0022), as code outside the schema
drives them: the bench prices a refresh, tests run one instead of waiting for the clock."""

from __future__ import annotations

from collections.abc import Callable

# In the order they feed: the hourly refresh reads what the 1-minute one wrote.
REFRESHES = ("metrics_1m_refresh", "metrics_1h_refresh")


def switch(run: Callable[[str], object], action: str) -> None:
    """`SYSTEM <action> VIEW` (STOP or START) of each refresh."""
    for view in REFRESHES:
        run(f"SYSTEM {action} VIEW {view}")


def refresh_now(run: Callable[[str], object]) -> None:
    """Each refresh started, run at once and waited for, in order (`run` executes one
    statement). A refresh still takes only the buckets noted before the current minute."""
    for view in REFRESHES:
        for action in ("START", "REFRESH", "WAIT"):
            run(f"SYSTEM {action} VIEW {view}")
