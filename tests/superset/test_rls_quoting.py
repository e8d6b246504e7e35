"""Superset's row-level security clause (superset/jobscope_access.py) takes the user's name
and projects from the provider's token: a hostile name stays one string literal of the
clause, as ClickHouse's own parser reads it, never SQL."""

from __future__ import annotations

import json
import subprocess

from clickhouse_connect.driver.client import Client

from stack import superset
from stack.config import REPO_ROOT

HOSTILE_USER = "a' OR 1=1 --\\"
HOSTILE_PROJECT = "p' OR '1'='1"
RENDER = """
import json, sys
import jinja2.sandbox
import jobscope_access
user, project = json.loads(sys.argv[1])
clause = jinja2.sandbox.SandboxedEnvironment().from_string(jobscope_access.VISIBLE_JOBS)
print(clause.render(
    current_username=lambda: user,
    current_user_roles=lambda: [jobscope_access.PROJECT_ROLE_PREFIX + project],
))
"""


def test_a_hostile_name_stays_a_string_literal(admin_client: Client) -> None:
    """Rendered as Superset renders it (its Jinja sandbox, in its own venv), then parsed by
    ClickHouse: the WHERE compares `user` and `project` with the names, whole."""
    rendered = subprocess.run(
        [
            str(superset.SupersetSettings().bin("python")),
            "-c",
            RENDER,
            json.dumps([HOSTILE_USER, HOSTILE_PROJECT]),
        ],
        cwd=REPO_ROOT / "superset",
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.strip()

    def literal(value: str) -> str:
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

    def parsed(query: str) -> str:
        return admin_client.query(
            "SELECT formatQuerySingleLine({q:String})", parameters={"q": query}
        ).first_row[0]

    got = parsed(f"SELECT job_id FROM jobs WHERE {rendered}")
    expected = parsed(
        "SELECT job_id FROM jobs WHERE "
        f"`user` = {literal(HOSTILE_USER)} OR project = {literal(HOSTILE_PROJECT)}"
    )
    assert got == expected, rendered
