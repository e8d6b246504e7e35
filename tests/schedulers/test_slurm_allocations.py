"""What a Slurm job holds inside its nodes, as the hooks read it: the GPU variables of the
environment, and `scontrol show job -d`'s per-node `CPU_IDs=` / `GRES=gpu...(IDX:...)` lines.

No Slurm runs here: `data/scontrol_show_job_d.txt` is `scontrol show job -d` output in Slurm
23.x's layout (written after it, not captured from a cluster), printed by a stand-in
`scontrol`. The hooks themselves run as slurmctld runs them, against the real API."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stack.config import REPO_ROOT
from tests.schedulers.test_slurm_hooks import PROLOG, assert_quiet, new_job_id, slurmctld_env

sys.path.insert(0, str(REPO_ROOT / "schedulers"))
import jobscope_hook  # the hooks' own module, as they load it

SAMPLE = Path(__file__).parent / "data" / "scontrol_show_job_d.txt"
FROM_SAMPLE = {
    "gpu-01": {"cpus": "0-15", "gpus": ["0", "1"], "memory_mb": 64000},
    "gpu-02": {"cpus": "0-15", "gpus": ["0", "1"], "memory_mb": 64000},
    "gpu-03": {"cpus": "16-23,48-55", "gpus": ["3", "5"], "memory_mb": 32000},
}
"""What the API stores from the sample (node groups expanded, written canonically)."""


def test_scontrol_detail_lines_give_cpus_gpus_and_memory_per_node_group() -> None:
    assert jobscope_hook.parse_scontrol_detail(SAMPLE.read_text()) == {
        "gpu-[01-02]": {"cpus": "0-15", "gpus": ["0", "1"], "memory_mb": 64000},
        "gpu-03": {"cpus": "16-23,48-55", "gpus": ["3", "5"], "memory_mb": 32000},
    }
    # no GPUs, another GRES, a GRES without indexes
    line = "   Nodes=cpu-1 CPU_IDs=0-3 Mem=1000 GRES=shard:2(IDX:0),gpu:1(IDX:N/A)\n"
    assert jobscope_hook.parse_scontrol_detail(line) == {
        "cpu-1": {"cpus": "0-3", "memory_mb": 1000}
    }
    assert jobscope_hook.parse_scontrol_detail("JobId=1 JobName=x\n   NodeList=a\n") == {}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0"}, {"gpus": ["0", "1"]}),
        ({"SLURM_STEP_GPUS": "2-3"}, {"gpus": ["2", "3"]}),
        ({"CUDA_VISIBLE_DEVICES": "GPU-a1,GPU-b2"}, {"gpu_uuids": ["GPU-a1", "GPU-b2"]}),
        ({"SLURM_JOB_GPUS": "NoDevFiles"}, {}),
        ({"CUDA_VISIBLE_DEVICES": "0-99999"}, {}),  # bounded
        ({"CUDA_VISIBLE_DEVICES": "$(reboot)"}, {}),
        ({}, {}),
    ],
)
def test_gpu_variables(env: dict[str, str], expected: dict[str, list[str]]) -> None:
    assert jobscope_hook.slurm_env_gpus(env) == expected


def stand_in_scontrol(directory: Path) -> Path:
    """Prints the sample for `show job -d <id>` (it cannot run here: it needs a slurmctld)."""
    program = directory / "scontrol"
    program.write_text(f'#!/bin/sh\n[ "$1 $2 $3" = "show job -d" ] && exec cat {SAMPLE}\nexit 1\n')
    program.chmod(0o755)
    return program


def test_prolog_sends_scontrols_allocations(
    write_config, api_url: str, tokens: dict[str, str], run_hook, jobs, tmp_path: Path
) -> None:
    config = write_config(
        api_url,
        tokens["JOBSCOPE_SCHEDULER_TOKEN"],
        JOBSCOPE_SLURM_ALLOCATIONS="yes",
        JOBSCOPE_SCONTROL=str(stand_in_scontrol(tmp_path)),
    )
    job_id = new_job_id()
    env = slurmctld_env(config, job_id, "prolog_slurmctld", SLURM_JOB_NODELIST="gpu-[01-03]")
    assert_quiet(run_hook(PROLOG, env)[0])
    job = jobs.wait(job_id)
    got = {n: {k: v for k, v in a.items() if v is not None} for n, a in job["allocations"].items()}
    assert got == FROM_SAMPLE


def test_prolog_of_a_one_node_job_sends_its_environments_gpus(hook_config, run_hook, jobs) -> None:
    job_id = new_job_id()
    env = slurmctld_env(
        hook_config, job_id, "prolog_slurmctld", SLURM_JOB_NODELIST="gpu-04", SLURM_JOB_GPUS="2,3"
    )
    assert_quiet(run_hook(PROLOG, env)[0])
    assert jobs.wait(job_id)["allocations"]["gpu-04"]["gpus"] == ["2", "3"]


def test_prolog_without_scontrol_still_sends_the_job(
    write_config, api_url: str, tokens: dict[str, str], run_hook, jobs, tmp_path: Path
) -> None:
    config = write_config(
        api_url,
        tokens["JOBSCOPE_SCHEDULER_TOKEN"],
        JOBSCOPE_SLURM_ALLOCATIONS="yes",
        JOBSCOPE_SCONTROL=str(tmp_path / "no-such-scontrol"),
    )
    job_id = new_job_id()
    env = slurmctld_env(config, job_id, "prolog_slurmctld", SLURM_JOB_NODELIST="gpu-04")
    done, _ = run_hook(PROLOG, env)
    assert done.returncode == 0
    assert "cannot run" in done.stderr  # one line saying why; the job goes on
    assert jobs.wait(job_id)["allocations"] == {}
