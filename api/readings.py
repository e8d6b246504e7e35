"""What every readings endpoint accepts and how it answers: the parameters (devices or a
job, metrics, time range, summary, as_rate, steps, aggregates, label filters, formats),
their limits, the streamed answer; and Kwollect's readings query itself, which both
`GET /api/metrics` and `GET /rpc/get_metrics` serve (api/routes/metrics.py, kwollect.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from clickhouse_connect.driver.client import Client
from fastapi import Depends, Header, Query
from fastapi.responses import StreamingResponse

from api import formats
from api.deps import ClickHouseDep, ExportsDep, SettingsDep
from api.infra import limits
from api.infra.config import ApiSettings
from api.infra.errors import ParameterError
from api.infra.params import (
    TIME_HELP,
    NamePatterns,
    parse_devices,
    parse_labels,
    parse_patterns,
    parse_step,
    parse_time,
)
from api.queries.metrics import Selection, as_rate, holds_more, scope_rows, stepped_rows
from api.schemas import ErrorBody
from api.scope import Asked, device_selection, job_selection, with_aliases
from api.visibility import ViewerDep

KWOLLECT_SUMMARY_STEP_S = 300
Agg = Literal["avg", "min", "max", "sum", "count", "first", "last", "median", "p95"]
SiteQuery = Annotated[
    str | None,
    Query(
        description="a site of a central jobscope: its job (job ids are unique per site; "
        "needed when the id exists at several) and its devices' readings",
        examples=["nancy"],
    ),
]


@dataclass(frozen=True)
class ReadingsQuery:
    """What every readings endpoint accepts, parsed."""

    asked: Asked
    as_rate: bool
    step_s: int | None
    agg: str
    fmt: formats.Format


def asked_params(
    settings: SettingsDep,
    metrics: Annotated[
        str | None,
        Query(
            description="comma-separated metric ids or globs (`bmc_*`, `prom_node_load?`); "
            "all if absent",
            examples=["bmc_power_watt,prom_node_load*"],
        ),
    ] = None,
    start_time: Annotated[
        str | None,
        Query(description=f"{TIME_HELP}; default end_time - 5 min (a job: its start)"),
    ] = None,
    end_time: Annotated[
        str | None,
        Query(description=f"{TIME_HELP}; default start_time + 5 min or now (a job: its end)"),
    ] = None,
    label: Annotated[
        list[str] | None,
        Query(description="key=value, repeatable: readings whose label key equals value"),
    ] = None,
    site: SiteQuery = None,
) -> Asked:
    """Which readings: metrics, labels, times (devices are each endpoint's own)."""
    start, end = parse_time("start_time", start_time), parse_time("end_time", end_time)
    if start is not None and end is not None and start > end:
        raise ParameterError("start_time", "must not be after end_time")
    patterns = parse_patterns("metrics", metrics)
    check_metrics(patterns, settings)
    return Asked(
        devices=(),
        metrics=patterns,
        labels=parse_labels(label),
        start=start,
        end=end,
        site=site or None,
    )


AskedDep = Annotated[Asked, Depends(asked_params)]


def check_metrics(patterns: NamePatterns, settings: ApiSettings) -> None:
    """At most `max_metrics` names and globs, `max_globs` of them globs, each at most
    `max_glob_chars` long: a glob is matched in time linear in a name (RE2 on the live
    stream, ClickHouse's LIKE in queries), and these bound that time."""
    names = patterns.exact + patterns.globs
    limits.check_count(
        "metrics", names, settings.max_metrics, "JOBSCOPE_MAX_METRICS", "use globs (bmc_*)"
    )
    limits.check_count(
        "metrics", patterns.globs, settings.max_globs, "JOBSCOPE_MAX_GLOBS", "use fewer globs"
    )
    for glob in patterns.globs:
        if len(glob) > settings.max_glob_chars:
            raise ParameterError(
                "metrics",
                f"a glob of {len(glob)} characters, at most {settings.max_glob_chars} "
                "(JOBSCOPE_MAX_GLOB_CHARS)",
            )


def check_devices(parameter: str, names: tuple[str, ...], settings: ApiSettings) -> None:
    limits.check_count(
        parameter, names, settings.max_devices, "JOBSCOPE_MAX_DEVICES", "split the request"
    )


def readings_query(
    asked: AskedDep,
    step: Annotated[
        str | None,
        Query(
            description="aggregate by buckets of this duration: 10s, 1m, 1h, 1d", examples=["1m"]
        ),
    ] = None,
    agg: Annotated[Agg, Query(description="aggregate of each bucket (with step)")] = "avg",
    summary: Annotated[
        bool,
        Query(
            description="Kwollect's summary: 5-minute buckets, max of `_total`, mean of the rest"
        ),
    ] = False,
    as_rate: Annotated[
        bool,
        Query(description="per-second rate of counters (Counter32/64 wraps and resets handled)"),
    ] = False,
    format: Annotated[
        str | None,
        Query(
            description="json (Kwollect's array), ndjson, csv, parquet or arrow; else Accept",
            json_schema_extra={"enum": list(formats.FORMATS)},
        ),
    ] = None,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> ReadingsQuery:
    step_s = parse_step(step)
    if summary and step_s is None:
        step_s, agg = KWOLLECT_SUMMARY_STEP_S, "kwollect"
    if as_rate and step_s is not None:
        raise ParameterError("as_rate", "cannot be combined with step or summary")
    return ReadingsQuery(asked, as_rate, step_s, agg, formats.choose(format, accept))


ReadingsQueryDep = Annotated[ReadingsQuery, Depends(readings_query)]
_NOTHING = Selection((), datetime(2000, 1, 1), datetime(2000, 1, 1))


def respond(
    clickhouse: Client,
    settings: ApiSettings,
    exports: limits.ExportSlots,
    query: ReadingsQuery,
    selection: Selection | None,
    filename: str,
) -> StreamingResponse:
    """Stream the readings of `selection` (none: an empty result in the chosen format),
    within the limits: the size of a JSON answer, the answers streaming at once."""
    release = exports.acquire()
    try:
        params: dict[str, Any] = {}
        selection = with_aliases(clickhouse, selection) or _NOTHING
        if query.step_s is not None:
            rows = stepped_rows(selection, query.step_s, query.agg, params)
        else:
            rows = scope_rows(selection, params)
            if query.as_rate:
                rows = as_rate(rows)
        span = selection.start, selection.end
        if limits.span_over(query.fmt.name, *span, query.step_s, settings.json_max_span_s):
            json = query.fmt.name == "json"
            most = settings.json_max_readings if json else settings.columnar_max_readings
            if holds_more(clickhouse, rows, params, most):
                raise (
                    limits.json_refused(settings.json_max_span_s, most)
                    if json
                    else limits.columnar_refused(query.fmt.name, most)
                )
    except BaseException:
        release()
        raise
    send_timeout_s = settings.export_send_timeout_s
    return formats.stream(clickhouse, rows, params, query.fmt, filename, send_timeout_s, release)


READINGS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {f.media_type: {} for f in formats.FORMATS.values()},
        "description": "readings, oldest first",
    },
    400: {"model": ErrorBody},
    401: {"model": ErrorBody, "description": "no valid token, where the read policy needs one"},
    403: {"model": ErrorBody, "description": "devices outside the caller's jobs (read policy)"},
    404: {"model": ErrorBody},
    406: {"model": ErrorBody},
    503: {"model": ErrorBody, "description": "ClickHouse down, or too many answers streaming"},
}


def get_metrics(
    clickhouse: ClickHouseDep,
    settings: SettingsDep,
    exports: ExportsDep,
    query: ReadingsQueryDep,
    viewer: ViewerDep,
    job_id: Annotated[
        str | None,
        Query(
            description="a job: its nodes (the devices measuring them summed under each node) "
            "over its time"
        ),
    ] = None,
    nodes: Annotated[str | None, Query(description="comma-separated node ids")] = None,
    devices: Annotated[
        str | None, Query(description="comma-separated device ids, e.g. node-1,pdu-2")
    ] = None,
) -> StreamingResponse:
    """Every reading of the devices (`nodes` and `devices` together; a node's domain suffix
    is ignored), or of a job's scope, oldest first. Readings of a device labelled
    `_device_alias=<node>` also come back under the node's id, summed over the devices
    measuring it at that instant, listed in the label `_device_orig`. A job, as in Kwollect,
    answers its nodes only: the measuring devices' readings come summed under the node, not
    under their own ids (`GET /api/jobs/{id}/metrics?measuring=true` has them). Times without
    an offset are UTC. Under the `jobs` read policy a user reads only devices that are nodes of
    one of their jobs, over a time inside it (403 otherwise), and a job of someone else is
    unknown (404)."""
    named = parse_devices("nodes", nodes) + parse_devices("devices", devices)
    asked = replace(query.asked, devices=tuple(dict.fromkeys(named)))
    check_devices("devices" if devices else "nodes", asked.devices, settings)
    if job_id is not None:
        # Kwollect's job_id: the job's nodes only, measuring devices summed under them
        selection = job_selection(viewer.job(clickhouse, job_id, asked.site), asked)
        selection = selection and replace(selection, measured=False)
        return respond(clickhouse, settings, exports, query, selection, f"job-{job_id}")
    if not asked.devices:
        raise ParameterError("devices", "give devices, nodes or job_id")
    window = timedelta(seconds=settings.default_window_s)
    selection = device_selection(asked, window)
    viewer.check_devices(clickhouse, asked.devices, selection.start, selection.end, asked.site)
    return respond(clickhouse, settings, exports, query, selection, "metrics")
