"""clickhouse/schema.sql is what `python -m clickhouse.schema` writes from the migrations, and
applies top to bottom.

The command runs against the session's ClickHouse server (the migrations applied by the
`clickhouse` fixture, with the default settings but for its ports), into a file of the test's
own; the committed file must be the same, byte for byte.
"""

from __future__ import annotations

import difflib
import re
import uuid
from pathlib import Path

import pytest

from clickhouse import schema
from clickhouse.migrate import statements
from stack import services
from stack.config import StackSettings


def test_schema_file_is_regenerated(
    clickhouse: StackSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = services.migration_settings(clickhouse)
    monkeypatch.setenv("JOBSCOPE_CLICKHOUSE_HOST", settings.clickhouse_host)
    monkeypatch.setenv("JOBSCOPE_CLICKHOUSE_PORT", str(settings.clickhouse_port))
    password = settings.clickhouse_admin_password.get_secret_value()
    monkeypatch.setenv("JOBSCOPE_CLICKHOUSE_ADMIN_PASSWORD", password)
    output = tmp_path / "schema.sql"

    assert schema.main(["--output", str(output)]) == 0

    generated = output.read_text()
    committed = schema.SCHEMA_FILE.read_text() if schema.SCHEMA_FILE.exists() else ""
    diff = difflib.unified_diff(
        committed.splitlines(keepends=True),
        generated.splitlines(keepends=True),
        "clickhouse/schema.sql (committed)",
        "from the migrations",
    )
    if generated != committed:
        pytest.fail(
            "clickhouse/schema.sql is not what the migrations give: with `make up` running, run\n"
            f"    set -a; . state/secrets.env; set +a; .venv/bin/{schema.COMMAND}\n"
            f"(or copy {output}, written from this test's server)\n" + "".join(list(diff)[:80]),
            pytrace=False,
        )


def test_schema_file_applies_top_to_bottom(clickhouse: StackSettings) -> None:
    """Each statement of the file, in order, into an empty database, gives the file back.
    The functions exist already (they are global) and are left out; the Kafka tables get a
    broker address where nothing listens (port 1), so they consume nothing meanwhile."""
    database = f"schema_file_{uuid.uuid4().hex[:8]}"
    admin = services.clickhouse_client(clickhouse, "jobscope")
    admin.command(f"CREATE DATABASE {database}")
    try:
        client = services.clickhouse_client(clickhouse, "jobscope", database=database)
        text = schema.SCHEMA_FILE.read_text()
        for statement in statements(text.replace(schema.DEFAULT_BROKERS, "127.0.0.1:1")):
            if not re.search(r"^CREATE FUNCTION", statement, re.M):
                client.command(statement)
        assert schema.render(schema.statements(client, database)) == text
    finally:
        admin.command(f"DROP DATABASE {database}")
