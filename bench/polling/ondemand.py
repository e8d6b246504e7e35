"""`on_demand_activation_s`: from `POST /api/jobs/{id}/on-demand` to the first reading of the
activated metric stored in ClickHouse, through the whole stack (API -> on-demand topic ->
producers -> readings topic -> Kafka engine -> `metrics`). Goal: at most 5 s.

The producers poll `NODES` nodes, each with one optional metric every second beside one
always-polled metric; a job holds `JOB_NODES` of them. Each trial activates the job's
optional metric, waits for its first stored reading, then switches it off (DELETE) and
waits until no reading is stored any more before the next trial. An activation takes
effect at the metric's next aligned tick, so up to one period (1 s here) of the figure is
that wait: a metric polled every 10 s shows up to 10 s.
"""

from __future__ import annotations

import shutil
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.polling.producer import PollingStack, whole_stack
from stack.processes import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
NODES = 200
JOB_NODES = 20
PERIOD_MS = 1000
TRIALS = {True: 2, False: 10}
GOAL_S = 5.0
TIMEOUT_S = 60.0


def _devices(path: Path, prefix: str) -> Path:
    lines = []
    for i in range(NODES):
        node = f"{prefix}-{i}"
        base = f"name: od_base, device_id: {node}, url: 'tester://'"
        lines.append(f"- {{{base}, update_every: {PERIOD_MS}}}")
        lines.append(
            f"- {{name: od_extra, device_id: {node}, url: 'tester://?metrics=4', "
            f"update_every: {PERIOD_MS}, optional: true}}"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def measure(state_dir: Path, quick: bool, stack: PollingStack) -> dict[str, Any]:
    """The trials through `stack`, with a producer of this benchmark's own."""
    from stack import services

    prefix = f"od{uuid.uuid4().hex[:6]}"
    work = state_dir.resolve() / "ondemand"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with whole_stack(stack, _devices(work / "devices.yaml", prefix)) as settings:
        reader = services.clickhouse_client(settings, "reader")
        token = services.component_env(settings)["JOBSCOPE_ADMIN_TOKEN"]
        headers = {"Authorization": f"Bearer {token}"}
        job_id = f"{prefix}-job"
        nodes = [f"{prefix}-{i}" for i in range(JOB_NODES)]
        job = {"job_id": job_id, "nodes": nodes, "state": "running", "start": time.time()}
        api = settings.api_url
        httpx.post(f"{api}/api/jobs", json=job, headers=headers, timeout=30).raise_for_status()

        def stored(metric: str, since_us: int) -> int:
            return reader.command(
                "SELECT count() FROM metrics WHERE startsWith(device_id, {p:String}) "
                "AND metric_id LIKE {m:String} AND toUnixTimestamp64Micro(timestamp) > {s:Int64}",
                parameters={"p": prefix, "m": metric, "s": since_us},
            )

        wait_until(lambda: stored("od_base", 0) > 0, TIMEOUT_S, "the first readings")
        seconds = []
        for _ in range(TRIALS[quick]):
            began = time.time()
            httpx.post(
                f"{api}/api/jobs/{job_id}/on-demand",
                json={"metrics": "od_extra"},
                headers=headers,
                timeout=30,
            ).raise_for_status()
            wait_until(
                lambda b=began: stored("od_extra%", int(b * 1e6)) > 0,
                TIMEOUT_S,
                "the first activated reading",
                interval=0.02,
            )
            seconds.append(time.time() - began)
            httpx.delete(
                f"{api}/api/jobs/{job_id}/on-demand", headers=headers, timeout=30
            ).raise_for_status()
            off = time.time()
            wait_until(
                lambda o=off: (
                    stored("od_extra%", int((time.time() - 2) * 1e6)) == 0 and time.time() - o > 2
                ),
                TIMEOUT_S,
                "the activation to stop",
            )
    return {
        "on_demand_activation_s": statistics.median(seconds),
        "on_demand_activation_max_s": max(seconds),
        "on_demand": {
            "trials": len(seconds),
            "seconds": [round(s, 3) for s in seconds],
            "nodes": NODES,
            "job_nodes": JOB_NODES,
            "period_ms": PERIOD_MS,
            "goal_s": GOAL_S,
        },
    }
