"""On-demand metrics end to end: an activation through the API switches optional entries on
(and an `optional_period` entry to its fast period) in a running producers process, a
restarted process recovers it from the topic, and the job's end switches it off."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest
from clickhouse_connect.driver.client import Client

from producers.entry import DeviceEntry
from producers.ondemand import Activations, parse_activation
from producers.runtime import build_groups, plan
from stack import services
from stack.config import StackSettings
from stack.processes import wait_until
from tests.schedules import assert_unbroken


def _stamps(reader: Client, device_id: str, metric_id: str, since_us: int = 0) -> list[int]:
    rows = reader.query(
        "SELECT toUnixTimestamp64Micro(timestamp) AS t FROM metrics "
        "WHERE device_id = {d:String} AND metric_id = {m:String} "
        "AND toUnixTimestamp64Micro(timestamp) > {s:Int64} ORDER BY t",
        parameters={"d": device_id, "m": metric_id, "s": since_us},
    ).result_rows
    return [row[0] for row in rows]


def _count(reader: Client, device_id: str, metric_id: str, since_us: int = 0) -> int:
    return reader.command(
        "SELECT count() FROM metrics WHERE device_id = {d:String} AND metric_id = {m:String} "
        "AND toUnixTimestamp64Micro(timestamp) > {s:Int64}",
        parameters={"d": device_id, "m": metric_id, "s": since_us},
    )


def _assert_period(stamps: list[int], period_us: int, log: str, device_id: str) -> None:
    """`stamps` are one per tick of `period_us`, every tick from the first to the last but
    those the producer reported skipped (tests/schedules.py): not polled at another period."""
    assert_unbroken(stamps, period_us, log, device_id)


def _now_us() -> int:
    return time.time_ns() // 1000


def test_activation_through_the_api_reaches_the_producers(
    clickhouse: StackSettings,
    api_url: str,
    api_tokens: dict[str, str],
    reader_client: Client,
    tmp_path: Path,
) -> None:
    uid = uuid.uuid4().hex[:8]
    node, other, pdu, outsider = (f"od{uid}-{n}" for n in ("node", "node2", "pdu", "out"))
    devices = tmp_path / "devices.yaml"
    devices.write_text(
        f"- {{name: base_value, device_id: {node}, url: 'tester://', update_every: 500}}\n"
        f"- {{name: opt_value, device_id: {node}, url: 'tester://', update_every: 500, "
        "optional: true}\n"
        f"- {{name: opt_value, device_id: {outsider}, url: 'tester://', update_every: 500, "
        "optional: true}\n"
        f"- {{name: pdu_power_watt, device_id: {pdu}, url: 'tester://', update_every: 1000, "
        f"optional_period: 200, labels: {{_device_alias: {other}}}}}\n"
    )
    headers = {"Authorization": f"Bearer {api_tokens['scheduler']}"}
    job_id = f"od-{uid}"
    job = {"job_id": job_id, "nodes": [node, other], "state": "running", "start": time.time()}
    assert httpx.post(f"{api_url}/api/jobs", json=job, headers=headers, timeout=30).is_success

    producers = services.start_producers(clickhouse, devices, name=f"producers-od-{uid}")
    try:
        wait_until(lambda: _count(reader_client, node, "base_value") >= 4, 60, "base readings")
        assert _count(reader_client, node, "opt_value") == 0  # optional: off until activated

        activated = httpx.post(
            f"{api_url}/api/jobs/{job_id}/on-demand",
            json={"metrics": "opt_|pdu_"},
            headers=headers,
            timeout=30,
        )
        assert activated.status_code == 202, activated.text
        assert activated.json()["devices"] == [node, other]
        since = _now_us()
        wait_until(lambda: _count(reader_client, node, "opt_value", since) >= 3, 30, "opt_value")
        wait_until(
            lambda: _count(reader_client, pdu, "pdu_power_watt", since) >= 10, 30, "fast pdu"
        )
        fast = _stamps(reader_client, pdu, "pdu_power_watt", since)[-5:]
        _assert_period(fast, 200_000, producers.log_file.read_text(), pdu)  # not its 1 s
        assert _count(reader_client, outsider, "opt_value") == 0  # not a node of the job

        # a restarted producer recovers the active set from the compacted topic
        producers.stop()
        producers = services.start_producers(clickhouse, devices, name=f"producers-od-{uid}")
        restarted = _now_us()
        wait_until(lambda: _count(reader_client, node, "opt_value", restarted) >= 3, 30, "recovery")

        ended = httpx.patch(
            f"{api_url}/api/jobs/{job_id}",
            json={"state": "terminated", "end": time.time()},
            headers=headers,
            timeout=30,
        )
        assert ended.is_success, ended.text
        stopped = _now_us()
        wait_until(lambda: _count(reader_client, pdu, "pdu_power_watt", stopped) >= 3, 30, "pdu")
        # off within seconds: no opt_value after a margin, the pdu back to its 1 s period
        margin = stopped + 3_000_000
        wait_until(
            lambda: _count(reader_client, pdu, "pdu_power_watt", margin) >= 3, 30, "slow pdu"
        )
        assert _count(reader_client, node, "opt_value", margin) == 0
        slow = _stamps(reader_client, pdu, "pdu_power_watt", margin)
        _assert_period(slow, 1_000_000, producers.log_file.read_text(), pdu)
        assert _count(reader_client, node, "base_value", margin) > 0  # the rest goes on
    finally:
        producers.stop()


def test_activation_errors(api_url: str, api_tokens: dict[str, str]) -> None:
    headers = {"Authorization": f"Bearer {api_tokens['scheduler']}"}
    url = f"{api_url}/api/jobs/od-missing-{uuid.uuid4().hex[:6]}/on-demand"
    assert httpx.post(url, json={}, timeout=10).status_code == 401
    assert httpx.post(url, json={}, headers=headers, timeout=10).status_code == 404
    bad = httpx.post(url, json={"metrics": "("}, headers=headers, timeout=10)
    assert bad.status_code == 400 and bad.json()["parameter"] == "metrics", bad.text

    job_id = f"od-ended-{uuid.uuid4().hex[:6]}"
    job = {
        "job_id": job_id,
        "nodes": ["n1"],
        "state": "terminated",
        "start": 1795424400,
        "end": 1795428000,
    }
    assert httpx.post(f"{api_url}/api/jobs", json=job, headers=headers, timeout=30).is_success
    ended = httpx.post(
        f"{api_url}/api/jobs/{job_id}/on-demand", json={}, headers=headers, timeout=30
    )
    assert ended.status_code == 409 and "has ended" in ended.json()["error"], ended.text


def test_users_switch_on_demand_metrics_for_their_own_jobs_only(
    api_url: str, api_tokens: dict[str, str]
) -> None:
    admin = {"Authorization": f"Bearer {api_tokens['admin']}"}
    created = httpx.post(
        f"{api_url}/api/tokens", json={"user": "alice", "role": "pusher"}, headers=admin, timeout=10
    )
    assert created.status_code == 201, created.text
    alice = {"Authorization": f"Bearer {created.json()['token']}"}
    uid = uuid.uuid4().hex[:6]
    for owner in ("alice", "bob"):
        job = {"job_id": f"od-{owner}-{uid}", "user": owner, "nodes": ["n1"], "state": "running"}
        posted = httpx.post(f"{api_url}/api/jobs", json=job, headers=admin, timeout=30)
        assert posted.status_code == 201, posted.text
    own = httpx.post(f"{api_url}/api/jobs/od-alice-{uid}/on-demand", json={}, headers=alice)
    assert own.status_code == 202, own.text
    other = httpx.post(f"{api_url}/api/jobs/od-bob-{uid}/on-demand", json={}, headers=alice)
    assert other.status_code == 403 and "not a job of 'alice'" in other.json()["error"]
    removed = httpx.delete(f"{api_url}/api/jobs/od-bob-{uid}/on-demand", headers=alice)
    assert removed.status_code == 403
    assert httpx.delete(f"{api_url}/api/jobs/od-alice-{uid}/on-demand", headers=alice).is_success


@pytest.mark.parametrize(
    ("types", "active"),
    [("monitor=wattmetre_power", True), ("deploy,monitor", True), ("deploy", False)],
)
def test_oar_monitor_job_types_activate_like_kwollect(types: str, active: bool) -> None:
    """`oarsub -t monitor='<regexp>'` (the OAR hook sends the types as the label `types`)."""
    from api.ondemand import activation, monitor_types
    from api.schemas import JobCreate

    wanted, pattern = monitor_types({"types": types})
    assert wanted is active
    if not active:
        return
    job = JobCreate(job_id="1", nodes=["grisou-1.nancy.grid5000.fr"], labels={"types": types})
    document = activation(job, pattern, None).model_dump_json().encode()
    parsed = parse_activation("job/1", document, max_pattern_chars=4096)
    activations = Activations({parsed.id: parsed})
    now = _now_us()
    assert activations.active("grisou-1", None, "wattmetre_power_watt", now)
    assert activations.active("wattmetre1-port3", "grisou-1", "wattmetre_power_watt", now)
    assert not activations.active("grisou-2", None, "wattmetre_power_watt", now)
    assert activations.active("grisou-1", None, "bmc_power_watt", now) is (pattern is None)


def test_plan_follows_activations_and_expiry() -> None:
    entries = [
        DeviceEntry(name="opt_a", device_id="n1", url="tester://", optional=True),
        DeviceEntry(
            name="fast_b", device_id="n1", url="tester://", update_every=1000, optional_period=20
        ),
    ]
    assert [g.update_every_ms for g in build_groups(entries)] == [1000]
    now = _now_us()
    activation = parse_activation(
        "job/9",
        b'{"devices": ["n1"], "metrics": null, "until": %d}' % (now // 1_000_000 + 60),
        max_pattern_chars=4096,
    )
    activations = Activations({activation.id: activation})
    periods = sorted(key[2] for key in plan(entries, activations, now))
    assert periods == [20, 10_000]
    assert sorted(key[2] for key in plan(entries, activations, now + 61_000_000)) == [1000]
