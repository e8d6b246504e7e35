"""The server's engine runs with the configuration stack/clickhouse_server/engine_config.py writes
(chdb ignores parts of such a file silently: profiles only count from a users config, the
log level only from the connection string)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from stack.clickhouse_server.config import ServerSettings
from stack.config import StackSettings
from stack.processes import wait_until


def test_profile_and_server_settings_reach_the_engine(admin_client: Client) -> None:
    row = admin_client.query(
        "SELECT getSetting('optimize_on_insert'), getSetting('use_uncompressed_cache'), "
        "getServerSetting('uncompressed_cache_size')"
    ).first_row
    defaults = ServerSettings(data_dir=Path("unused"), admin_password="-", reader_password="-")
    assert row == (False, True, defaults.uncompressed_cache_bytes)


def test_engine_logs_errors_to_its_own_file(
    clickhouse: StackSettings, admin_client: Client
) -> None:
    log = clickhouse.log_dir / "clickhouse-engine.log"
    marker = "engine_log_marker_table"
    with pytest.raises(DatabaseError, match=marker):
        admin_client.command(f"SELECT * FROM {marker}")
    # The engine's logger writes from its own thread: wait for the line, do not race it.
    wait_until(
        lambda: marker in log.read_text(),
        10,
        f"{marker} in {log}",
        transient=(FileNotFoundError,),  # the engine may create its log with its first line
    )
    assert "<Debug>" not in log.read_text()  # the default level is 'error'
