"""A GPU's energy in a job's summary: jobscope's integral of the GPU's power samples against
the GPU's own energy counter over the same span. The samples are NVML's, recorded on an
NVIDIA H100 idle then under load (stack/simulators/gpu/nvml-samples.json: power in mW and
the board's energy counter in mJ, about 1 s apart), written into `metrics` as the
nvidiasmi:// plugin names them; the job goes through the real API."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from stack.simulators.nvidiasmi import RECORDINGS
from tests.api.conftest import Row

SAMPLES = json.loads((RECORDINGS / "nvml-samples.json").read_text())
LOADED = SAMPLES[3:]
"""The samples from the load's start on, every ~1 s (the first three, 3 s earlier and 15 ms
apart, would be a gap in the power series: the counter would span time the integral does not)."""
LABELS = {"gpu": "0", "gpu_uuid": LOADED[0]["uuid"]}
TOLERANCE = 0.01
"""Power sampled once a second misses the shape of the load's two steps (70 -> 700 W and
back, each within one interval): the trapezoid's error at one step is at most half the step
times the interval, ~3 % of this span's energy, of opposite signs at the rise and the fall.
Measured on this recording: -0.48 %. 1 % fails a summary that loses a step's interval, the
span's edge or the mW -> W and mJ -> J scales."""


def utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC).replace(tzinfo=None)


def trapezoid(samples: list[dict[str, Any]]) -> float:
    """The power integral in J, computed here apart from ClickHouse."""
    return sum(
        (a["power_mw"] + b["power_mw"]) / 2e3 * (b["t"] - a["t"])
        for a, b in itertools.pairwise(samples)
    )


@pytest.fixture(scope="module")
def job(
    insert_readings: Callable[[list[Row]], None], post_job: Callable[..., dict[str, Any]]
) -> tuple[str, str]:
    """Every recorded sample of one node's GPU 0; a job from the load's first sample (whole
    seconds around it) to the last."""
    p = f"ge{uuid.uuid4().hex[:6]}"
    node, job_id = f"{p}-node-1", f"{p}_1"
    rows: list[Row] = []
    for s in SAMPLES:
        rows += [[utc(s["t"]), node, "gpu_power_watt", s["power_mw"] / 1e3, LABELS]]
        rows += [[utc(s["t"]), node, "gpu_energy_joules_total", s["energy_mj_total"] / 1e3, LABELS]]
    insert_readings(rows)
    start = utc(LOADED[0]["t"]).replace(microsecond=0)
    end = utc(LOADED[-1]["t"]).replace(microsecond=0) + timedelta(seconds=1)
    assert SAMPLES[2]["t"] < start.replace(tzinfo=UTC).timestamp()  # the idle ones are out
    post_job(
        job_id=job_id,
        user="alice",
        nodes=[node],
        start=start.isoformat() + "Z",
        end=end.isoformat() + "Z",
        state="terminated",
    )
    return job_id, node


def test_power_integral_matches_the_gpus_own_energy_counter(
    api_url: str, job: tuple[str, str]
) -> None:
    job_id, node = job
    response = httpx.get(f"{api_url}/api/jobs/{job_id}/summary", timeout=30)
    assert response.status_code == 200, response.text
    got = response.json()
    energy = {e["metric_id"]: e for e in got["energy"] if e["node"] == node}
    power, counter = energy["gpu_power_watt"], energy["gpu_energy_joules_total"]
    assert (power["role"], counter["role"]) == ("gpu", "gpu")
    span = LOADED[-1]["t"] - LOADED[0]["t"]
    # the same trapezoid (timestamps are stored to the microsecond)
    assert power["joules"] == pytest.approx(trapezoid(LOADED), rel=1e-6)
    assert power["covered_s"] == pytest.approx(span, abs=1e-5)
    delta = (LOADED[-1]["energy_mj_total"] - LOADED[0]["energy_mj_total"]) / 1e3
    assert counter["joules"] == pytest.approx(delta, rel=1e-12)  # 10285.627 J
    relative = (power["joules"] - counter["joules"]) / counter["joules"]
    assert abs(relative) < TOLERANCE, f"power integral vs counter: {relative:+.3%}"
    rows = {m["metric_id"]: m for m in got["metrics"] if m["device_id"] == node}
    assert (rows["gpu_power_watt"]["unit"], rows["gpu_power_watt"]["kind"]) == ("W", "gauge")
    assert (rows["gpu_energy_joules_total"]["unit"], rows["gpu_energy_joules_total"]["kind"]) == (
        "J",
        "energy_counter",
    )
