"""OAR's server prologue / epilogue hooks, run as OAR's bipbip runs them (the script with the
job id as argument, in the OAR server's environment), against the real API of the test stack.

The only thing mocked is `oarstat`, the scheduler's own command, which needs an OAR server and
its database: a stand-in prints the JSON document `oarstat -f -j <id> -J` prints (OAR 2.5
field names), from a file the test writes.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stack.config import REPO_ROOT

PROLOGUE = REPO_ROOT / "schedulers" / "oar" / "oar_server_prologue"
EPILOGUE = REPO_ROOT / "schedulers" / "oar" / "oar_server_epilogue"
HOSTS = [f"graphite-{i}.nancy.grid5000.fr" for i in (1, 2, 4)]
NODES = ["graphite-1", "graphite-2", "graphite-4"]  # the API keeps the short host name

FAKE_OARSTAT = """#!/bin/sh
# Stands in for OAR's oarstat (it needs an OAR server and its database): prints what
# `oarstat -f -j <id> -J` prints, from job-<id>.json beside this script.
here=$(dirname "$0")
echo "$*" >> "$here/oarstat.calls"
if [ "$1" != "-f" ] || [ "$2" != "-j" ] || [ "$4" != "-J" ] || [ "$#" != 4 ]; then
    echo "oarstat: unexpected arguments: $*" >&2
    exit 2
fi
if [ ! -f "$here/job-$3.json" ]; then
    echo "oarstat: cannot connect to the database" >&2
    exit 1
fi
cat "$here/job-$3.json"
"""


class FakeOarstat:
    """The stand-in oarstat and the jobs it knows."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        self.directory = directory
        self.path = directory / "oarstat"
        self.path.write_text(FAKE_OARSTAT)
        self.path.chmod(0o755)

    def knows(self, job_id: str, **fields: object) -> None:
        """Make `oarstat -f -j <job_id> -J` print a job, as OAR 2.5 does, with `fields` changed."""
        now = int(datetime.now(UTC).timestamp())
        job = {
            "Job_Id": int(job_id),
            "array_id": int(job_id),
            "array_index": 1,
            "assigned_network_address": HOSTS,
            "assigned_resources": list(range(865, 913)),
            "command": "./bench.sh",
            "cpuset_name": f"bob_{job_id}",
            "dependencies": [],
            "events": [],
            "exit_code": None,
            "initial_request": "oarsub -q production -p graphite -l nodes=3 ./bench.sh",
            "jobType": "PASSIVE",
            "launchingDirectory": "/home/bob",
            "message": "R=48,W=1:0:0,J=B,N=bench,Q=production (Karma=0.021,quota_ok)",
            "name": "bench",
            "owner": "bob",
            "project": "ml-energy",
            "properties": "((cluster='graphite') AND production = 'YES') AND drain='NO'",
            "queue": "production",
            "reservation": "None",
            "resubmit_job_id": 0,
            "scheduledStart": now - 5,
            "startTime": now - 5,
            "state": "Launching",
            "stderr_file": f"OAR.{job_id}.stderr",
            "stdout_file": f"OAR.{job_id}.stdout",
            "stopTime": 0,
            "submissionTime": now - 40,
            "types": ["exotic", "monitor=wattmetre_power_watt"],
            "walltime": 3600,
            "wanted_resources": "-l \"{type = 'default'}/network_address=3,walltime=1:0:0\" ",
        } | fields
        document = json.dumps({job_id: job}, indent=3)
        (self.directory / f"job-{job_id}.json").write_text(document)

    def calls(self) -> list[str]:
        log = self.directory / "oarstat.calls"
        return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def oarstat(tmp_path: Path) -> FakeOarstat:
    return FakeOarstat(tmp_path / "oar-bin")


def oar_server_env(config: Path, **more: str) -> dict[str, str]:
    """The environment OAR 2.5's bipbip (started by the oar-server service, user oar) passes
    on to the server prologue and epilogue, plus where the hook's config is."""
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/var/lib/oar",
        "USER": "oar",
        "LOGNAME": "oar",
        "LANG": "C",
        "OARDIR": "/usr/lib/oar",
        "OARCONFFILE": "/etc/oar/oar.conf",
        "JOBSCOPE_HOOK_CONFIG": str(config),
    } | more


@pytest.fixture
def oar_config(write_config, api_url: str, tokens: dict[str, str], oarstat: FakeOarstat) -> Path:
    return write_config(
        api_url,
        tokens["JOBSCOPE_SCHEDULER_TOKEN"],
        JOBSCOPE_OARSTAT=str(oarstat.path),
        JOBSCOPE_SITE="nancy",
    )


def new_job_id() -> str:
    return str(random.randrange(1_000_000, 9_999_999))


def iso(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def parse(value: object) -> datetime | None:
    return None if value is None else datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def assert_quiet(done) -> None:
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr


def test_prologue_then_epilogue(oar_config, oarstat, run_hook, jobs) -> None:
    job_id = new_job_id()
    start = int(datetime.now(UTC).timestamp()) - 5
    oarstat.knows(job_id, startTime=start, state="Launching")
    done, _ = run_hook(PROLOGUE, oar_server_env(oar_config), job_id)
    assert_quiet(done)
    assert oarstat.calls() == [f"-f -j {job_id} -J"]

    job = jobs.wait(job_id)
    assert job["user"] == "bob"
    assert job["project"] == "ml-energy"
    assert job["queue"] == "production"
    assert job["site"] == "nancy"
    assert sorted(job["nodes"]) == NODES
    assert job["state"] == "running"
    assert parse(job["start"]) == iso(start) and job["end"] is None
    assert job["labels"]["name"] == "bench"
    assert job["labels"]["types"] == "exotic,monitor=wattmetre_power_watt"
    assert job["labels"]["scheduler"] == "oar" and job["labels"]["jobType"] == "PASSIVE"
    assert "array_id" not in job["labels"]  # a job alone is an array of itself in OAR

    stop = start + 4
    oarstat.knows(job_id, startTime=start, stopTime=stop, state="Finishing", exit_code=0)
    done, _ = run_hook(EPILOGUE, oar_server_env(oar_config), job_id)
    assert_quiet(done)
    job = jobs.wait(job_id, lambda j: j["state"] != "running")
    assert job["state"] == "terminated"
    assert parse(job["start"]) == iso(start) and parse(job["end"]) == iso(stop)
    assert sorted(job["nodes"]) == NODES and job["user"] == "bob"
    assert job["labels"]["exit_code"] == "0"


def test_array_job_in_error(oar_config, oarstat, run_hook, jobs) -> None:
    job_id = new_job_id()
    array = {"array_id": int(job_id) - 1, "array_index": 2}  # 2nd job of oarsub --array
    oarstat.knows(job_id, **array)
    done, _ = run_hook(PROLOGUE, oar_server_env(oar_config), job_id)
    assert_quiet(done)
    job = jobs.wait(job_id)
    assert job["labels"]["array_id"] == str(int(job_id) - 1)
    assert job["labels"]["array_index"] == "2"
    start = parse(job["start"])

    oarstat.knows(job_id, state="Error", stopTime=0, **array)  # no stop time: "now"
    done, _ = run_hook(EPILOGUE, oar_server_env(oar_config), job_id)
    assert_quiet(done)
    job = jobs.wait(job_id, lambda j: j["state"] != "running")
    assert job["state"] == "error"
    assert start <= parse(job["end"]) <= datetime.now(UTC)


def test_oarstat_failure_then_epilogue_posts_the_whole_job(
    write_config, api_url, tokens, oarstat, run_hook, jobs
) -> None:
    """oarstat fails in the prologue: one log line, exit 0, nothing sent; the epilogue's PATCH
    then answers 404 and the epilogue POSTs the whole job, start included. The oarstat command
    comes from the environment here (JOBSCOPE_OARSTAT), not from the config file."""
    config = write_config(api_url, tokens["JOBSCOPE_SCHEDULER_TOKEN"])
    env = oar_server_env(config, JOBSCOPE_OARSTAT=str(oarstat.path))
    job_id = new_job_id()
    done, _ = run_hook(PROLOGUE, env, job_id)
    assert done.returncode == 0
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "exited 1" in done.stderr and "cannot connect to the database" in done.stderr
    assert jobs.get(job_id).status_code == 404

    start = int(datetime.now(UTC).timestamp()) - 600
    oarstat.knows(job_id, startTime=start, stopTime=start + 590, state="Terminated")
    done, _ = run_hook(EPILOGUE, env, job_id)
    assert_quiet(done)
    job = jobs.wait(job_id)
    assert job["state"] == "terminated" and job["user"] == "bob"
    assert sorted(job["nodes"]) == NODES
    assert parse(job["start"]) == iso(start) and parse(job["end"]) == iso(start + 590)
    assert job["site"] == ""  # no JOBSCOPE_SITE in this config


def test_unreachable_api_exits_0_quickly(write_config, dead_url, oarstat, run_hook) -> None:
    config = write_config(dead_url, "some-token", JOBSCOPE_OARSTAT=str(oarstat.path))
    oarstat.knows("31337")
    for script in (PROLOGUE, EPILOGUE):
        done, seconds = run_hook(script, oar_server_env(config), "31337")
        assert done.returncode == 0
        assert seconds < 5, f"{script.name} took {seconds:.1f} s with nothing listening"
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert "job 31337" in done.stderr and "cannot reach" in done.stderr


def test_without_job_id_argument(write_config, dead_url, run_hook) -> None:
    config = write_config(dead_url, "some-token")
    for script in (PROLOGUE, EPILOGUE):
        done, _ = run_hook(script, oar_server_env(config))
        assert done.returncode == 0
        assert "called without a job id" in done.stderr, done.stderr
