"""What every scheduler hook shares: the config file, the calls to the jobs API, the logging.

Runs on a scheduler host with the system python (>= 3.9, standard library only). A hook must
never hold up or fail a job because jobscope is down, slow or misconfigured: `run()` turns
every failure into one log line and the process always exits 0.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

DEFAULT_CONFIG_PATH = "/etc/jobscope/hook.env"
TIMEOUT_SECONDS = 5.0  # per attempt
ATTEMPTS = 2  # one retry, for network errors and 5xx answers only
RETRY_PAUSE_SECONDS = 0.5
# Keys the config file may hold; an environment variable of the same name wins over the file.
CONFIG_KEYS = (
    "JOBSCOPE_API_URL",  # e.g. http://jobscope.example.org:8000
    "JOBSCOPE_TOKEN",  # a token with the scheduler (or admin) role
    "JOBSCOPE_SITE",  # site name sent with every job; Slurm's cluster name when unset
    "JOBSCOPE_OARSTAT",  # OAR only: the oarstat command (default: oarstat)
    "JOBSCOPE_SYSLOG",  # "no" keeps failures out of syslog (stderr only)
    # the job report at job end (docs/report.md): where users open it, and where it goes
    "JOBSCOPE_REPORT_URL",  # the API's URL as users reach it (default: JOBSCOPE_API_URL)
    "JOBSCOPE_REPORT_ADMIN_COMMENT",  # Slurm: "yes" writes the report's URL as AdminComment
    "JOBSCOPE_REPORT_DIR",  # a folder: the end hook writes <dir>/<job id>.html there
    "JOBSCOPE_SCONTROL",  # Slurm: the scontrol command (default: scontrol)
    # Slurm: "yes" reads each node's CPU ids, GPU indexes and memory from
    # `scontrol show job -d` at job start (one more call to slurmctld per job)
    "JOBSCOPE_SLURM_ALLOCATIONS",
    # OAR: "yes" reads each node's CPU ids (resource property cpuset), GPU indexes and memory
    # from the job's resources at job start (`oarnodes -J --sql "resource_id IN (...)"`)
    "JOBSCOPE_OAR_ALLOCATIONS",
    "JOBSCOPE_OARNODES",  # OAR: the oarnodes command (default: oarnodes)
    "JOBSCOPE_OAR_GPU_PROPERTY",  # OAR: the resource property of a GPU's index (gpudevice)
    # OAR: a resource property in MB summed over the job's resources of a node as its
    # memory (e.g. memcore, where each core resource carries its share); unset: no memory
    "JOBSCOPE_OAR_MEMORY_PROPERTY",
    "JOBSCOPE_MAIL_PROG",  # slurm/jobscope_mail: the site's mail program (default /usr/bin/mail)
    "JOBSCOPE_MAIL_ATTACH",  # slurm/jobscope_mail: "yes" attaches the HTML report (mail -a)
)
REPORT_TIMEOUT_SECONDS = 30.0  # a report of a large job takes longer than a job's write


@dataclass
class Answer:
    """What the API answered: status 0 means no HTTP answer at all (`error` says why)."""

    status: int
    body: Any = None
    error: str = ""


class Hook:
    """One run of one hook: its name (for log lines), config and the job it reports."""

    def __init__(self, name: str, environ: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.environ = os.environ if environ is None else environ
        self.job_id = "?"
        self.config_path = self.environ.get("JOBSCOPE_HOOK_CONFIG") or DEFAULT_CONFIG_PATH
        self.config_missing = False
        self.config = self._load_config()

    # -- config ---------------------------------------------------------------------------

    def _load_config(self) -> dict[str, str]:
        """`NAME=value` lines of the config file, then environment variables over them."""
        values: dict[str, str] = {}
        try:
            with open(self.config_path, encoding="utf-8") as handle:
                values = parse_config(handle.read())
        except FileNotFoundError:
            self.config_missing = True  # the environment may hold everything
        except OSError as exc:
            self.log(f"cannot read config {self.config_path}: {exc.strerror or exc}")
        for key in CONFIG_KEYS:
            if self.environ.get(key):
                values[key] = self.environ[key]
        return values

    def setting(self, key: str, default: str = "") -> str:
        return self.config.get(key, "").strip() or default

    # -- logging --------------------------------------------------------------------------

    def log(self, message: str) -> None:
        """One line on stderr, and in syslog (daemon facility) unless JOBSCOPE_SYSLOG=no."""
        line = f"jobscope {self.name}: job {self.job_id}: {message}"
        try:  # None when started with fd 2 closed, as older slurmctld start their scripts
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except Exception:
            pass
        if getattr(self, "config", {}).get("JOBSCOPE_SYSLOG", "").lower() in ("no", "0", "false"):
            return
        try:
            import syslog

            syslog.openlog("jobscope-hook", syslog.LOG_PID, syslog.LOG_DAEMON)
            syslog.syslog(syslog.LOG_ERR, line)
        except Exception:  # no syslog module or socket: stderr is enough
            pass

    # -- API calls --------------------------------------------------------------------------

    def send(self, method: str, path: str, body: dict[str, Any]) -> Answer:
        """`method {JOBSCOPE_API_URL}{path}` with the JSON body; one retry if no answer or 5xx."""
        base = self.setting("JOBSCOPE_API_URL").rstrip("/")
        token = self.setting("JOBSCOPE_TOKEN")
        if not base or not token:
            missing = " and ".join(
                k for k, v in (("JOBSCOPE_API_URL", base), ("JOBSCOPE_TOKEN", token)) if not v
            )
            where = f"config file {self.config_path}" + (" missing" if self.config_missing else "")
            return Answer(0, error=f"{missing} not set ({where})")
        request = urllib.request.Request(
            base + path,
            data=json.dumps(body).encode(),
            method=method,
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
                "User-Agent": f"jobscope-hook/{self.name}",
            },
        )
        answer = Answer(0)
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(RETRY_PAUSE_SECONDS)
            answer = _urlopen(request)
            if answer.status and answer.status < 500:
                break
        if not answer.status:
            answer.error += f" after {ATTEMPTS} attempts"
        return answer

    def post_job(self, job: dict[str, Any]) -> bool:
        answer = self.send("POST", "/api/jobs", job)
        if answer.status in (200, 201, 202):
            return True
        self.report("POST /api/jobs", answer)
        return False

    def patch_job(self, job_id: str, changes: dict[str, Any]) -> Answer:
        """PATCH the job; the caller decides what a 404 means, other failures are logged."""
        answer = self.send("PATCH", "/api/jobs/" + urllib.parse.quote(job_id, safe=""), changes)
        if answer.status not in (200, 404):
            self.report(f"PATCH /api/jobs/{job_id}", answer)
        return answer

    def report(self, what: str, answer: Answer) -> None:
        """The one line saying why a call failed."""
        if not answer.status:
            self.log(f"{what} failed: {answer.error}; job not affected")
            return
        body = answer.body
        if isinstance(body, dict):  # jobscope answers {"error": ..., "parameter": ...}
            body = body.get("error") or body.get("detail") or json.dumps(body)
        detail = " ".join(str(body or "(no body)").split())[:300]
        hint = {
            401: "; check JOBSCOPE_TOKEN",
            403: "; the token needs the scheduler or admin role",
        }.get(answer.status, "")
        self.log(f"{what} answered {answer.status}: {detail}{hint}; job not affected")


def _urlopen(
    request: urllib.request.Request, timeout: float = TIMEOUT_SECONDS, raw: bool = False
) -> Answer:
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
            return Answer(response.status, body if raw else _json_or_text(body))
    except urllib.error.HTTPError as exc:
        try:
            body = _json_or_text(exc.read())
        except Exception:
            body = exc.reason
        return Answer(exc.code, body)
    except urllib.error.URLError as exc:
        reason = exc.reason
        text = getattr(reason, "strerror", None) or str(reason)
        return Answer(0, error=f"cannot reach {request.full_url} ({text})")
    except (TimeoutError, socket.timeout):  # distinct classes before Python 3.10
        return Answer(0, error=f"no answer from {request.full_url} in {TIMEOUT_SECONDS:g} s")
    except Exception as exc:  # malformed URL, connection reset, ...
        return Answer(0, error=f"{request.full_url}: {type(exc).__name__}: {exc}")


# -- the job report at job end: its URL in the job (Slurm AdminComment), a copy in a folder ----


def report_url(hook: Hook, job_id: str) -> str:
    """Where users open the job's report (JOBSCOPE_REPORT_URL, else JOBSCOPE_API_URL)."""
    base = hook.setting("JOBSCOPE_REPORT_URL") or hook.setting("JOBSCOPE_API_URL")
    return f"{base.rstrip('/')}/api/jobs/{urllib.parse.quote(job_id, safe='')}/report"


def report_file_name(job_id: str) -> str:
    """`<job id>.html` with every character but letters, digits, `_`, `+`, `-` and inner dots
    replaced: the name stays inside the folder whatever the id holds."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "_+-.") else "_" for c in job_id)
    return (safe.lstrip(".") or "_") + ".html"


def fetch_report(hook: Hook, job_id: str, fmt: str = "html") -> bytes | None:
    """The job's report from the API with the hook's token, or None (logged)."""
    base = hook.setting("JOBSCOPE_API_URL").rstrip("/")
    token = hook.setting("JOBSCOPE_TOKEN")
    if not base or not token:
        hook.log("JOBSCOPE_API_URL or JOBSCOPE_TOKEN not set: no report fetched")
        return None
    path = f"/api/jobs/{urllib.parse.quote(job_id, safe='')}/report?format={fmt}"
    request = urllib.request.Request(
        base + path,
        headers={"Authorization": f"Bearer {token}", "User-Agent": f"jobscope-hook/{hook.name}"},
    )
    answer = _urlopen(request, REPORT_TIMEOUT_SECONDS, raw=True)
    if answer.status != 200:
        if isinstance(answer.body, bytes):
            answer.body = _json_or_text(answer.body)
        hook.report(f"GET {path}", answer)
        return None
    return answer.body


def write_report_file(hook: Hook, job_id: str) -> str | None:
    """With JOBSCOPE_REPORT_DIR: the HTML report written to `<dir>/<job id>.html` (through a
    temporary file, so a reader never sees half a report); its path, or None."""
    folder = hook.setting("JOBSCOPE_REPORT_DIR")
    if not folder:
        return None
    body = fetch_report(hook, job_id)
    if body is None:
        return None
    path = os.path.join(folder, report_file_name(job_id))
    partial = f"{path}.{os.getpid()}.tmp"
    try:
        with open(partial, "wb") as handle:
            handle.write(body)
        os.replace(partial, path)
    except OSError as exc:
        hook.log(f"cannot write the report to {path}: {exc.strerror or exc}")
        return None
    return path


def slurm_admin_comment(hook: Hook, slurm_id: str, text: str) -> None:
    """`scontrol update JobId=<id> AdminComment=<text>` (slurmctld's user may set it)."""
    command = shlex.split(hook.setting("JOBSCOPE_SCONTROL", "scontrol"))
    run_tool(hook, [*command, "update", f"JobId={slurm_id}", f"AdminComment={text}"])


def publish_report(hook: Hook, job_id: str, slurm_id: str = "") -> None:
    """What the config asks for at job end: the report's URL as the Slurm job's AdminComment
    (with `slurm_id`), its HTML in JOBSCOPE_REPORT_DIR."""
    if slurm_id and hook.setting("JOBSCOPE_REPORT_ADMIN_COMMENT").lower() in ("yes", "1", "true"):
        slurm_admin_comment(hook, slurm_id, report_url(hook, job_id))
    write_report_file(hook, job_id)


def _json_or_text(raw: bytes) -> Any:
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_config(text: str) -> dict[str, str]:
    """`NAME=value` lines; `#` starts a comment line; `export ` and quotes around values allowed."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        name, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[name.strip()] = value
    return values


def now_iso() -> str:
    """The current time, ISO 8601 in UTC."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def unix_to_iso(value: Any) -> str | None:
    """Unix seconds (int or digits) as ISO 8601 UTC; None for empty, zero or not a number."""
    try:
        seconds = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    if seconds <= 0:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


# -- Slurm: PrologSlurmctld / EpilogSlurmctld environment ------------------------------------

# Environment variables slurmctld gives both scripts, kept as labels (when set and not empty).
SLURM_LABELS = (
    ("SLURM_JOB_NAME", "name"),
    ("SLURM_JOB_ID", "slurm_job_id"),
    ("SLURM_JOB_GROUP", "group"),
    ("SLURM_JOB_CONSTRAINTS", "constraints"),
    ("SLURM_JOB_RESERVATION", "reservation"),
    ("SLURM_JOB_QOS", "qos"),
    ("SLURM_WCKEY", "wckey"),
    ("SLURM_JOB_LICENSES", "licenses"),
    ("SLURM_JOB_RESTART_COUNT", "restart_count"),
    ("SLURM_ARRAY_JOB_ID", "array_job_id"),
    ("SLURM_ARRAY_TASK_ID", "array_task_id"),
    ("SLURM_HET_JOB_ID", "het_job_id"),
    ("SLURM_PACK_JOB_ID", "het_job_id"),  # name before Slurm 20.02
    ("SLURM_HET_JOB_OFFSET", "het_job_offset"),
    ("SLURM_PACK_JOB_OFFSET", "het_job_offset"),
)


def slurm_job_id(env: Mapping[str, str]) -> str:
    """The id as Slurm prints it: `1234_5` for an array task, `1234+0` for a hetjob component."""
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    het_job = env.get("SLURM_HET_JOB_ID") or env.get("SLURM_PACK_JOB_ID")
    het_offset = env.get("SLURM_HET_JOB_OFFSET") or env.get("SLURM_PACK_JOB_OFFSET")
    if het_job and het_offset:
        return f"{het_job}+{het_offset}"
    return env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""


def slurm_job(hook: Hook) -> dict[str, Any]:
    """The job as the Slurm environment describes it (no start, end or state)."""
    env = hook.environ
    nodes = env.get("SLURM_JOB_NODELIST", "").strip()
    labels = {"scheduler": "slurm"}
    for variable, label in SLURM_LABELS:
        if env.get(variable, "").strip() and label not in labels:
            labels[label] = env[variable].strip()
    return {
        "job_id": slurm_job_id(env),
        "user": env.get("SLURM_JOB_USER", ""),
        "project": env.get("SLURM_JOB_ACCOUNT", ""),
        "queue": env.get("SLURM_JOB_PARTITION", ""),
        # a hostlist expression such as node-[1-4,7]: the API expands it
        "nodes": nodes if nodes and nodes != "(null)" else [],
        "site": hook.setting("JOBSCOPE_SITE") or env.get("SLURM_CLUSTER_NAME", ""),
        "labels": labels,
    }


# Where slurmctld or slurmd says which GPUs a job holds, most precise first: a list of
# indexes (`0,1`) or UUIDs. `NoDevFiles`: GRES without device files.
SLURM_GPU_VARIABLES = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES")
# `scontrol show job -d`: one line per group of nodes given the same, e.g.
#      Nodes=gpu-[01-02] CPU_IDs=0-15,32 Mem=64000 GRES=gpu:a100:2(IDX:0-1)
_DETAIL_LINE = re.compile(r"^\s*Nodes=(\S+)\s+CPU_IDs=(\S+)(.*)$", re.M)
_DETAIL_MEM = re.compile(r"\bMem=(\d+)\b")
_GPU_IDX = re.compile(r"\bgpu(?::[^:(),\s]+)*\(IDX:([0-9,\-]+)\)")


MAX_CPU_ID, MAX_GPUS, MAX_GPU_INDEX, MAX_MEMORY_MB = 65_535, 256, 4095, 1 << 40
"""The API's limits (kafka/allocations.py; the hooks load nothing of jobscope): one value past
them would make the API refuse the whole job, so such a value is left out here instead."""


def is_number(text: str) -> bool:
    """ASCII digits only (`str.isdigit` also takes `²`, which `int` refuses)."""
    return re.fullmatch(r"[0-9]{1,10}", text) is not None


def index_list(text: str) -> list[str]:
    """`0-1,3` as ["0", "1", "3"]; [] if it is not such a list (or holds over 4096 ids, or
    one above MAX_CPU_ID)."""
    ids: list[str] = []
    for item in text.split(","):
        first, _, last = item.strip().partition("-")
        if not is_number(first) or (last and not is_number(last)):
            return []
        end = int(last or first)
        if end < int(first) or end > MAX_CPU_ID or end - int(first) + len(ids) >= 4096:
            return []
        ids += [str(i) for i in range(int(first), end + 1)]
    return ids


def slurm_env_gpus(env: Mapping[str, str]) -> dict[str, list[str]]:
    """The GPUs the environment names: {"gpus": [...]} (indexes) or {"gpu_uuids": [...]}."""
    for variable in SLURM_GPU_VARIABLES:
        value = env.get(variable, "").strip()
        if not value or value == "NoDevFiles":
            continue
        indexes = index_list(value)
        if indexes:
            return {"gpus": indexes}
        uuids = [u.strip() for u in value.split(",") if u.strip()]
        if all(re.fullmatch(r"(GPU|MIG)-[A-Za-z0-9_./:-]{1,124}", u) for u in uuids):
            return {"gpu_uuids": uuids}
    return {}


def parse_scontrol_detail(text: str) -> dict[str, dict[str, Any]]:
    """Per node group (a hostlist expression, which the API expands) of `scontrol show job -d`
    output: {"cpus": CPU_IDs, "gpus": [indexes], "memory_mb": Mem}. CPU_IDs are Slurm's
    abstract ids, the OS's where the node's CPU layout is declared as the OS numbers it."""
    out: dict[str, dict[str, Any]] = {}
    for nodes, cpu_ids, rest in _DETAIL_LINE.findall(text):
        entry: dict[str, Any] = {}
        if index_list(cpu_ids):
            entry["cpus"] = cpu_ids
        gpus = [i for found in _GPU_IDX.findall(rest) for i in index_list(found)]
        if gpus:
            entry["gpus"] = gpus
        memory = _DETAIL_MEM.search(rest)
        if memory:
            entry["memory_mb"] = int(memory[1])
        if entry:
            out[nodes] = entry
    return out


def slurm_allocations(hook: Hook, job: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """What the job holds inside its nodes: from `scontrol show job -d` when the config asks
    for it (JOBSCOPE_SLURM_ALLOCATIONS=yes), else (or if it says nothing) the GPUs of the
    environment, for a one-node job only (the variables do not say which node)."""
    if hook.setting("JOBSCOPE_SLURM_ALLOCATIONS").lower() == "yes":
        command = shlex.split(hook.setting("JOBSCOPE_SCONTROL", "scontrol"))
        env_id = hook.environ.get("SLURM_JOB_ID") or str(job["job_id"])
        stdout = run_tool(hook, [*command, "show", "job", "-d", env_id])
        detail = parse_scontrol_detail(stdout.decode("utf-8", "replace")) if stdout else {}
        if detail:
            return detail
    nodes = job.get("nodes")
    one_node = isinstance(nodes, str) and nodes and not any(c in nodes for c in "[],")
    gpus = slurm_env_gpus(hook.environ)
    return {str(nodes): gpus} if one_node and gpus else {}


def slurm_job_failed(env: Mapping[str, str]) -> bool:
    """Whether the job script ended with a non-zero exit code or was killed by a signal.

    SLURM_JOB_EXIT_CODE is the wait() status of the batch script (or salloc);
    SLURM_JOB_EXIT_CODE2 the same as `exit:signal`. Both only exist in EpilogSlurmctld.
    """
    status = env.get("SLURM_JOB_EXIT_CODE", "").strip()
    if status.isdigit():
        return int(status) != 0
    code2 = env.get("SLURM_JOB_EXIT_CODE2", "").strip()
    return any(part.strip() not in ("", "0") for part in code2.split(":"))


# -- OAR: server prologue / epilogue, job described by `oarstat -f -j <id> -J` -------------

OARSTAT_TIMEOUT_SECONDS = 15
# where a scheduler daemon that runs us without PATH (OAR 3 does) keeps oarstat
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def run_tool(hook: Hook, argv: list[str]) -> bytes | None:
    """A scheduler's command (oarstat, scontrol) run with a bounded time: its standard
    output, or None when it could not run or failed (logged with its standard error)."""
    env = dict(os.environ)
    env.setdefault("PATH", DEFAULT_PATH)
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, timeout=OARSTAT_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        hook.log(f"cannot run {' '.join(argv)}: {exc}")
        return None
    if done.returncode != 0:
        stderr = " ".join(done.stderr.decode("utf-8", "replace").split())[:300]
        hook.log(f"{' '.join(argv)} exited {done.returncode}: {stderr}")
        return None
    return done.stdout


def oarstat(hook: Hook, job_id: str) -> dict[str, Any] | None:
    """The job's entry in `oarstat -f -j <id> -J` (OAR 2.5 field names), or None (logged)."""
    command = shlex.split(hook.setting("JOBSCOPE_OARSTAT", "oarstat"))
    argv = [*command, "-f", "-j", job_id, "-J"]
    stdout = run_tool(hook, argv)
    if stdout is None:
        return None
    try:
        document = json.loads(stdout.decode("utf-8", "replace"))
    except ValueError as exc:
        hook.log(f"{' '.join(argv)} printed no JSON document: {exc}")
        return None
    entry = document.get(job_id) if isinstance(document, dict) else None
    if entry is None and isinstance(document, dict) and len(document) == 1:
        entry = next(iter(document.values()))
    if not isinstance(entry, dict):
        hook.log(f"{' '.join(argv)} printed no entry for job {job_id}")
        return None
    return entry


def oar_job(hook: Hook, job_id: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """The job as oarstat describes it, start included (no end, no state)."""
    types = entry.get("types") or []
    labels = {"scheduler": "oar"}
    if entry.get("name"):
        labels["name"] = str(entry["name"])
    if types:
        labels["types"] = ",".join(str(t) for t in types)
    fields = ["jobType", "reservation", "resubmit_job_id"]
    if str(entry.get("array_id", job_id)) != job_id:  # a job alone is an array of itself
        fields += ["array_id", "array_index"]
    for field in fields:
        value = entry.get(field)
        if value not in (None, "", "None", 0, "0"):
            labels[field] = str(value)
    hosts = entry.get("assigned_network_address") or []
    return {
        "job_id": job_id,
        "user": str(entry.get("owner") or entry.get("job_user") or entry.get("user") or ""),
        "project": str(entry.get("project") or ""),
        "queue": str(entry.get("queue") or entry.get("queue_name") or ""),
        "nodes": list(dict.fromkeys(str(h) for h in hosts)) if isinstance(hosts, list) else [],
        "start": unix_to_iso(entry.get("startTime", entry.get("start_time"))),
        "site": hook.setting("JOBSCOPE_SITE"),
        "labels": labels,
    }


def oar_stop_time(entry: Mapping[str, Any]) -> str | None:
    return unix_to_iso(entry.get("stopTime", entry.get("stop_time")))


OAR_GPU_PROPERTY = "gpudevice"
_PROPERTY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def oar_resource_rows(document: Any) -> list[dict[str, Any]]:
    """The resources `oarnodes -J` printed: OAR 2.5 an object by resource id of rows, OAR 3
    a list of rows; a row's properties are its own keys (or under `properties`)."""
    rows = list(document.values()) if isinstance(document, dict) else document
    out: list[dict[str, Any]] = []
    if not isinstance(rows, list):
        return out
    for row in rows:
        if isinstance(row, dict):
            nested = row.get("properties")
            out.append({**row, **nested} if isinstance(nested, dict) else dict(row))
    return out


def oar_allocations(
    rows: list[dict[str, Any]],
    resource_ids: set[str],
    gpu_property: str = OAR_GPU_PROPERTY,
    memory_property: str = "",
) -> dict[str, dict[str, Any]]:
    """Per node (network_address), the union of the job's resources' `cpuset` ids and GPU
    indexes, and the sum of their memory property: what OAR's cpuset manager gives the job.
    A node where one resource's cpuset (GPU, memory) is not one leaves that key out."""
    found: dict[str, dict[str, list[Any]]] = {}
    for row in rows:
        rid = str(row.get("resource_id", row.get("id", "")))
        node = str(row.get("network_address") or "")
        if rid not in resource_ids or not node or row.get("type", "default") != "default":
            continue
        values = found.setdefault(node, {"cpus": [], "gpus": [], "memory_mb": []})
        values["cpus"].append(row.get("cpuset"))
        values["gpus"].append(row.get(gpu_property))
        if memory_property:
            values["memory_mb"].append(row.get(memory_property))
    return {node: entry for node, v in found.items() if (entry := _oar_node_entry(v))}


def _oar_node_entry(values: dict[str, list[Any]]) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    cpus = [index_list(str(c).strip()) for c in values["cpus"]]
    if cpus and all(cpus):
        ids = sorted({int(i) for found in cpus for i in found})
        entry["cpus"] = ",".join(str(i) for i in ids)
    gpus = [str(g).strip() for g in values["gpus"] if g not in (None, "")]
    held = set(gpus)
    if (
        held
        and len(held) <= MAX_GPUS
        and all(is_number(g) and int(g) <= MAX_GPU_INDEX for g in held)
    ):
        entry["gpus"] = sorted(held, key=int)
    memory = [str(m).strip() for m in values["memory_mb"]]
    if memory and all(is_number(m) for m in memory) and sum(map(int, memory)) <= MAX_MEMORY_MB:
        entry["memory_mb"] = sum(map(int, memory))
    return entry


def oar_job_allocations(hook: Hook, entry: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The job's allocations when the config asks for them (JOBSCOPE_OAR_ALLOCATIONS=yes), from
    the properties of its assigned resources; {} (logged, if oarnodes failed) otherwise."""
    if hook.setting("JOBSCOPE_OAR_ALLOCATIONS").lower() != "yes":
        return {}
    ids = {str(r) for r in entry.get("assigned_resources") or [] if is_number(str(r))}
    properties = [
        hook.setting("JOBSCOPE_OAR_GPU_PROPERTY", OAR_GPU_PROPERTY),
        hook.setting("JOBSCOPE_OAR_MEMORY_PROPERTY"),
    ]
    bad = [name for name in properties if name and not _PROPERTY_NAME.fullmatch(name)]
    if bad:
        hook.log(f"{bad[0]!r} is not an OAR property name: no allocations sent")
        return {}
    if not ids:
        return {}
    command = shlex.split(hook.setting("JOBSCOPE_OARNODES", "oarnodes"))
    where = f"resource_id IN ({','.join(sorted(ids, key=int))})"
    stdout = run_tool(hook, [*command, "-J", "--sql", where])
    if stdout is None:
        return {}
    try:
        document = json.loads(stdout.decode("utf-8", "replace"))
    except ValueError as exc:
        hook.log(f"oarnodes printed no JSON document: {exc}; no allocations sent")
        return {}
    return oar_allocations(oar_resource_rows(document), ids, *properties)


def run(name: str, main: Callable[[Hook], None]) -> None:
    """Run `main(hook)`; whatever happens, log it in one line and exit 0."""
    hook: Hook | None = None
    try:
        hook = Hook(name)
        main(hook)
    except BaseException as exc:  # a hook must not fail the job, whatever went wrong
        message = f"unexpected {type(exc).__name__}: {exc}; job not affected"
        try:
            if hook is not None:
                hook.log(message)
            else:
                sys.stderr.write(f"jobscope {name}: {message}\n")
        except BaseException:
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(0)  # not sys.exit: Python exits 120 when it cannot flush a closed stderr
