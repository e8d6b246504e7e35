"""Slurm's PrologSlurmctld / EpilogSlurmctld hooks, run as slurmctld runs them (the script
alone, the job in the environment, no PATH), against the real API of the test stack."""

from __future__ import annotations

import random
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

from stack.config import REPO_ROOT

PROLOG = REPO_ROOT / "schedulers" / "slurm" / "slurm_prolog_slurmctld"
EPILOG = REPO_ROOT / "schedulers" / "slurm" / "slurm_epilog_slurmctld"
NODELIST = "node-[1-4,7],gpu-[01-05]"
NODES = [*(f"node-{i}" for i in (1, 2, 3, 4, 7)), *(f"gpu-0{i}" for i in range(1, 6))]


def new_job_id() -> str:
    return str(random.randrange(10_000_000, 99_999_999))


def slurmctld_env(config: Path, job_id: str, context: str, **more: str) -> dict[str, str]:
    """What slurmctld puts in a PrologSlurmctld/EpilogSlurmctld environment (and nothing else:
    no PATH), plus where the hook's config is."""
    env = {
        "JOBSCOPE_HOOK_CONFIG": str(config),
        "SLURM_SCRIPT_CONTEXT": context,
        "SLURM_JOB_ID": job_id,
        "SLURM_JOBID": job_id,
        "SLURM_JOB_NAME": "lammps-bench",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": "1001",
        "SLURM_JOB_GROUP": "physics",
        "SLURM_JOB_GID": "1001",
        "SLURM_JOB_ACCOUNT": "climate",
        "SLURM_JOB_PARTITION": "batch",
        "SLURM_JOB_NODELIST": NODELIST,
        "SLURM_JOB_CONSTRAINTS": "ib",
        "SLURM_CLUSTER_NAME": "grenoble",
        "SLURM_JOB_OVERSUBSCRIBE": "NO",
    }
    if context == "epilog_slurmctld":
        env |= {
            "SLURM_JOB_EXIT_CODE": "0",
            "SLURM_JOB_EXIT_CODE2": "0:0",
            "SLURM_JOB_DERIVED_EC": "0",
        }
    return env | more


def times(job: dict) -> tuple[datetime | None, datetime | None]:
    def parse(value: object) -> datetime | None:
        return None if value is None else datetime.fromisoformat(str(value).replace("Z", "+00:00"))

    return parse(job["start"]), parse(job["end"])


def assert_quiet(done) -> None:
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr


def test_prolog_then_epilog(hook_config, run_hook, jobs) -> None:
    job_id = new_job_id()
    before = datetime.now(UTC).replace(microsecond=0)
    done, _ = run_hook(PROLOG, slurmctld_env(hook_config, job_id, "prolog_slurmctld"))
    assert_quiet(done)

    job = jobs.wait(job_id)
    assert job["job_id"] == job_id
    assert job["user"] == "alice"
    assert job["project"] == "climate"
    assert job["queue"] == "batch"
    assert job["site"] == "grenoble"
    assert sorted(job["nodes"]) == sorted(NODES) and len(job["nodes"]) == 10
    assert job["state"] == "running"
    start, end = times(job)
    assert before <= start <= datetime.now(UTC) and end is None
    assert job["labels"]["name"] == "lammps-bench"
    assert job["labels"]["group"] == "physics"
    assert job["labels"]["scheduler"] == "slurm"

    done, _ = run_hook(EPILOG, slurmctld_env(hook_config, job_id, "epilog_slurmctld"))
    assert_quiet(done)
    job = jobs.wait(job_id, lambda j: j["state"] != "running")
    assert job["state"] == "terminated"
    start_after, end = times(job)
    assert start_after == start  # the PATCH kept what the prolog sent
    assert start <= end <= datetime.now(UTC)
    assert sorted(job["nodes"]) == sorted(NODES) and job["user"] == "alice"
    assert job["labels"]["name"] == "lammps-bench" and job["labels"]["exit_code"] == "0:0"


def test_failed_job_ends_in_error(hook_config, run_hook, jobs) -> None:
    job_id = new_job_id()
    done, _ = run_hook(PROLOG, slurmctld_env(hook_config, job_id, "prolog_slurmctld"))
    assert_quiet(done)
    jobs.wait(job_id)
    # exit(1) of the batch script: wait() status 256, "1:0"
    failed = {"SLURM_JOB_EXIT_CODE": "256", "SLURM_JOB_EXIT_CODE2": "1:0"}
    done, _ = run_hook(EPILOG, slurmctld_env(hook_config, job_id, "epilog_slurmctld", **failed))
    assert_quiet(done)
    job = jobs.wait(job_id, lambda j: j["state"] != "running")
    assert job["state"] == "error"
    assert job["labels"]["exit_code"] == "1:0"


def test_array_task_and_hetjob_component_ids(hook_config, run_hook, jobs) -> None:
    """Slurm prints an array task as 1234_5 and a hetjob component as 1234+0: so does jobscope."""
    array_task = {"SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "5"}
    array_task |= {"SLURM_ARRAY_TASK_COUNT": "8", "SLURM_ARRAY_TASK_MIN": "1"}
    env = slurmctld_env(hook_config, "1240", "prolog_slurmctld", **array_task)
    done, _ = run_hook(PROLOG, env)
    assert_quiet(done)
    job = jobs.wait("1234_5")
    assert job["job_id"] == "1234_5"
    assert job["labels"]["slurm_job_id"] == "1240"
    assert job["labels"]["array_job_id"] == "1234" and job["labels"]["array_task_id"] == "5"

    het_base = new_job_id()
    component = {
        "SLURM_HET_JOB_ID": het_base,
        "SLURM_HET_JOB_OFFSET": "1",
        "SLURM_PACK_JOB_ID": het_base,
        "SLURM_PACK_JOB_OFFSET": "1",
        "SLURM_JOB_NODELIST": "gpu-[01-02]",
    }
    component_id = str(int(het_base) + 1)  # each component has a job id of its own
    env = slurmctld_env(hook_config, component_id, "prolog_slurmctld", **component)
    done, _ = run_hook(PROLOG, env)
    assert_quiet(done)
    job = jobs.wait(f"{het_base}+1")
    assert sorted(job["nodes"]) == ["gpu-01", "gpu-02"]
    # and the epilog finds it under the same id (PATCH /api/jobs/<id>+1, "+" escaped)
    env = slurmctld_env(hook_config, component_id, "epilog_slurmctld", **component)
    done, _ = run_hook(EPILOG, env)
    assert_quiet(done)
    assert jobs.wait(f"{het_base}+1", lambda j: j["state"] == "terminated")


def test_epilog_without_prolog_posts_the_whole_job(hook_config, run_hook, jobs) -> None:
    """The prolog's POST was lost: the PATCH answers 404 and the epilog POSTs everything."""
    job_id = new_job_id()
    assert jobs.get(job_id).status_code == 404
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=7)
    env = slurmctld_env(
        hook_config, job_id, "epilog_slurmctld", SLURM_JOB_START_TIME=str(int(started.timestamp()))
    )
    done, _ = run_hook(EPILOG, env)
    assert_quiet(done)
    job = jobs.wait(job_id)
    assert job["state"] == "terminated"
    assert job["user"] == "alice" and job["queue"] == "batch"
    assert sorted(job["nodes"]) == sorted(NODES)
    start, end = times(job)
    assert start == started
    assert started < end <= datetime.now(UTC)


def test_hooks_work_with_stdin_stdout_stderr_closed(hook_config, run_hook, jobs) -> None:
    """slurmctld (before slurmscriptd) closes every descriptor before exec'ing its scripts."""
    job_id = new_job_id()
    closed = ["/bin/sh", "-c", 'exec "$0" <&- >&- 2>&-']
    for script, context in ((PROLOG, "prolog_slurmctld"), (EPILOG, "epilog_slurmctld")):
        env = slurmctld_env(hook_config, job_id, context)
        done = subprocess.run([*closed, str(script)], env=env, timeout=30, check=False)
        assert done.returncode == 0
        job = jobs.wait(job_id, lambda j, c=context: c == "prolog_slurmctld" or j["end"])
    assert job["state"] == "terminated" and sorted(job["nodes"]) == sorted(NODES)
    # and a failure with nowhere to write still exits 0
    env = slurmctld_env(hook_config.parent / "missing.env", job_id, "prolog_slurmctld")
    done = subprocess.run([*closed, str(PROLOG)], env=env, timeout=30, check=False)
    assert done.returncode == 0


def test_unreachable_api_exits_0_quickly_with_one_clear_line(
    write_config, dead_url, run_hook
) -> None:
    config = write_config(dead_url, "some-token")
    for script, context in ((PROLOG, "prolog_slurmctld"), (EPILOG, "epilog_slurmctld")):
        done, seconds = run_hook(script, slurmctld_env(config, "4242", context))
        assert done.returncode == 0
        assert seconds < 5, f"{script.name} took {seconds:.1f} s with nothing listening"
        lines = done.stderr.splitlines()
        assert len(lines) == 1, done.stderr
        assert "job 4242" in lines[0] and "cannot reach" in lines[0] and dead_url in lines[0]
        assert "job not affected" in lines[0]


def test_wrong_token_exits_0_and_reports_401(write_config, api_url, run_hook, jobs) -> None:
    job_id = new_job_id()
    config = write_config(api_url, "not-a-jobscope-token")
    done, _ = run_hook(PROLOG, slurmctld_env(config, job_id, "prolog_slurmctld"))
    assert done.returncode == 0
    assert "answered 401: unknown token; check JOBSCOPE_TOKEN" in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1
    done, _ = run_hook(EPILOG, slurmctld_env(config, job_id, "epilog_slurmctld"))
    assert done.returncode == 0 and "401" in done.stderr, done.stderr
    assert jobs.get(job_id).status_code == 404  # nothing was stored


def test_job_refused_by_the_api_is_reported_with_the_field(hook_config, run_hook, jobs) -> None:
    job_id = new_job_id()
    env = slurmctld_env(hook_config, job_id, "prolog_slurmctld", SLURM_JOB_NODELIST="node-[1-")
    done, _ = run_hook(PROLOG, env)
    assert done.returncode == 0
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "answered 400" in lines[0] and "nodes" in lines[0], done.stderr
    assert jobs.get(job_id).status_code == 404


def test_broken_install_and_missing_config_still_exit_0(tmp_path, run_hook) -> None:
    """A hook copied without jobscope_hook.py, or without a config: a log line, exit 0."""
    alone = tmp_path / "slurm" / PROLOG.name
    alone.parent.mkdir()
    shutil.copy2(PROLOG, alone)
    done, _ = run_hook(alone, slurmctld_env(tmp_path / "hook.env", "77", "prolog_slurmctld"))
    assert done.returncode == 0
    assert "cannot load jobscope_hook.py" in done.stderr, done.stderr

    missing = tmp_path / "nowhere" / "hook.env"
    done, _ = run_hook(PROLOG, slurmctld_env(missing, "77", "prolog_slurmctld"))
    assert done.returncode == 0
    assert "JOBSCOPE_API_URL and JOBSCOPE_TOKEN not set" in done.stderr, done.stderr
    assert str(missing) in done.stderr
