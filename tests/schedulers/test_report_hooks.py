"""The job report at job end: the Slurm and OAR end hooks write the report's URL into the job
(Slurm's AdminComment) and its HTML into a folder; the MailProg wrapper adds the report to the
job-end mail. Hooks run as real processes against the real API.

Replaced, because they cannot run here: `scontrol` (it needs a slurmctld) by a stand-in that
records its arguments; the site's mail program by one that records its arguments and body.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from stack.config import REPO_ROOT
from tests.schedulers.test_oar_hooks import FakeOarstat, oar_server_env
from tests.schedulers.test_oar_hooks import new_job_id as new_oar_job_id
from tests.schedulers.test_slurm_hooks import (
    EPILOG,
    PROLOG,
    assert_quiet,
    new_job_id,
    slurmctld_env,
)

OAR_EPILOGUE = REPO_ROOT / "schedulers" / "oar" / "oar_server_epilogue"
MAIL = REPO_ROOT / "schedulers" / "slurm" / "jobscope_mail"
sys.path.insert(0, str(REPO_ROOT / "schedulers"))
import jobscope_hook  # noqa: E402 (the hooks' own module, as they load it)

RECORDER = """#!{python}
# Stands in for {what} (it cannot run here): records its arguments and standard input.
import json, sys
with open({log!r}, "a") as out:
    out.write(json.dumps({{"argv": sys.argv[1:], "stdin": sys.stdin.read()}}) + "\\n")
"""


def recorder(directory: Path, name: str, what: str) -> tuple[Path, Path]:
    """An executable recording each call to `<directory>/<name>.calls`; (program, log)."""
    log = directory / f"{name}.calls"
    program = directory / name
    program.write_text(RECORDER.format(python=sys.executable, what=what, log=str(log)))
    program.chmod(0o755)
    return program, log


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_slurm_epilog_writes_admin_comment_and_file(
    write_config, api_url: str, tokens: dict[str, str], run_hook, jobs, tmp_path: Path
) -> None:
    scontrol, log = recorder(tmp_path, "scontrol", "Slurm's scontrol")
    reports = tmp_path / "reports"
    reports.mkdir()
    config = write_config(
        api_url,
        tokens["JOBSCOPE_SCHEDULER_TOKEN"],
        JOBSCOPE_REPORT_ADMIN_COMMENT="yes",
        JOBSCOPE_REPORT_DIR=str(reports),
        JOBSCOPE_SCONTROL=str(scontrol),
    )
    job_id = new_job_id()
    assert_quiet(run_hook(PROLOG, slurmctld_env(config, job_id, "prolog_slurmctld"))[0])
    jobs.wait(job_id)
    assert_quiet(run_hook(EPILOG, slurmctld_env(config, job_id, "epilog_slurmctld"))[0])
    url = f"{api_url}/api/jobs/{job_id}/report"
    assert calls(log) == [
        {"argv": ["update", f"JobId={job_id}", f"AdminComment={url}"], "stdin": ""}
    ]
    page = (reports / f"{job_id}.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and f"job {job_id}" in page
    assert not [p for p in reports.iterdir() if p.suffix == ".tmp"]
    # the URL written into the job opens the report (the token of a reader of the job)
    headers = {"Authorization": f"Bearer {tokens['JOBSCOPE_ADMIN_TOKEN']}"}
    assert httpx.get(url, headers=headers, timeout=30).text.startswith("<!DOCTYPE html>")


def test_without_report_options_nothing_more_happens(
    hook_config, run_hook, jobs, tmp_path: Path
) -> None:
    job_id = new_job_id()
    assert_quiet(run_hook(PROLOG, slurmctld_env(hook_config, job_id, "prolog_slurmctld"))[0])
    jobs.wait(job_id)
    env = slurmctld_env(hook_config, job_id, "epilog_slurmctld", PATH=f"{tmp_path}:/usr/bin:/bin")
    _, log = recorder(tmp_path, "scontrol", "Slurm's scontrol")
    assert_quiet(run_hook(EPILOG, env)[0])
    assert calls(log) == []


def test_oar_epilogue_writes_the_file(
    write_config, api_url: str, tokens: dict[str, str], run_hook, jobs, tmp_path: Path
) -> None:
    oarstat = FakeOarstat(tmp_path / "oar")
    reports = tmp_path / "reports"
    reports.mkdir()
    config = write_config(
        api_url,
        tokens["JOBSCOPE_SCHEDULER_TOKEN"],
        JOBSCOPE_OARSTAT=str(oarstat.path),
        JOBSCOPE_REPORT_DIR=str(reports),
    )
    job_id = new_oar_job_id()
    oarstat.knows(job_id, startTime=1_780_000_000, stopTime=1_780_000_120, state="Finishing")
    done, _ = run_hook(OAR_EPILOGUE, oar_server_env(config), job_id)  # POSTs the whole job
    assert done.returncode == 0 and done.stderr == "", done.stderr
    page = (reports / f"{job_id}.html").read_text()
    assert f"jobscope report: job {job_id}" in page


def test_report_file_names_stay_in_their_folder() -> None:
    """The attack: a job id made of path parts. The file is still a name in the folder."""
    for job_id in ("../../etc/cron.d/x", "/abs", "..", "a/../../b", "x\x00y"):
        name = jobscope_hook.report_file_name(job_id)
        assert "/" not in name and "\x00" not in name and not name.startswith("."), name
    assert jobscope_hook.report_file_name("1234_5") == "1234_5.html"
    assert jobscope_hook.report_file_name("1234+0") == "1234+0.html"


@pytest.mark.parametrize("attach", [False, True])
def test_mail_wrapper_adds_the_report(
    write_config, api_url: str, tokens: dict[str, str], run_hook, jobs, tmp_path: Path, attach
) -> None:
    mail, log = recorder(tmp_path, "mail", "the site's mail program")
    extra = {"JOBSCOPE_MAIL_ATTACH": "yes"} if attach else {}
    config = write_config(
        api_url, tokens["JOBSCOPE_SCHEDULER_TOKEN"], JOBSCOPE_MAIL_PROG=str(mail), **extra
    )
    job_id = new_job_id()
    assert_quiet(run_hook(PROLOG, slurmctld_env(config, job_id, "prolog_slurmctld"))[0])
    jobs.wait(job_id)
    subject = f"Slurm Job_id={job_id} Name=lammps Ended, Run time 00:02:00, COMPLETED, ExitCode 0"
    env = {
        "JOBSCOPE_HOOK_CONFIG": str(config),
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_MAIL_TYPE": "Ended",
    }
    done, _ = run_hook(MAIL, env, "-s", subject, "alice@example.org")
    assert done.returncode == 0, done.stderr
    (call,) = calls(log)
    url = f"{api_url}/api/jobs/{job_id}/report"
    assert f"The jobscope report of job {job_id}: {url}" in call["stdin"]
    if attach:
        assert call["argv"][:2] == ["-s", subject] and call["argv"][2] == "-a"
        assert call["argv"][3].endswith(f"{job_id}.html") and call["argv"][4] == "alice@example.org"
        assert not Path(call["argv"][3]).exists()  # removed once mailed
    else:
        assert call["argv"] == ["-s", subject, "alice@example.org"]


def test_mail_goes_out_when_jobscope_is_down(
    write_config, dead_url: str, run_hook, tmp_path: Path
) -> None:
    """The site's mail is never lost: jobscope unreachable, the mail still goes, with the link."""
    mail, log = recorder(tmp_path, "mail", "the site's mail program")
    config = write_config(dead_url, "t", JOBSCOPE_MAIL_PROG=str(mail), JOBSCOPE_MAIL_ATTACH="yes")
    env = {
        "JOBSCOPE_HOOK_CONFIG": str(config),
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_MAIL_TYPE": "Failed",
    }
    done, _ = run_hook(MAIL, env, "-s", "Slurm Job_id=77 Failed", "bob")
    assert done.returncode == 0
    (call,) = calls(log)
    assert call["argv"] == ["-s", "Slurm Job_id=77 Failed", "bob"]
    assert f"{dead_url}/api/jobs/77/report" in call["stdin"]


def test_mail_of_a_job_start_is_left_alone(write_config, run_hook, tmp_path: Path) -> None:
    mail, log = recorder(tmp_path, "mail", "the site's mail program")
    config = write_config("http://127.0.0.1:9", "t", JOBSCOPE_MAIL_PROG=str(mail))
    env = {
        "JOBSCOPE_HOOK_CONFIG": str(config),
        "SLURM_JOB_ID": "78",
        "SLURM_JOB_MAIL_TYPE": "Began",
    }
    done, _ = run_hook(MAIL, env, "-s", "Slurm Job_id=78 Began", "bob")
    assert done.returncode == 0
    assert calls(log) == [{"argv": ["-s", "Slurm Job_id=78 Began", "bob"], "stdin": ""}]
