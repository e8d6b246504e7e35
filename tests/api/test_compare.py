"""Footprint, notes and compare on the real stack: a busy healthy job and an idle job with a
silent node, their readings written into ClickHouse, compared through the API. The
footprint places each node between the registry's idle and peak, counts the time above the
caution level and finds the silence; the shipped rules fire on the idle job only."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.api.conftest import Row, iso

TAG = uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def two_jobs(
    post_job: Callable[..., dict[str, Any]], insert_readings: Callable[[list[Row]], None]
) -> tuple[str, str]:
    """busy: 2 nodes at 350 W (idle 100, peak 400) with CPU temperatures above caution
    (85 Cel) half the time; idle: node 1 at 105 W throughout, node 2 silent for its last
    60 s of 180."""
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(minutes=5)
    start = end - timedelta(seconds=180)
    rows: list[Row] = []
    busy, idle = f"cmp-{TAG}-busy", f"cmp-{TAG}-idle"
    for s in range(181):
        t = start + timedelta(seconds=s)
        for n in (1, 2):
            rows.append([t, f"{busy}-{n}", "bmc_power_watt", 350.0, {}])
            temp = 90.0 if s < 90 else 60.0
            rows.append([t, f"{busy}-{n}", "bmc_cpu_temp_celsius", temp, {}])
            if n == 1 or s <= 120:
                rows.append([t, f"{idle}-{n}", "bmc_power_watt", 105.0 if n == 1 else 300.0, {}])
    insert_readings(rows)
    for job in (busy, idle):
        post_job(
            job_id=job,
            user=f"u-{TAG}",
            nodes=[f"{job}-1", f"{job}-2"],
            start=iso(start),
            end=iso(end),
            state="terminated",
        )
    return busy, idle


def test_compare_shows_footprint_notes_and_differences(
    api_url: str, two_jobs: tuple[str, str]
) -> None:
    busy, idle = two_jobs
    response = httpx.get(
        f"{api_url}/api/jobs/compare", params={"ids": f"{busy},{idle}"}, timeout=60
    )
    assert response.status_code == 200, response.text
    first, second = response.json()["jobs"]
    assert first["job"]["job_id"] == busy and second["job"]["job_id"] == idle
    assert first["notes"] == [] and first["severity"] == ""
    assert first["footprint_source"] == "raw"
    fig = first["figures"]
    assert fig["footprint.bmc_power_watt.position"] == pytest.approx(250 / 300)
    assert fig["footprint.bmc_cpu_temp_celsius.above_caution_s"] == pytest.approx(90, abs=1)
    assert fig["energy_j"] == pytest.approx(2 * 350 * 180, rel=0.01)
    fired = {n["id"]: n for n in second["notes"]}
    assert set(fired) == {"node-power-idle", "node-silent", "energy-coverage-low"}, fired
    assert fired["node-power-idle"]["nodes"] == [f"{idle}-1"]
    assert fired["node-silent"]["nodes"] == [f"{idle}-2"]
    assert second["severity"] == "warning"
    diff = second["diff"]["energy_j"]
    expected = (105 * 180 + 300 * 120) - 2 * 350 * 180
    assert diff["delta"] == pytest.approx(expected, rel=0.02)
    assert diff["relative"] == pytest.approx(expected / (2 * 350 * 180), rel=0.02)


def test_compare_refuses_and_hides(api_url: str, two_jobs: tuple[str, str]) -> None:
    busy, _ = two_jobs
    url = f"{api_url}/api/jobs/compare"
    unknown = httpx.get(url, params={"ids": f"{busy},cmp-{TAG}-nope"}, timeout=30)
    assert unknown.status_code == 404, unknown.text
    for ids in (busy, f"{busy},", ",".join([busy] * 11)):
        refused = httpx.get(url, params={"ids": ids}, timeout=30)
        assert refused.status_code == 400 and "ids" in refused.text, refused.text
