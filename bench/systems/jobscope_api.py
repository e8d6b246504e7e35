"""jobscope's REST API on the bench's data (issue 7's figures), measured by jobscope.py.

Jobs are created with `POST /api/jobs` (the admin token of the stack's secrets) over the
bench's own data (past dates: the bench keeps 10 years of readings), then:
- `api_1m_<format>_s`: `GET /api/jobs/{id}/metrics?format=<format>` for ~100 devices x the
  span holding ~1,000,000 readings, received completely by an httpx client (median of the
  runs), readings counted (text formats: rows; Parquet, Arrow: pyarrow);
  `api_1m_readings_s`: the best format's (`api_1m_best_format`).
- `api_1m_direct_<format>_s`: the same SQL (the API's own functions: `scope_rows`,
  `projected`, the job's selection) in the same ClickHouse format, straight from
  ClickHouse as the API's read-only user, received completely in 1 MiB blocks; the
  overhead of the API = its time / the direct time, of the best API format.
- `api_summary_1m_readings_s`: `GET /api/jobs/{id}/summary` of that job computed from its raw
  readings (a running job's case); `api_summary_1m_record_s`: the same once its record
  exists (an ended job's case).
- `api_step_1m_s`: `GET /api/jobs/{id}/metrics?step=1m&agg=avg` of the same devices over the
  whole data set (served from the 1-minute rollup).
- `api_export_peak_rss_mb`: the API process's resident memory (VmRSS, sampled every 20 ms)
  while it exports a large job (10 M readings full, the whole quick data set) as NDJSON to
  a client that counts the rows and discards the bytes.
- `report_100_nodes_24h_s`: `GET /api/jobs/{id}/report?format=html` of a job of 100 nodes over
  24 hours (bench/systems/jobscope_report.py: ~2.9 M readings of two power sources and four
  key metrics, inserted after the step figure so that no timed part before shares the
  machine with its insert or its rollups' refresh), once the rollups' refresh has computed
  its minutes and the API its record, as a running stack would have; median of the runs
  (best beside it), the answer checked (a whole HTML report, its energy the PDU's, as the
  site's priority wants, within 1% of the bench's own integral).
  `report_100_nodes_24h_pdf_s`: the same as PDF.
"""

from __future__ import annotations

import io
import json
import logging
import math
import re
import statistics
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pyarrow.ipc
import pyarrow.parquet
from clickhouse_connect.driver.client import Client

from api import formats as api_formats
from api.footprint import annotated
from api.jobs import get_job
from api.queries.metrics import projected, scope_rows, stepped_rows
from api.report.text import energy_text
from api.scope import EVERYTHING, job_selection, with_aliases
from bench.dataset import US, Dataset, utc
from bench.profiles import FULL, QUICK
from bench.systems import jobscope_report, jobscope_rollups
from stack import secrets, services
from stack.config import StackSettings
from stack.processes import wait_until

log = logging.getLogger("bench.jobscope")

FORMATS = tuple(api_formats.FORMATS)  # json, ndjson, csv, parquet, arrow
# QUICK's 6 minutes: the default (json) and the two binary ones, the fastest in every run
QUICK_FORMATS = ("json", "parquet", "arrow")


def formats(quick: bool) -> tuple[str, ...]:
    """The API formats a run times: QUICK_FORMATS in a QUICK run, every one otherwise."""
    return QUICK_FORMATS if quick else FORMATS


JOB_READINGS = 1_000_000  # the scope of the job timed in every format
EXPORT_READINGS = 10_000_000  # the export watched for memory (capped by the data set)
EXPORT_FORMAT = "ndjson"
# Should the export fail, it is taken again with a job of this many nodes, so that there is
# a memory figure still (jobs of over ~190 nodes failed: their parameters went in a form).
FALLBACK_EXPORT_DEVICES = 150
RSS_INTERVAL_S = 0.02
READ_BLOCK = 1 << 20
TIMEOUT = 900.0
LIMIT_S = {True: 60.0, False: 300.0}  # one API fetch is abandoned after this (quick, full)
JOB_VISIBLE_S = 60.0  # a job answered 202 must be readable within this
# The rollups' refresh takes the buckets noted before the current minute (less 10 s), every
# 10 s: readings inserted now are rolled up within 80 s.
ROLLED_UP_S = 150.0
RECORDS_INTERVAL_S = 2.0
"""The API's JOBSCOPE_RECORDS_INTERVAL_S once records are on (each round computes at most
100 due jobs, the earliest ended first)."""
RECORDED_S = 180.0
RECORDED_SQL = "SELECT count() FROM job_records WHERE job_id = {job:String}"
MERGES_S = 60.0  # the insert's parts merged before anything is timed
ENERGY_TOLERANCE = 0.01  # the report's energy vs the bench's integral of the PDU readings

# Newlines of a body that are not rows: JSON's array ("[{..},\n...{..}\n]\n"), CSV's header.
EXTRA_NEWLINES = {"json": 1, "ndjson": 0, "csv": 1}
GOALS = {
    "api_1m_readings_s": 1.0,
    "api_1m_overhead_ratio": 1.2,
    "api_summary_1m_readings_s": 0.3,
    "api_step_server_s": 0.05,  # issue 32: step=1m from the rollups, JSON encoding apart
    "report_100_nodes_24h_s": 2.0,
}


class Abandoned(Exception):
    """A fetch that took longer than the run allows."""


def measure(
    settings: StackSettings,
    admin: Client,
    reader: Client,
    data: Dataset,
    quick: bool,
    restart_api: Callable[[dict[str, str]], None],
) -> dict[str, Any]:
    """Every figure above; the API must be running. A part that fails is recorded under
    `failed_measurements` (`api.<part>`), the others still run. `admin` inserts the report's
    data (`reader`, the API's read-only user, reads). The API runs without job records
    until `restart_api` (its settings) turns them on for the parts that time them."""
    spec = data.spec
    repeats = (QUICK if quick else FULL).repeats
    limit_s = LIMIT_S[quick]
    token = secrets.load_or_create(settings.state_dir)["JOBSCOPE_ADMIN_TOKEN"]
    out: dict[str, Any] = {}
    failed: dict[str, str] = {}

    # The ~1 M-reading job: 100 devices spread over the fleet, from the start of the data.
    devices = _spread(spec.devices, min(100, spec.devices))
    ticks = max(1, JOB_READINGS // (len(devices) * spec.metrics))
    end_us = spec.start_us + min(ticks * spec.period_s, spec.duration_s) * US  # exclusive
    job = _Job("bench-1m", data, devices, spec.start_us, end_us)
    # The same devices over the whole data set (step), and the large export.
    whole = _Job("bench-whole", data, devices, spec.start_us, spec.end_us)
    per_device = spec.ticks * spec.metrics
    export_devices = min(spec.devices, math.ceil(EXPORT_READINGS / per_device))
    export = _Job(
        "bench-export", data, _spread(spec.devices, export_devices), spec.start_us, spec.end_us
    )

    with _Http(settings) as http:
        for j in (job, whole, export):
            j.create(http, token)
        out["api_jobs"] = {j.job_id: j.describe() for j in (job, whole, export)}

        def part(name: str, run: Callable[[], dict[str, Any]]) -> None:
            log.info("jobscope: API, %s", name)
            try:
                out.update(run())
            except Exception as exc:
                log.error("jobscope: API, %s failed: %s", name, exc)
                failed[f"api.{name}"] = f"{type(exc).__name__}: {exc}"

        timed = formats(quick)
        part("formats", lambda: _formats(http, reader, job, timed, repeats, limit_s))
        part("devices", lambda: _devices_endpoint(http, job, limit_s))
        part("summary", lambda: _summary(http, reader, job, repeats, limit_s))
        part("step", lambda: _step(http, reader, whole, repeats, limit_s))
        part("report_data", lambda: _report_data(http, admin, token))
        pid = services.process(settings, "api").pid()
        part("export", lambda: _export(http, export, pid))
        if "api.export" in failed and len(export.devices) > FALLBACK_EXPORT_DEVICES:
            # Still a figure of the API's memory, from a job it can serve (recorded as such).
            small = _Job(
                "bench-export-fallback",
                data,
                _spread(spec.devices, FALLBACK_EXPORT_DEVICES),
                spec.start_us,
                spec.end_us,
            )
            small.create(http, token)
            out["api_jobs"][small.job_id] = small.describe()
            note = (
                f"the export of {export.readings:,} readings ({len(export.devices)} devices) "
                f"failed; these are the figures of {small.readings:,} readings "
                f"({len(small.devices)} devices)"
            )
            part("export_fallback", lambda: {**_export(http, small, pid), "api_export_note": note})
        # Job records from here on: computing them (the API's refresher) while the parts above
        # are timed would share the machine and the API's memory with them.
        restart_api({"JOBSCOPE_RECORDS_INTERVAL_S": str(RECORDS_INTERVAL_S)})
        part("summary_record", lambda: _summary_record(http, admin, job, repeats, limit_s))
        if "api.report_data" not in failed:
            part(
                "report",
                lambda: _report(http, admin, reader, repeats, limit_s, direct=not quick),
            )
    out["api_goals"] = GOALS
    if failed:
        out["failed_measurements"] = failed
    return out


def create_job(http: _Http, token: str, document: dict[str, Any]) -> float:
    """POST a job; wait until it can be read when answered 202. Seconds until readable."""
    began = time.monotonic()
    r = http.post("/api/jobs", json=document, headers={"Authorization": f"Bearer {token}"})
    http.check(r)
    visible = r.status_code == 201
    while not visible:  # 202: in Kafka, not yet in ClickHouse
        if time.monotonic() - began > JOB_VISIBLE_S:
            raise TimeoutError(f"job {document['job_id']} not readable after {JOB_VISIBLE_S:.0f} s")
        time.sleep(0.1)
        r = http.get(f"/api/jobs/{document['job_id']}")
        visible = r.status_code == 200 and len(r.json()["nodes"]) == len(document["nodes"])
    return time.monotonic() - began


class _Job:
    """A job of the bench: `devices` (indexes) over [start_us, end_us) of `data`."""

    def __init__(
        self, job_id: str, data: Dataset, devices: list[int], start_us: int, end_us: int
    ) -> None:
        self.job_id = job_id
        self.devices = devices
        self.nodes = [data.devices[i] for i in devices]
        self.start_us, self.end_us = start_us, end_us
        self.readings = data.count(devices, start_us, end_us)
        self.data = data

    def describe(self) -> dict[str, Any]:
        return {
            "devices": len(self.devices),
            "start": utc(self.start_us).isoformat(),
            "end": utc(self.end_us - 1).isoformat(),
            "readings": self.readings,
        }

    def create(self, http: _Http, token: str) -> None:
        """POST the job (terminated: its end is the data's last microsecond in its span,
        the API's end being inclusive); wait until it can be read when answered 202."""
        document = {
            "job_id": self.job_id,
            "user": "bench",
            "nodes": self.nodes,
            "start": utc(self.start_us).isoformat(),
            "end": utc(self.end_us - 1).isoformat(),
            "state": "terminated",
        }
        log.info(
            "jobscope: API, job %s: %d devices, %s readings, readable in %.2f s",
            self.job_id,
            len(self.nodes),
            f"{self.readings:,}",
            create_job(http, token, document),
        )


def _formats(
    http: _Http,
    reader: Client,
    job: _Job,
    formats: tuple[str, ...],
    repeats: int,
    limit_s: float,
) -> dict[str, Any]:
    """The job's readings in each of `formats`, through the API and straight from ClickHouse
    (alternately, so that both see the same caches); counts checked on every run."""
    selection = job_selection(get_job(reader, job.job_id), EVERYTHING)
    if selection is None:
        raise RuntimeError(f"job {job.job_id} has an empty scope")
    out: dict[str, Any] = {}
    api_runs: dict[str, Any] = {}
    direct_runs: dict[str, Any] = {}
    notes = []
    for name in formats:
        fmt = api_formats.FORMATS[name]
        params: dict[str, Any] = {}
        sql = projected(scope_rows(selection, params), fmt.timestamp, fmt.labels)
        api: list[float] = []
        direct: list[float] = []
        sizes: dict[str, int] = {}
        for _ in range(repeats):
            if name not in api_runs:
                try:
                    seconds, body = _get(
                        http, f"/api/jobs/{job.job_id}/metrics", {"format": name}, limit_s
                    )
                except Abandoned as exc:
                    notes.append(f"{name}: {exc}")
                    api_runs[name] = {"abandoned": str(exc)}
                else:
                    _check(f"API {name}", rows(name, body), job.readings)
                    api.append(seconds)
                    sizes["api_bytes"] = sum(map(len, body))
                    del body
            seconds, body = _direct(reader, sql, params, fmt.clickhouse)
            # ClickHouse's JSONEachRow: the API's json is that, made an array on the way.
            _check(f"direct {name}", rows("ndjson" if name == "json" else name, body), job.readings)
            direct.append(seconds)
            sizes["direct_bytes"] = sum(map(len, body))
            del body
        if api:
            api_runs[name] = {"runs": api, "bytes": sizes["api_bytes"]}
            out[f"api_1m_{name}_s"] = statistics.median(api)
        else:
            out[f"api_1m_{name}_s"] = None
        direct_runs[name] = {"runs": direct, "bytes": sizes["direct_bytes"]}
        out[f"api_1m_direct_{name}_s"] = statistics.median(direct)
        log.info(
            "jobscope: API, %s readings as %s: API %s s, ClickHouse directly %.3f s",
            f"{job.readings:,}",
            name,
            "n/a" if not api else f"{statistics.median(api):.3f}",
            statistics.median(direct),
        )
    by_format = {
        name: out[f"api_1m_{name}_s"] / out[f"api_1m_direct_{name}_s"]
        for name in formats
        if out[f"api_1m_{name}_s"] is not None
    }
    timed = {name: out[f"api_1m_{name}_s"] for name in by_format}
    best = min(timed, key=timed.__getitem__) if timed else None
    out.update(
        {
            "api_1m_readings_s": timed[best] if best else None,
            "api_1m_best_format": best,
            "api_1m_direct_s": out[f"api_1m_direct_{best}_s"] if best else None,
            "api_1m_overhead_ratio": by_format[best] if best else None,
            "api_1m_overhead_by_format": by_format,
            "api_1m_readings": job.readings,
            "api_1m_runs": api_runs,
            "api_1m_direct_runs": direct_runs,
        }
    )
    if notes:
        out["api_note"] = "; ".join(notes)
    return out


def _devices_endpoint(http: _Http, job: _Job, limit_s: float) -> dict[str, Any]:
    """The same readings through `GET /api/metrics?devices=` (JSON), once."""
    params = {
        "devices": ",".join(job.nodes),
        "start_time": utc(job.start_us).isoformat(),
        "end_time": utc(job.end_us - 1).isoformat(),  # the API's end is <=
    }
    try:
        seconds, body = _get(http, "/api/metrics", params, limit_s)
    except Abandoned as exc:
        return {"api_devices_1m_json_s": None, "api_devices_note": str(exc)}
    _check("API /api/metrics?devices=", rows("json", body), job.readings)
    return {"api_devices_1m_json_s": seconds}


def _summary(
    http: _Http, reader: Client, job: _Job, repeats: int, limit_s: float
) -> dict[str, Any]:
    """The job's summary computed from its raw readings (its start asked: a running job's
    case), the counts of its series adding up to the job's readings; beside it (where the
    time goes) what the route runs (`annotated`), called in this process."""
    runs = []
    direct = []
    stored = get_job(reader, job.job_id)
    live = {"start": utc(job.start_us).isoformat()}
    for _ in range(repeats):
        seconds, body = _get(http, f"/api/jobs/{job.job_id}/summary", live, limit_s)
        runs.append(seconds)
        summary = json.loads(b"".join(body))
        _check("summary", sum(m["count"] for m in summary["metrics"]), job.readings)
        _check_source(summary, "raw")
        began = time.perf_counter()
        annotated(reader, stored, job_selection(stored, EVERYTHING))
        direct.append(time.perf_counter() - began)
    log.info(
        "jobscope: API, summary of %s readings: %.3f s (in-process %.3f s)",
        f"{job.readings:,}",
        statistics.median(runs),
        statistics.median(direct),
    )
    return {
        "api_summary_1m_readings_s": statistics.median(runs),
        "api_summary_runs": runs,
        "api_summary_direct_s": statistics.median(direct),
        "api_summary_series": len(summary["metrics"]),
        "api_summary_energy_rows": len(summary["energy"]),
    }


def _summary_record(
    http: _Http, admin: Client, job: _Job, repeats: int, limit_s: float
) -> dict[str, Any]:
    """The same summary once the job's record exists: as an ended job is served."""
    began = time.monotonic()
    recorded = _from_record(http, admin, job.job_id, repeats, limit_s)
    log.info(
        "jobscope: API, summary of %s from its record: %.3f s (recorded after %.1f s)",
        job.job_id,
        statistics.median(recorded),
        time.monotonic() - began,
    )
    return {
        "api_summary_1m_record_s": statistics.median(recorded),
        "api_summary_record_runs": recorded,
    }


def _from_record(
    http: _Http, admin: Client, job_id: str, repeats: int, limit_s: float
) -> list[float]:
    """Once the job's record exists (the API's refresher computes it), the seconds of each
    of `repeats` GETs of its summary, each checked to be served from the record. The record
    is awaited in `job_records` (a GET before it exists computes the summary anew: seconds
    of the API's CPU taken from the refresher), then in the API's answer."""
    path = f"/api/jobs/{job_id}/summary"
    wait_until(
        lambda: int(str(admin.command(RECORDED_SQL, parameters={"job": job_id}))) > 0,
        RECORDED_S,
        f"the record of job {job_id} in job_records",
        interval=0.2,
    )
    wait_until(
        lambda: (
            orjson.loads(b"".join(_get(http, path, {}, limit_s)[1]))["record"]["source"] == "record"
        ),
        RECORDED_S,
        f"the record of {path}",
        interval=0.2,
    )
    runs = []
    for _ in range(repeats):
        seconds, body = _get(http, path, {}, limit_s)
        _check_source(orjson.loads(b"".join(body)), "record")
        runs.append(seconds)
    return runs


def _step(http: _Http, reader: Client, job: _Job, repeats: int, limit_s: float) -> dict[str, Any]:
    """1-minute averages of the job over the whole data set: a row per series and minute
    (JSON). Beside it, the same SQL straight from ClickHouse (JSONEachRow), and its server
    time: the API's SQL in ClickHouse's `Null` format (every row computed, none encoded or
    sent; the client's round trip, `query_floor_s`, included): the goal's figure."""
    minutes = job.data.poll_us[:, job.devices] // (60 * US)
    expected = sum(len(np.unique(minutes[:, j])) for j in range(minutes.shape[1]))
    expected *= job.data.spec.metrics
    selection = job_selection(get_job(reader, job.job_id), EVERYTHING)
    assert selection is not None
    fmt = api_formats.FORMATS["json"]
    params: dict[str, Any] = {}
    sql = projected(stepped_rows(selection, 60, "avg", params), fmt.timestamp, fmt.labels)
    bare: dict[str, Any] = {}
    bare_sql = stepped_rows(selection, 60, "avg", bare)
    runs = []
    direct = []
    server = []
    size = 0
    for _ in range(repeats):
        seconds, body = _get(
            http, f"/api/jobs/{job.job_id}/metrics", {"step": "1m", "agg": "avg"}, limit_s
        )
        runs.append(seconds)
        size = sum(map(len, body))
        _check("step=1m", rows("json", body), expected)
        seconds, body = _direct(reader, sql, params, fmt.clickhouse)
        _check("step=1m directly", rows("ndjson", body), expected)
        direct.append(seconds)
        seconds, body = _direct(reader, bare_sql, bare, "Null")
        if any(body):
            raise RuntimeError("step=1m in the Null format sent rows")
        server.append(seconds)
    log.info(
        "jobscope: API, step=1m over %s readings (%s rows): %.3f s (ClickHouse directly %.3f s; "
        "server time, nothing encoded, %.3f s)",
        f"{job.readings:,}",
        f"{expected:,}",
        statistics.median(runs),
        statistics.median(direct),
        statistics.median(server),
    )
    return {
        "api_step_1m_s": statistics.median(runs),
        "api_step_runs": runs,
        "api_step_direct_s": statistics.median(direct),
        "api_step_server_s": statistics.median(server),
        "api_step_server_runs": server,
        "api_step_rows": expected,
        "api_step_bytes": size,
        "api_step_job_readings": job.readings,
    }


def _export(http: _Http, job: _Job, pid: int | None) -> dict[str, Any]:
    """The API's resident memory while it streams a large job to a client that counts the
    rows and keeps nothing."""
    if pid is None:
        raise RuntimeError("the API process is not running")
    before = _status_kb(pid, "VmRSS")
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while True:
            samples.append(_status_kb(pid, "VmRSS"))
            if stop.wait(RSS_INTERVAL_S):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    newlines = size = 0
    began = time.perf_counter()
    try:
        path = f"/api/jobs/{job.job_id}/metrics"
        with http.stream("GET", path, params={"format": EXPORT_FORMAT}) as response:
            http.check(response)
            for chunk in response.iter_bytes():
                newlines += chunk.count(b"\n")
                size += len(chunk)
        seconds = time.perf_counter() - began
    finally:
        stop.set()
        sampler.join()
    _check(f"export ({EXPORT_FORMAT})", newlines - EXTRA_NEWLINES[EXPORT_FORMAT], job.readings)
    peak = max(samples)
    return {
        "api_export_peak_rss_mb": peak / 1024,
        "api_export_rss_before_mb": before / 1024,
        "api_export_rss_growth_mb": (peak - before) / 1024,
        "api_export_vmhwm_mb": _status_kb(pid, "VmHWM") / 1024,  # peak since the API started
        "api_export_readings": job.readings,
        "api_export_devices": len(job.devices),
        "api_export_format": EXPORT_FORMAT,
        "api_export_bytes": size,
        "api_export_s": seconds,
        "api_export_rss_samples": len(samples),
    }


def _report_data(http: _Http, admin: Client, token: str) -> dict[str, Any]:
    """The report's job and its readings (jobscope_report.py), inserted by the server; their
    parts merged and their minutes rolled up before the next part is timed. Rolled up at once
    (`jobscope_rollups.roll_up_now`: the refreshes' own queries up to now, as `settle` does
    for the load; the schedule, which takes the minutes noted before the last one closed
    10 s ago, then finds them done) rather than by the schedule 10 to 70 s later, which
    the report waited for and the export shared the machine with."""
    began = time.perf_counter()
    for series in jobscope_report.SERIES:
        sql, params = jobscope_report.insert_sql(series)
        admin.command(sql, parameters=params)
    seconds = time.perf_counter() - began
    inserted = _count(admin, "metrics", "count()")
    _check("the report's insert", inserted, jobscope_report.readings())
    create_job(http, token, jobscope_report.job_document())
    try:
        wait_until(
            lambda: _count(admin, "system.merges", "count()", "table = 'metrics'") == 0,
            MERGES_S,
            "the report data's merges",
            interval=0.2,
        )
    except TimeoutError as exc:  # the figures after it are still taken
        log.warning("jobscope: API, %s", exc)
    rolling = time.perf_counter()
    jobscope_rollups.roll_up_now(admin.command)
    rollup_s = time.perf_counter() - rolling
    log.info(
        "jobscope: API, report data: %s readings inserted in %.2f s, rolled up in %.2f s",
        f"{inserted:,}",
        seconds,
        rollup_s,
    )
    return {
        "report_readings_inserted": inserted,
        "report_insert_s": seconds,
        "report_rollup_s": rollup_s,
    }


def _report(
    http: _Http, admin: Client, reader: Client, repeats: int, limit_s: float, direct: bool
) -> dict[str, Any]:
    """The 100-node, 24-hour job's report as HTML and as PDF, once the rollups hold its
    minutes (no bucket of its devices pending) and its record exists (as an ended job is
    served); every answer checked. Beside it with `direct` (full runs: what a report costs
    before its record), the API's `summarise` of the job called once in this process."""
    began = time.monotonic()
    inserted = jobscope_report.readings()
    wait_until(
        lambda: (
            _count(admin, "rollup_pending_1m", "count()") == 0
            and _count(admin, "metrics_1m FINAL", "sum(count)") == inserted
        ),
        ROLLED_UP_S,
        "the report data in the 1-minute rollup",
        interval=0.2,
    )
    waited = time.monotonic() - began
    _from_record(http, admin, jobscope_report.JOB_ID, 1, limit_s)
    recorded = time.monotonic() - began - waited
    expected = _pdu_energy(admin)
    path = f"/api/jobs/{jobscope_report.JOB_ID}/report"
    _, body = _get(http, path, {"format": "json"}, limit_s)
    report = orjson.loads(b"".join(body))
    joules = _check_report(report, expected)
    html, pdf = [], []
    sizes = {}
    for _ in range(repeats):
        seconds, body = _get(http, path, {"format": "html"}, limit_s)
        _check_html(b"".join(body).decode(), joules, len(report["plots"]))
        html.append(seconds)
        sizes["html"] = sum(map(len, body))
    for _ in range(repeats):
        seconds, body = _get(http, path, {"format": "pdf"}, limit_s)
        document = b"".join(body)
        if not document.startswith(b"%PDF-") or b"%%EOF" not in document[-1024:]:
            raise RuntimeError(f"the report as PDF is not a whole PDF ({len(document):,} bytes)")
        pdf.append(seconds)
        sizes["pdf"] = len(document)
    in_job = report["summary"].get("metrics", [])
    summarise_s = None
    if direct:
        stored = get_job(reader, jobscope_report.JOB_ID)
        began = time.perf_counter()
        annotated(reader, stored, with_aliases(reader, job_selection(stored, EVERYTHING)))
        summarise_s = time.perf_counter() - began
    log.info(
        "jobscope: API, report of %d nodes x 24 h: HTML %.3f s (best %.3f), PDF %.3f s "
        "(best %.3f); summarise in-process %s s; rollups waited for %.1f s",
        jobscope_report.NODES,
        statistics.median(html),
        min(html),
        statistics.median(pdf),
        min(pdf),
        "n/a" if summarise_s is None else f"{summarise_s:.3f}",
        waited,
    )
    return {
        "report_100_nodes_24h_s": statistics.median(html),
        "report_100_nodes_24h_best_s": min(html),
        "report_100_nodes_24h_runs": html,
        "report_100_nodes_24h_pdf_s": statistics.median(pdf),
        "report_100_nodes_24h_pdf_best_s": min(pdf),
        "report_100_nodes_24h_pdf_runs": pdf,
        "report_html_bytes": sizes["html"],
        "report_pdf_bytes": sizes["pdf"],
        "report_plots": len(report["plots"]),
        "report_step_s": report.get("step_s"),
        "report_job_readings": _count(admin, "metrics", "count()", _IN_JOB),
        "report_summary_count": sum(m["count"] for m in in_job),
        "report_series": len(in_job),
        "report_summarise_direct_s": summarise_s,
        "report_energy_j": joules,
        "report_energy_expected_j": expected,
        "report_rollup_wait_s": waited,
        "report_record_wait_s": recorded,
    }


_IN_JOB = (
    "device_id IN {devices:Array(String)} AND timestamp BETWEEN {start:DateTime64(6, 'UTC')} "
    "AND {end:DateTime64(6, 'UTC')}"
)


def _count(admin: Client, table: str, what: str, where: str | None = None) -> int:
    """`what` (count() or sum(count)) of `table`'s rows of the report's devices (or `where`)."""
    condition = where or "device_id IN {devices:Array(String)}"
    start = jobscope_report.JOB_START
    end = start + timedelta(seconds=jobscope_report.JOB_S, microseconds=-1)
    value = admin.command(
        f"SELECT {what} FROM {table} WHERE {condition}",
        parameters={"devices": jobscope_report.devices(), "start": start, "end": end},
    )
    return int(value)  # type: ignore[arg-type]


def _pdu_energy(admin: Client) -> float:
    """The job's energy by its PDU outlets, as the bench reckons it: per node, the mean of its
    outlet's readings during the job times the job's length (they are evenly spaced)."""
    start = jobscope_report.JOB_START
    value = admin.command(
        "SELECT sum(mean) FROM (SELECT labels['_device_alias'] AS node, avg(value) AS mean "
        "FROM metrics WHERE device_id IN {pdus:Array(String)} AND metric_id = {metric:String} "
        "AND timestamp BETWEEN {start:DateTime64(6, 'UTC')} AND {end:DateTime64(6, 'UTC')} "
        "GROUP BY node)",
        parameters={
            "pdus": jobscope_report.pdus(),
            "metric": "pdu_outlet_power_watt",
            "start": start,
            "end": start + timedelta(seconds=jobscope_report.JOB_S, microseconds=-1),
        },
    )
    return float(value) * jobscope_report.JOB_S  # type: ignore[arg-type]


def _check_report(report: dict[str, Any], expected: float) -> float:
    """The report's energy (that of the PDU outlets, first of the site's priority among the
    job's sources, close to the bench's own figure) and a plot of each metric; its joules."""
    energy = report.get("energy") or {}
    joules = energy.get("joules")
    if energy.get("role") != "pdu" or joules is None:
        raise RuntimeError(f"the report's energy is not the PDU outlets': {energy}")
    if abs(joules - expected) > ENERGY_TOLERANCE * expected:
        raise RuntimeError(f"the report's energy is {joules:,.0f} J, the PDUs' {expected:,.0f} J")
    plotted = {p.get("metric_id") for p in report.get("plots", [])}
    missing = {s.metric_id for s in jobscope_report.SERIES} - plotted
    if missing:
        raise RuntimeError(f"the report has no plot of {sorted(missing)}")
    return float(joules)


_ENERGY_LINE = re.compile(r'id="job-energy">job energy: ([\d,]+) J')


def _check_html(text: str, joules: float, plots: int) -> None:
    """A whole HTML report: its energy line with the JSON's figure, an SVG per plot."""
    found = _ENERGY_LINE.search(text)
    if not text.rstrip().endswith("</html>") or found is None:
        raise RuntimeError(f"the report as HTML has no energy line or no end ({len(text):,} chars)")
    shown = int(found.group(1).replace(",", ""))
    if abs(shown - joules) > 1 + 1e-6 * joules:
        raise RuntimeError(f"the HTML report shows {shown:,} J, its JSON {energy_text(joules)}")
    if text.count("<svg") < plots:
        raise RuntimeError(f"the HTML report has {text.count('<svg')} plots, not {plots}")


# -- helpers -----------------------------------------------------------------------------


def _spread(fleet: int, n: int) -> list[int]:
    """`n` device indexes spread evenly over a fleet of `fleet`."""
    return [int(i) for i in np.linspace(0, fleet, n, endpoint=False).astype(int)]


class _Http(httpx.Client):
    """The bench's client of the API; an error names the exception in the API's log."""

    def __init__(self, settings: StackSettings) -> None:
        super().__init__(
            base_url=settings.api_url, timeout=TIMEOUT, event_hooks={"request": [self._mark]}
        )
        self.log_file = services.process(settings, "api").log_file
        self.log_offset = 0

    def _mark(self, _request: httpx.Request) -> None:
        """Where the API's log ends as a request is sent: its errors are written after."""
        try:
            self.log_offset = self.log_file.stat().st_size
        except OSError:
            self.log_offset = 0

    def check(self, response: httpx.Response) -> None:
        if response.status_code in (200, 201, 202):
            return
        response.read()
        detail = response.text[:1000]
        if response.status_code >= 500:
            detail += f" (API log: {_exception_after(self.log_file, self.log_offset)})"
        request = response.request
        raise RuntimeError(f"{request.method} {request.url}: HTTP {response.status_code}: {detail}")


def _exception_after(log_file: Path, offset: int, wait_s: float = 3.0) -> str:
    """The last exception line the API logged after `offset` (the cause of an HTTP 500;
    uvicorn may write it after the response is sent)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(log_file, "rb") as f:
                f.seek(offset)
                lines = f.read(1 << 20).decode(errors="replace").splitlines()
        except OSError as exc:
            return f"unreadable: {exc}"
        found = [line for line in lines if "Exception" in line or "Error:" in line]
        if found and not found[-1].startswith("ERROR:"):  # the cause, not the header line
            return found[-1][:1500]
        if time.monotonic() > deadline:
            return found[-1][:1500] if found else "no exception logged"
        time.sleep(0.1)


def _get(
    http: _Http, path: str, params: dict[str, str], limit_s: float
) -> tuple[float, list[bytes]]:
    """GET `path`, the body received completely (its chunks as they arrive); seconds."""
    chunks: list[bytes] = []
    began = time.perf_counter()
    with http.stream("GET", path, params=params) as response:
        http.check(response)
        for chunk in response.iter_bytes():
            chunks.append(chunk)
            if time.perf_counter() - began > limit_s:
                got = sum(map(len, chunks))
                raise Abandoned(f"abandoned after {limit_s:.0f} s ({got:,} bytes received)")
    return time.perf_counter() - began, chunks


def _direct(
    reader: Client, sql: str, params: dict[str, Any], clickhouse_format: str
) -> tuple[float, list[bytes]]:
    """`sql` from ClickHouse in `clickhouse_format`, read completely in large blocks."""
    chunks: list[bytes] = []
    began = time.perf_counter()
    stream = reader.raw_stream(sql, parameters=params, fmt=clickhouse_format)
    try:
        while block := stream.read(READ_BLOCK):
            chunks.append(block)
    finally:
        stream.close()
    return time.perf_counter() - began, chunks


def rows(layout: str, body: list[bytes]) -> int:
    """Readings in a body of `layout` (a format name of the API)."""
    if layout == "parquet":
        return pyarrow.parquet.read_table(io.BytesIO(b"".join(body))).num_rows
    if layout == "arrow":
        return pyarrow.ipc.open_stream(b"".join(body)).read_all().num_rows
    return sum(c.count(b"\n") for c in body) - EXTRA_NEWLINES[layout]


def _check(what: str, got: int, expected: int) -> None:
    if got != expected:
        raise RuntimeError(f"{what} returned {got:,} readings, expected {expected:,}")


def _check_source(summary: dict[str, Any], expected: str) -> None:
    """A summary served from raw readings or from the job's record, as `expected`."""
    source = summary["record"]["source"]
    if source != expected:
        raise RuntimeError(f"the summary came from {source}, expected {expected}")


def _status_kb(pid: int, field: str) -> int:
    """A field of /proc/<pid>/status, in kB (VmRSS: resident now; VmHWM: its peak)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")
