"""jobscope.client against the real API: DataFrames fetched as Arrow, jobs, summaries, errors."""

from __future__ import annotations

import csv
import io
import json
import socket
import uuid

import pandas as pd
import pytest

from jobscope.client import ApiError, Client
from stack.processes import wait_until
from tests.client.conftest import Scenario


def test_metrics_frame_matches_the_inserted_readings(api_url: str, scenario: Scenario) -> None:
    frame = Client(api_url).metrics(job=scenario.job_id, metrics="bmc_*")
    assert list(frame.columns) == ["timestamp", "device_id", "metric_id", "value", "labels"]
    assert str(frame["timestamp"].dtype) == "datetime64[us, UTC]"
    expected = sorted(
        (pd.Timestamp(t, tz="UTC"), d, m, v, lab)
        for t, d, m, v, lab in scenario.rows
        if m.startswith("bmc_")
    )
    got = sorted(frame.itertuples(index=False, name=None))
    assert got == expected


def test_metrics_frame_equals_the_csv_export(api_url: str, scenario: Scenario) -> None:
    client = Client(api_url)
    frame = client.metrics(job=scenario.job_id)
    with client.readings(job=scenario.job_id, format="csv") as response:
        text = response.read().decode()
    exported = list(csv.DictReader(io.StringIO(text)))
    assert len(exported) == len(scenario.rows) == len(frame)
    for row, (ts, device, metric, value, labels) in zip(
        exported, frame.itertuples(index=False, name=None), strict=True
    ):
        assert pd.Timestamp(row["timestamp"]) == ts
        assert (row["device_id"], row["metric_id"]) == (device, metric)
        assert float(row["value"]) == value
        assert json.loads(row["labels"]) == labels


def test_time_range_narrows(api_url: str, scenario: Scenario) -> None:
    start = scenario.start.isoformat() + "Z"
    end = (scenario.start + pd.Timedelta(seconds=30)).isoformat() + "Z"
    frame = Client(api_url).metrics(
        job=scenario.job_id, metrics="prom_node_load1", start_time=start, end_time=end
    )
    assert len(frame) == 2 * 30  # seconds 0..29 of each node (readings at .25 s)


def test_empty_result_has_the_columns_and_types(api_url: str, scenario: Scenario) -> None:
    frame = Client(api_url).metrics(job=scenario.job_id, metrics="no_such_metric")
    assert frame.empty
    assert str(frame["timestamp"].dtype) == "datetime64[us, UTC]"


def test_jobs_and_summary(api_url: str, scenario: Scenario) -> None:
    client = Client(api_url)
    jobs = client.jobs(user=scenario.user)
    assert list(jobs["job_id"]) == [scenario.job_id]
    summary = client.summary(scenario.job_id)
    power = {m["device_id"]: m for m in summary["metrics"] if m["metric_id"] == "bmc_power_watt"}
    assert set(power) == set(scenario.nodes)
    assert power[scenario.nodes[0]]["count"] == 120
    assert summary["energy"] and summary["energy_total"]


def test_api_errors_name_the_problem(api_url: str, scenario: Scenario) -> None:
    client = Client(api_url)
    with pytest.raises(ApiError) as error:
        client.metrics(job=scenario.job_id, start_time="yesterday-ish")
    assert error.value.status == 400 and error.value.parameter == "start_time"
    assert "start_time" in str(error.value)
    with pytest.raises(ApiError) as missing:
        client.summary(f"{scenario.job_id}-absent")
    assert missing.value.status == 404 and f"{scenario.job_id}-absent" in str(missing.value)


def test_connection_refused_names_the_url() -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with pytest.raises(ApiError) as error:
            Client(url).jobs()
    assert str(error.value).startswith(f"cannot reach the jobscope API at {url}")


def test_push_a_frame_and_read_it_back(api_url: str, api_tokens: dict[str, str]) -> None:
    """An admin token may push for any device; the frame comes back as it went, with the
    API's `source` label added."""
    device = f"push-frame-{uuid.uuid4().hex[:8]}"
    now = pd.Timestamp.now(tz="UTC").floor("s")
    sent = pd.DataFrame(
        {
            "timestamp": pd.to_datetime([now - pd.Timedelta(seconds=i) for i in (2, 1)]),
            "device_id": [device, device],
            "metric_id": ["app_phase", "app_phase"],
            "value": [1.5, 2.5],
            "labels": [{"phase": "solve"}, {}],
        }
    )
    client = Client(api_url, api_tokens["admin"])
    assert client.push(sent) == 2
    window = {
        "start_time": (now - pd.Timedelta(minutes=1)).isoformat(),
        "end_time": now.isoformat(),
    }
    wait_until(
        lambda: len(client.metrics(devices=device, **window)) == 2,
        timeout=30,
        what="the pushed frame in ClickHouse",
    )
    got = client.metrics(devices=device, **window)
    source = {lab.pop("source") for lab in got["labels"]}
    assert len(source) == 1 and source.pop().startswith("user:")
    pd.testing.assert_frame_equal(got, sent.astype({"timestamp": "datetime64[us, UTC]"}))


def test_live_replays_an_ended_job_then_stops(api_url: str, scenario: Scenario) -> None:
    """`live` with `since` on a job that ended: its readings (from ClickHouse) as DataFrames
    with the columns of `metrics`, then the iterator ends with the stream."""
    client = Client(api_url)
    frames = list(client.live(scenario.job_id, since=scenario.start.isoformat()))
    frame = pd.concat(frames, ignore_index=True)
    assert list(frame.columns) == ["timestamp", "device_id", "metric_id", "value", "labels"]
    assert str(frame["timestamp"].dtype) == "datetime64[us, UTC]"
    expected = client.metrics(job=scenario.job_id)
    key = ["timestamp", "device_id", "metric_id", "value"]
    assert sorted(frame[key].itertuples(index=False, name=None)) == sorted(
        expected[key].itertuples(index=False, name=None)
    )
    readings = list(client.live(scenario.job_id, metrics="bmc_power_watt", since=0, frames=False))
    assert len(readings) == 240 and {r["metric_id"] for r in readings} == {"bmc_power_watt"}
