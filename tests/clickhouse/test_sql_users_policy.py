"""The embedded engine has no access control of its own: its SQL user `reader` reads every
row of every table. Under the `jobs` read policy that user is off unless an admin grants it
(JOBSCOPE_CLICKHOUSE_SQL_USERS=true): a real server of its own, started each way."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from stack import services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import wait_until
from stack.transient import STARTING
from tests import ports

AUTHENTICATION_FAILED = "516"


@pytest.fixture(scope="module")
def settings() -> Iterator[StackSettings]:
    settings = StackSettings(
        state_dir=ports.state_dir("sql-users"), clickhouse_port=ports.port("sql-users")
    )
    services.process(settings, "clickhouse").stop()  # a crashed run's
    shutil.rmtree(settings.state_dir, ignore_errors=True)
    yield settings
    shutil.rmtree(settings.state_dir, ignore_errors=True)


@contextmanager
def server(settings: StackSettings, **env: str) -> Iterator[None]:
    """The local ClickHouse server with `env` added to its settings (no Kafka, no schema)."""
    process = services.process(settings, "clickhouse")
    process.start(
        [sys.executable, "-m", "stack.clickhouse_server"],
        env={**services.component_env(settings, "clickhouse"), **env},
        cwd=REPO_ROOT,
        ports=[(settings.host, settings.clickhouse_port)],
    )
    try:
        wait_until(
            lambda: httpx.get(f"{settings.clickhouse_url}/ping").status_code == 200,
            60,
            f"ClickHouse on {settings.clickhouse_url}",
            transient=STARTING,
        )
        yield
    finally:
        process.stop()


def ask(settings: StackSettings, user: str) -> httpx.Response:
    auth = (user, services.clickhouse_password(settings, user))
    return httpx.post(settings.clickhouse_url, auth=auth, content="SELECT 1", timeout=30)


@pytest.mark.parametrize(
    ("env", "reader_admitted"),
    [
        ({"JOBSCOPE_READ_POLICY": "jobs"}, False),
        ({"JOBSCOPE_READ_POLICY": "jobs", "JOBSCOPE_CLICKHOUSE_SQL_USERS": "true"}, True),
        ({"JOBSCOPE_READ_POLICY": "open"}, True),
        ({"JOBSCOPE_READ_POLICY": "open", "JOBSCOPE_CLICKHOUSE_SQL_USERS": "false"}, False),
    ],
    ids=["jobs", "jobs-granted", "open", "open-refused"],
)
def test_reader_exists_only_where_the_policy_or_an_admin_allows(
    settings: StackSettings, env: dict[str, str], reader_admitted: bool
) -> None:
    with server(settings, **env):
        assert ask(settings, "jobscope").text == "1\n"  # the admin, whatever the policy
        answer = ask(settings, "reader")
        if reader_admitted:
            assert answer.status_code == 200 and answer.text == "1\n", answer.text
        else:
            assert answer.headers.get("X-ClickHouse-Exception-Code") == AUTHENTICATION_FAILED
            assert "Authentication failed" in answer.text
