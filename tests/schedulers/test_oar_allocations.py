"""What an OAR job holds inside its nodes, as the server hooks read it with
JOBSCOPE_OAR_ALLOCATIONS=yes: its assigned resources (`oarstat -f -j <id> -J`'s
`assigned_resources`) and their properties (`oarnodes -J --sql "resource_id IN (...)"`):
`cpuset` ids, the GPU index property (`gpudevice`, or the one configured), a memory property.

No OAR runs here: `data/oarnodes_J_sql.json` is what OAR 2.5's oarnodes prints for `-J --sql`
(OAR::IO::get_resources_info: `SELECT * FROM resources` rows by resource id, values as text,
Grid'5000-style properties `gpu` (a cluster-wide GPU id) and `gpudevice` (its index on the
node)), written after OAR's code, not captured from a cluster. Stand-ins print it for oarnodes
and a job document for oarstat (tests/schedulers/test_oar_hooks.py); the hooks run as bipbip
runs them, against the real API."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from stack.config import REPO_ROOT
from tests.schedulers.test_oar_hooks import (
    EPILOGUE,
    PROLOGUE,
    FakeOarstat,
    assert_quiet,
    new_job_id,
    oar_server_env,
)

sys.path.insert(0, str(REPO_ROOT / "schedulers"))
import jobscope_hook  # the hooks' own module, as they load it

SAMPLE = Path(__file__).parent / "data" / "oarnodes_J_sql.json"
HOSTS = ["grouille-1.nancy.grid5000.fr", "grouille-2.nancy.grid5000.fr"]
RESOURCES = list(range(1001, 1026))  # 16 cores of grouille-1, 8 and a disk of grouille-2
EXPECTED = {
    "grouille-1": {"cpus": "0-15", "gpus": ["0", "1"]},
    "grouille-2": {"cpus": "32-39", "gpus": ["2"]},
}
"""What the API stores from the sample (short names, canonical form); the disk resource
(type disk, cpuset 0) adds nothing."""


def rows() -> list[dict[str, object]]:
    return jobscope_hook.oar_resource_rows(json.loads(SAMPLE.read_text()))


def test_resources_give_cpusets_gpu_indexes_and_memory_per_node() -> None:
    ids = {str(r) for r in RESOURCES}
    assert jobscope_hook.oar_allocations(rows(), ids, "gpudevice", "memcore") == {
        HOSTS[0]: {"cpus": ",".join(map(str, range(16))), "gpus": ["0", "1"], "memory_mb": 65536},
        HOSTS[1]: {"cpus": ",".join(map(str, range(32, 40))), "gpus": ["2"], "memory_mb": 32768},
    }
    # only the job's resources count: 4 cores of grouille-1 (one GPU's half)
    assert jobscope_hook.oar_allocations(rows(), {"1001", "1002", "1003", "1004"}) == {
        HOSTS[0]: {"cpus": "0,1,2,3", "gpus": ["0"]}
    }


def test_oar_3s_list_and_a_site_named_gpu_property() -> None:
    """OAR 3's oarnodes prints a list of rows (the model's `id`, values typed); a site whose
    GPU index property is `gpu` says so (JOBSCOPE_OAR_GPU_PROPERTY)."""
    document = [
        {"id": 7, "type": "default", "network_address": "gpu-1", "cpuset": 4, "gpu": 1},
        {"id": 8, "type": "default", "network_address": "gpu-1", "cpuset": 5, "gpu": 1},
        {"id": 9, "type": "default", "network_address": "gpu-1", "cpuset": "6,38", "gpu": 2},
    ]
    got = jobscope_hook.oar_allocations(
        jobscope_hook.oar_resource_rows(document), {"7", "8", "9"}, "gpu"
    )
    assert got == {"gpu-1": {"cpus": "4,5,6,38", "gpus": ["1", "2"]}}


@pytest.mark.parametrize(
    "bad",
    [
        {"cpuset": "0-99999"},  # an expansion attack: no cpus for the node
        {"cpuset": "70000"},  # past the API's largest CPU id: it would refuse the whole job
        {"cpuset": "\u00b2"},  # a digit to str.isdigit, not to int()
        {"cpuset": "$(reboot)"},
        {"cpuset": None},
    ],
)
def test_a_node_with_one_bad_cpuset_sends_no_cpus(bad: dict[str, object]) -> None:
    """A wrong cpuset on one resource must not shrink the job's CPUs to the others: the node
    then has no CPU ids (whole node for per-CPU readings)."""
    changed = [r | bad if r["resource_id"] == "1001" else r for r in rows()]
    got = jobscope_hook.oar_allocations(changed, {str(r) for r in RESOURCES})
    assert got[HOSTS[0]] == {"gpus": ["0", "1"]}
    assert got[HOSTS[1]] == {"cpus": ",".join(map(str, range(32, 40))), "gpus": ["2"]}


@pytest.mark.parametrize("bad", ["\u00b2", "5000"])
def test_a_gpu_index_the_api_would_refuse_leaves_the_node_without_gpus(bad: str) -> None:
    """One GPU index the API refuses (not ASCII digits, above 4095) would lose the whole job
    at the API (422): the node is sent with its CPUs, without GPUs."""
    changed = [r | {"gpudevice": bad} if r["resource_id"] == "1001" else r for r in rows()]
    got = jobscope_hook.oar_allocations(changed, {str(r) for r in RESOURCES})
    assert got[HOSTS[0]] == {"cpus": ",".join(map(str, range(16)))}
    assert got[HOSTS[1]] == {"cpus": ",".join(map(str, range(32, 40))), "gpus": ["2"]}


def test_documents_that_are_not_oarnodes_output_give_nothing() -> None:
    for document in (None, 3, "x", [1, "a"], {"1": "x"}):
        assert jobscope_hook.oar_resource_rows(document) == []


STAND_IN_OARNODES = """#!/bin/sh
# Stands in for OAR's oarnodes (it needs an OAR server's database): records its arguments,
# one per line, and prints the sample for `-J --sql <clause>`.
printf '%s\\n' "$@" >> "$0.calls"
[ "$1" = "-J" ] && [ "$2" = "--sql" ] && [ "$#" = 3 ] && exec cat SAMPLE
echo "oarnodes: unexpected arguments" >&2
exit 2
"""


def stand_in_oarnodes(directory: Path) -> Path:
    program = directory / "oarnodes"
    program.write_text(STAND_IN_OARNODES.replace("SAMPLE", str(SAMPLE)))
    program.chmod(0o755)
    return program


def calls(program: Path) -> list[str]:
    log = program.with_name(program.name + ".calls")
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def oarnodes(tmp_path: Path) -> Path:
    return stand_in_oarnodes(tmp_path)


@pytest.fixture
def oarstat(tmp_path: Path) -> FakeOarstat:
    return FakeOarstat(tmp_path / "oar-bin")


@pytest.fixture
def oar_config(write_config, api_url, tokens, oarstat) -> Path:
    token = tokens["JOBSCOPE_SCHEDULER_TOKEN"]
    return write_config(api_url, token, JOBSCOPE_OARSTAT=str(oarstat.path))


def test_prologue_sends_the_resources_allocations(
    write_config, api_url, tokens, oarstat, oarnodes, run_hook, jobs
) -> None:
    """Only resource ids reach oarnodes' SQL clause: an id that is not one is dropped."""
    config = write_config(
        api_url,
        tokens["JOBSCOPE_SCHEDULER_TOKEN"],
        JOBSCOPE_OARSTAT=str(oarstat.path),
        JOBSCOPE_OAR_ALLOCATIONS="yes",
        JOBSCOPE_OARNODES=str(oarnodes),
    )
    job_id = new_job_id()
    assigned = [*RESOURCES, "1) OR (1=1"]
    oarstat.knows(job_id, assigned_network_address=HOSTS, assigned_resources=assigned)
    assert_quiet(run_hook(PROLOGUE, oar_server_env(config), job_id)[0])
    ids = ",".join(map(str, RESOURCES))
    assert calls(oarnodes) == ["-J", "--sql", f"resource_id IN ({ids})"]
    job = jobs.wait(job_id)
    got = {n: {k: v for k, v in a.items() if v is not None} for n, a in job["allocations"].items()}
    assert got == EXPECTED


def test_without_the_setting_oarnodes_is_not_run(
    oar_config, oarstat, oarnodes, run_hook, jobs
) -> None:
    job_id = new_job_id()
    oarstat.knows(job_id, assigned_network_address=HOSTS, assigned_resources=RESOURCES)
    assert_quiet(run_hook(PROLOGUE, oar_server_env(oar_config), job_id)[0])
    assert jobs.wait(job_id)["allocations"] == {}
    assert calls(oarnodes) == []


def test_a_failing_oarnodes_still_sends_the_job(
    write_config, api_url, tokens, oarstat, run_hook, jobs, tmp_path: Path
) -> None:
    """oarnodes fails: one log line, the job is sent without allocations; the epilogue, finding
    no job (the prologue's POST lost), POSTs the whole job with them."""
    config = write_config(
        api_url,
        tokens["JOBSCOPE_SCHEDULER_TOKEN"],
        JOBSCOPE_OARSTAT=str(oarstat.path),
        JOBSCOPE_OAR_ALLOCATIONS="yes",
        JOBSCOPE_OARNODES=str(tmp_path / "no-such-oarnodes"),
    )
    job_id = new_job_id()
    oarstat.knows(job_id, assigned_network_address=HOSTS, assigned_resources=RESOURCES)
    done, _ = run_hook(PROLOGUE, oar_server_env(config), job_id)
    assert done.returncode == 0
    assert len(done.stderr.splitlines()) == 1 and "cannot run" in done.stderr, done.stderr
    assert jobs.wait(job_id)["allocations"] == {}

    lost = new_job_id()
    oarstat.knows(lost, assigned_network_address=HOSTS, assigned_resources=RESOURCES)
    config = write_config(
        api_url,
        tokens["JOBSCOPE_SCHEDULER_TOKEN"],
        name="epilogue.env",
        JOBSCOPE_OARSTAT=str(oarstat.path),
        JOBSCOPE_OAR_ALLOCATIONS="yes",
        JOBSCOPE_OARNODES=str(stand_in_oarnodes(tmp_path)),
    )
    assert_quiet(run_hook(EPILOGUE, oar_server_env(config), lost)[0])
    job = jobs.wait(lost)
    got = {n: {k: v for k, v in a.items() if v is not None} for n, a in job["allocations"].items()}
    assert got == EXPECTED and job["state"] == "terminated"
