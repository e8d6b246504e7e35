"""Users' metric patterns against the running API: a glob or regex built to backtrack
(`**********x`, `(a+)+$`) is matched in time linear in the name, or refused with a 400
naming the parameter; meanwhile `/health` answers within its promise (`health_timeout_s`).

Before RE2 (kafka/patterns.py), a live stream's glob became a Python regex run on the
event loop: seconds per reading, and every other request of the API waited.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from api.infra.config import ApiSettings
from kafka.reading import Reading
from stack import services
from stack.config import StackSettings
from stack.processes import wait_until
from tests.api.conftest import Listener

DEFAULTS = {name: field.default for name, field in ApiSettings.model_fields.items()}
HEALTH_PROMISE_S = DEFAULTS["health_timeout_s"] + 1.0
"""`/health` answers within `health_timeout_s` whatever else happens; 1 s of slack for a
busy machine. Python's `re` took seconds per reading on the attack glob below."""
ATTACK_GLOB = "**********x"
ATTACK_NAME = "a" * 30
"""With Python's `re`, `(?:.*.*.*.*.*.*.*.*.*.*x)` on 30 characters backtracks ~3 s."""


class HealthProbe:
    """GETs `/health` in a loop from a thread; keeps the longest answer time. Returns once
    the first answer came (a loaded run once finished the attack before the thread's first
    request)."""

    def __init__(self, api_url: str) -> None:
        self.api_url = api_url
        self.slowest_s = 0.0
        self.answers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        wait_until(lambda: self.answers > 0, 60, "a first /health answer")

    def _run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                began = time.monotonic()
                client.get(f"{self.api_url}/health")
                self.slowest_s = max(self.slowest_s, time.monotonic() - began)
                self.answers += 1
                self._stop.wait(0.05)

    def stop(self) -> float:
        """Stop after the answer in flight; the slowest answer time."""
        self._stop.set()
        self._thread.join(timeout=120)
        return self.slowest_s


def _running_job(post_job: Callable[..., dict[str, Any]], node: str) -> str:
    job_id = f"{node}-job"
    start = datetime.now(UTC) - timedelta(minutes=1)
    post_job(job_id=job_id, user="alice", nodes=[node], start=start.isoformat(), state="running")
    return job_id


def test_a_backtracking_glob_in_a_live_stream_leaves_the_api_answering(
    api_url: str,
    post_job: Callable[..., dict[str, Any]],
    publish: Callable[[list[Reading]], None],
) -> None:
    node = f"pat-{uuid.uuid4().hex[:6]}"
    job_id = _running_job(post_job, node)
    listener = Listener(api_url, job_id, {"metrics": f"{ATTACK_GLOB},keep_*"})
    listener.wait(lambda: "live" in listener.names(), 30, "the stream to be live")

    probe = HealthProbe(api_url)
    now = int(time.time() * 1e6)
    attack = [Reading(now + i, node, f"{ATTACK_NAME}{i}", 1.0, {}) for i in range(6)]
    publish([*attack, Reading(now + 10, node, "keep_me", 2.0, {})])
    try:
        listener.wait(lambda: listener.rows(), 60, "the reading after the attack names")
    finally:
        slowest = probe.stop()
    assert [row["metric_id"] for row in listener.rows()] == ["keep_me"]
    assert probe.answers > 0
    assert slowest < HEALTH_PROMISE_S, f"/health took {slowest:.1f} s during the stream"


def test_metric_globs_are_bounded_and_answer_quickly(
    api_url: str, insert_readings: Callable[[list[list[Any]]], None]
) -> None:
    """Within the caps, the worst globs answer a readings query quickly (ClickHouse's LIKE
    is RE2's) and a live stream opens; past them: 400 naming `metrics`."""
    device = f"pat-{uuid.uuid4().hex[:6]}"
    now = datetime.now(UTC).replace(tzinfo=None)
    insert_readings([[now, device, f"{ATTACK_NAME}{i}", 1.0, {}] for i in range(20)])
    most, longest = DEFAULTS["max_globs"], DEFAULTS["max_glob_chars"]
    worst = [("*a" * longest)[: longest - 1] + "x", *[ATTACK_GLOB] * (most - 1)]
    window = {"start_time": (now - timedelta(minutes=1)).isoformat(), "devices": device}

    probe = HealthProbe(api_url)
    began = time.monotonic()
    try:
        answer = httpx.get(
            f"{api_url}/api/metrics", params={**window, "metrics": ",".join(worst)}, timeout=60
        )
    finally:
        slowest = probe.stop()
    assert answer.status_code == 200 and answer.json() == [], answer.text
    assert time.monotonic() - began < HEALTH_PROMISE_S
    assert slowest < HEALTH_PROMISE_S

    refused = {
        "JOBSCOPE_MAX_GLOBS": [*worst, "b*"],
        "JOBSCOPE_MAX_GLOB_CHARS": ["*" * (longest + 1)],
    }
    for setting, globs in refused.items():
        for url in (f"{api_url}/api/metrics", f"{api_url}/api/jobs/any-job/live"):
            response = httpx.get(url, params={**window, "metrics": ",".join(globs)}, timeout=30)
            assert response.status_code == 400, (url, response.text)
            assert response.json()["parameter"] == "metrics"
            assert setting in response.json()["error"]


def test_on_demand_regexes_are_re2_and_bounded(
    api_url: str, api_tokens: dict[str, str], post_job: Callable[..., dict[str, Any]]
) -> None:
    """What the producers could not run in linear time, or would refuse, is a 400 naming
    `metrics`; a pattern that backtracks in Python but not in RE2 is taken."""
    node = f"pat-{uuid.uuid4().hex[:6]}"
    job_id = _running_job(post_job, node)
    url = f"{api_url}/api/jobs/{job_id}/on-demand"
    headers = {"Authorization": f"Bearer {api_tokens['scheduler']}"}
    longest = DEFAULTS["ondemand_max_pattern_chars"]
    refused = {
        "a(?=b)": "invalid perl operator",
        r"(a)\1": "invalid escape sequence",
        "(": "missing )",
        "a|" * longest: "JOBSCOPE_ONDEMAND_MAX_PATTERN_CHARS",
    }
    for pattern, reason in refused.items():
        response = httpx.post(url, json={"metrics": pattern}, headers=headers, timeout=30)
        assert response.status_code == 400, (pattern[:20], response.text)
        assert response.json()["parameter"] == "metrics"
        assert reason in response.json()["error"]
    taken = httpx.post(url, json={"metrics": "(a+)+$"}, headers=headers, timeout=30)
    assert taken.status_code == 202, taken.text
    assert httpx.delete(url, headers=headers, timeout=30).is_success


def test_a_monitor_job_type_re2_refuses_is_written_not_activated(
    clickhouse: StackSettings, post_job: Callable[..., dict[str, Any]]
) -> None:
    """The scheduler's job is recorded whatever its types say; an OAR `monitor=` regex the
    producers would refuse is not published, and the API's log says why."""
    node = f"pat-{uuid.uuid4().hex[:6]}"
    job_id = f"{node}-monitor"
    post_job(job_id=job_id, nodes=[node], state="running", labels={"types": "monitor=a(?=b)"})
    log = services.process(clickhouse, "api").log_file
    wait_until(
        lambda: f"job {job_id} written; its monitor= type is not activated" in log.read_text(),
        10,
        "the API to log the refused monitor= type",
    )
