"""The rollups' refreshes (clickhouse/migrations/0022), on a database of their own: a reading
stored twice counts once; a minute already rolled up is computed again, not added to, when a
reading arrives for it later; an hour is rolled up once closed; until a refresh has taken a
bucket, readers find it pending (to be read raw) and its newest reading in metrics_newest.

A refresh takes the inserts noted before the current minute (less 10 s): instead of waiting
for the clock, `_a_few_minutes_later` moves the notes and the rollups' marks 3 minutes back
(as if the refreshes had run then), then the test runs each refresh and waits for it
(SYSTEM REFRESH/WAIT VIEW). The scheduled refreshes are stopped meanwhile.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from clickhouse_connect.driver.client import Client

from clickhouse import rollups
from clickhouse.migrate import apply_migrations
from stack.config import StackSettings
from tests.clickhouse.test_migrations import scratch_database

COLUMNS = ["timestamp", "device_id", "metric_id", "value", "labels"]


def _a_few_minutes_later(client: Client) -> None:
    client.command(
        "INSERT INTO rollup_pending SELECT device_id, bucket, noted_at - INTERVAL 3 MINUTE "
        "FROM rollup_pending"
    )
    client.command(  # the notes as made: a test lasts seconds, so these are the newer ones
        "ALTER TABLE rollup_pending DELETE WHERE noted_at >= now64(3) - INTERVAL 150 SECOND "
        "SETTINGS mutations_sync = 2"
    )
    marks = client.query("SELECT rollup, host, max(noted_until) FROM rollup_marks GROUP BY ALL")
    client.command("TRUNCATE TABLE rollup_marks")
    for rollup, host, mark in marks.result_rows:
        client.insert(
            "rollup_marks",
            [[rollup, host, mark - timedelta(minutes=3)]],
            column_names=["rollup", "host", "noted_until"],
        )


def _refresh(client: Client) -> None:
    rollups.refresh_now(client.command)
    rollups.switch(client.command, "STOP")


def _rollups(client: Client, device: str) -> dict[str, tuple]:
    """(rows, readings counted, max) of each rollup for `device`, as readers see it."""
    rows = client.query(
        "SELECT '1m', count(), sum(count), max(max) FROM metrics_1m FINAL "
        "WHERE device_id = {d:String} UNION ALL "
        "SELECT '1h', count(), sum(count), max(max) FROM metrics_1h FINAL "
        "WHERE device_id = {d:String}",
        parameters={"d": device},
    ).result_rows
    return {table: tuple(figures) for table, *figures in rows}


def _pending(client: Client, device: str) -> tuple[int, int]:
    """Buckets of `device` that the 1-minute and the 1-hour rollup do not hold whole yet."""
    return client.query(
        "SELECT (SELECT count() FROM rollup_pending_1m WHERE device_id = {d:String}), "
        "(SELECT count() FROM rollup_pending_1h WHERE device_id = {d:String})",
        parameters={"d": device},
    ).first_row


def test_rollups_are_exact_and_follow_late_readings(
    clickhouse: StackSettings, admin_client: Client
) -> None:
    with scratch_database(clickhouse, admin_client, "rollups") as (client, settings):
        apply_migrations(client, settings)
        rollups.switch(client.command, "STOP")
        now = datetime.now(UTC).replace(tzinfo=None)
        hour = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
        rows = [
            [hour + timedelta(seconds=30 * i), "pdu-1", "p_watt", float(i), {}] for i in range(120)
        ]
        client.insert("metrics", rows, column_names=COLUMNS)
        client.insert("metrics", rows[:10], column_names=COLUMNS)  # delivered twice
        client.insert("metrics", [[now, "pdu-2", "p_watt", 7.0, {}]], column_names=COLUMNS)

        assert _pending(client, "pdu-1") == (60, 1)
        assert _rollups(client, "pdu-1") == {"1h": (0, 0, 0.0), "1m": (0, 0, 0.0)}
        newest = client.query("SELECT device_id, value FROM metrics_newest ORDER BY device_id")
        assert newest.result_rows == [("pdu-1", 119.0), ("pdu-2", 7.0)]

        _a_few_minutes_later(client)
        _refresh(client)
        assert _rollups(client, "pdu-1") == {"1h": (1, 120, 119.0), "1m": (60, 120, 119.0)}
        assert _pending(client, "pdu-1") == (0, 0)
        latest = client.query("SELECT device_id, value FROM metrics_latest FINAL ORDER BY 1")
        assert latest.result_rows == [("pdu-1", 119.0), ("pdu-2", 7.0)]
        # the current hour is not rolled up until it closes, so it stays pending
        assert client.command("SELECT count() FROM metrics_1h WHERE device_id = 'pdu-2'") == 0
        assert _pending(client, "pdu-2") == (0, 1)

        late = [[hour + timedelta(seconds=15), "pdu-1", "p_watt", 1000.0, {}]]
        client.insert("metrics", late, column_names=COLUMNS)
        assert _pending(client, "pdu-1") == (1, 1)
        _a_few_minutes_later(client)
        _refresh(client)
        assert _rollups(client, "pdu-1") == {"1h": (1, 121, 1000.0), "1m": (60, 121, 1000.0)}
        assert _pending(client, "pdu-1") == (0, 0)
