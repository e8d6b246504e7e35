"""`jobscope compare A B` end to end (a subprocess against the real API): a table with a
column per job and each figure's difference to the first, or the API's JSON; an unknown
job is one line on stderr."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from tests.api.conftest import Row, iso
from tests.client.conftest import Scenario
from tests.client.test_cli import run


def test_compare_table_and_json(
    api_url: str,
    scenario: Scenario,
    post_job: Callable[..., dict[str, Any]],
    insert_readings: Callable[[list[Row]], None],
) -> None:
    """The scenario's job against one on the same span at twice its power on one node."""
    node = f"cmp-{uuid.uuid4().hex[:8]}"
    insert_readings(
        [
            [
                scenario.start + timedelta(seconds=s, microseconds=250_000),
                node,
                "bmc_power_watt",
                450.0,
                {},
            ]
            for s in range(120)
        ]
    )
    other = post_job(
        job_id=f"{node}-job",
        user="u",
        nodes=[node],
        start=iso(scenario.start),
        end=iso(scenario.end),
        state="terminated",
    )["job_id"]
    done = run(api_url, "compare", scenario.job_id, other, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    first, second = answer["jobs"]
    assert [first["job"]["job_id"], second["job"]["job_id"]] == [scenario.job_id, other]
    delta = second["diff"]["energy_j"]["delta"]
    assert delta == second["figures"]["energy_j"] - first["figures"]["energy_j"]
    table = run(api_url, "compare", scenario.job_id, other)
    assert table.returncode == 0, table.stderr
    text = table.stdout.decode()
    assert f"{scenario.job_id} (reference)" in text and other in text
    relative = second["diff"]["footprint.bmc_power_watt.position"]["relative"]
    assert "footprint.bmc_power_watt.position" in text and f"({relative:+.1%})" in text
    missing = run(api_url, "compare", scenario.job_id, f"{node}-none")
    assert missing.returncode == 1 and b"404" in missing.stderr and missing.stderr.count(b"\n") == 1
