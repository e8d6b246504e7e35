"""Response shapes, for the OpenAPI documentation and typed clients."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

import hostlist
import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from api.infra.params import TIME_HELP, device_name, iso, to_time
from api.infra.probes import ComponentHealth
from kafka import allocations as allocation


class Reading(BaseModel):
    """One reading, as Kwollect's REST API returns it (paper, Fig. 3)."""

    timestamp: str = Field(
        examples=["2026-11-26T11:53:50.164813+00:00"],
        description="ISO 8601, microseconds, UTC offset",
    )
    device_id: str = Field(examples=["node-1"])
    metric_id: str = Field(examples=["bmc_power_watt"])
    value: float = Field(examples=[138])
    labels: dict[str, str | list[str]] = Field(
        default_factory=dict,
        description="the reading's labels; `_device_orig` (a node's sum of the devices "
        "measuring it) lists those devices, as in Kwollect (a comma-separated string in CSV, "
        "Parquet and Arrow)",
        examples=[{"_device_orig": ["pdu-1", "pdu-2"]}],
    )


class Health(BaseModel):
    status: str = Field(examples=["ok", "degraded"])
    kafka: ComponentHealth
    clickhouse: ComponentHealth
    live_streams: int = Field(0, description="clients following a job's live stream now")
    exports_streaming: int = Field(0, description="readings answers streaming now")
    exports_waiting: int = Field(0, description="requests waiting for a slot to stream one")


class ErrorBody(BaseModel):
    error: str
    parameter: str | None = None


class OidcProvider(BaseModel):
    """Where `jobscope login` gets a token: the site's provider and what its tokens carry."""

    issuer: str = Field(examples=["https://sso.example.org/realms/hpc"])
    client_id: str = Field(
        examples=["jobscope-cli"], description="the public client of the device grant"
    )
    audience: str = Field(examples=["jobscope"], description="the API's audience (`aud`)")


class JobState(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    TERMINATED = "terminated"
    ERROR = "error"


JOB_ID_PATTERN = r"^[^\s/\x00-\x1f]{1,256}$"
TIME_EXAMPLES = ["2026-11-23T10:00:00+01:00", 1795424400]


def _time_or_none(value: str | float | None) -> str | None:
    if value is None or value == "":
        return None
    try:
        return iso(to_time(value))
    except (ValueError, OverflowError, OSError) as exc:
        raise ValueError(f"{value!r} is not {TIME_HELP}") from exc


def _pattern_or_none(value: str | None) -> str | None:
    """An empty pattern is none; the route checks the rest (api/ondemand.py)."""
    return value or None


class Allocation(BaseModel):
    """What a job was given inside one node (kafka/allocations.py). Readings labelled `gpu`
    or `gpu_uuid` (`cpu` or `core`) on that node are the job's only for its GPUs (CPUs);
    every other reading of the node stays in the job (docs/jobs.md, "Allocations")."""

    model_config = ConfigDict(extra="forbid")

    cpus: str | int | None = Field(
        None,
        description="CPU ids as a Linux cpuset list (`0-15,32`, ids up to 65535), or only "
        "their count (then per-CPU readings are not told apart)",
        examples=["0-15,32"],
    )
    gpus: list[str] | None = Field(
        None, description="GPU indexes (nvidia-smi's `index`)", examples=[["0", "1"]]
    )
    gpu_uuids: list[str] | None = Field(
        None, description="GPU (or MIG instance) UUIDs", examples=[["GPU-5d3f…"]]
    )
    memory_mb: int | None = Field(None, description="memory, MB", examples=[64000])

    @model_validator(mode="before")
    @classmethod
    def _canonical(cls, value: Any) -> Any:
        """Checked and written canonically (cpuset shortest, GPUs sorted and unique)."""
        if isinstance(value, Allocation):
            return value
        return allocation.normalized_entry(value)


def _expanded_allocations(value: dict[str, Allocation] | None) -> dict[str, Allocation] | None:
    """Keys may be hostlist expressions (`gpu-[01-04]`, as scontrol groups nodes given the
    same); a domain suffix is dropped, as for nodes."""
    if value is None:
        return None
    out: dict[str, Allocation] = {}
    for key, entry in value.items():
        try:
            names = hostlist.expand_hostlist(key)
        except hostlist.BadHostlist as exc:
            raise ValueError(f"{key[:64]!r} is not a node or hostlist expression: {exc}") from exc
        for name in names:
            node = device_name(name.strip())
            if node in out:
                raise ValueError(f"{node}: given twice")
            if len(out) >= MAX_JOB_NODES:
                raise ValueError(f"more than {MAX_JOB_NODES} nodes")
            out[node] = entry
    return out


class JobFields(BaseModel):
    """What a scheduler says of a job; every field is optional in a PATCH."""

    model_config = ConfigDict(extra="forbid")

    user: str | None = Field(None, max_length=256, examples=["alice"])
    project: str | None = Field(None, max_length=256, examples=["energy-study"])
    queue: str | None = Field(None, max_length=256, examples=["default"])
    nodes: list[str] | str | None = Field(
        None,
        description="host names, or one hostlist expression (Slurm's `node-[1-4,7],gpu-[01-03]`); "
        "a domain suffix is dropped (`node-1.site.org` is `node-1`)",
        examples=[["node-1", "node-2"], "node-[1-4,7]"],
    )
    start: str | float | None = Field(
        None, description="ISO 8601 (UTC without offset) or Unix seconds", examples=TIME_EXAMPLES
    )
    end: str | float | None = Field(
        None, description="as start; null while the job runs", examples=[None]
    )
    state: JobState | None = Field(None, examples=["running"])
    site: str | None = Field(None, max_length=256, examples=["nancy"])
    labels: dict[str, str] | None = Field(None, examples=[{"name": "stress-test"}])
    allocations: dict[str, Allocation] | None = Field(
        None,
        description="per node (a name or hostlist expression), what the job was given inside "
        "it; absent or empty: whole nodes. Every node must be one of the job's",
        examples=[{"gpu-01": {"cpus": "0-15", "gpus": ["0", "1"], "memory_mb": 64000}}],
    )

    _expand_allocations = field_validator("allocations")(_expanded_allocations)

    @field_validator("nodes")
    @classmethod
    def _expand_nodes(cls, value: list[str] | str | None) -> list[str] | None:
        if value is None:
            return None
        try:
            names = hostlist.expand_hostlist(value) if isinstance(value, str) else value
        except hostlist.BadHostlist as exc:
            raise ValueError(f"{value!r} is not a hostlist expression: {exc}") from exc
        nodes = list(dict.fromkeys(device_name(n.strip()) for n in names if n.strip()))
        if len(nodes) > MAX_JOB_NODES:
            raise ValueError(f"more than {MAX_JOB_NODES} nodes")
        return nodes

    @field_validator("start", "end")
    @classmethod
    def _check_time(cls, value: str | float | None) -> str | None:
        checked = _time_or_none(value)
        if checked is not None and not JOB_YEARS[0] <= int(checked[:4]) < JOB_YEARS[1]:
            raise ValueError(f"{value!r} is outside {JOB_YEARS[0]}-{JOB_YEARS[1] - 1}")
        return checked

    @field_validator("end")
    @classmethod
    def _end_after_start(cls, end: str | None, info: ValidationInfo) -> str | None:
        start = info.data.get("start")
        if end and start and end < start:  # one ISO form for both: text order is time order
            raise ValueError(f"{end} is before start {start}")
        return end


MAX_JOB_NODES = 100_000
JOB_YEARS = (2000, 2101)  # as readings: a time outside is a mistake


class JobCreate(JobFields):
    job_id: str = Field(
        pattern=JOB_ID_PATTERN,
        description="the scheduler's id: OAR's integers, Slurm's `1234_5` or `1234+0`",
        examples=["4242"],
    )
    state: JobState = Field(JobState.RUNNING, examples=["running"])

    @model_validator(mode="after")
    def _allocations_on_job_nodes(self) -> JobCreate:
        """Every node given is the job's; nodes given nothing are left out (whole nodes)."""
        stray = sorted(set(self.allocations or {}) - set(self.nodes or []))
        if stray:
            raise ValueError(f"allocations: {stray[0]} is not a node of the job")
        if self.allocations:
            self.allocations = {
                node: entry
                for node, entry in self.allocations.items()
                if entry.model_dump(exclude_none=True)
            }
        return self


def _stored_allocations(value: Any) -> Any:
    """ClickHouse's JSON text ('' for none). Another writer's entry that is not a valid
    allocation is left out (that node is then the job's whole), never an error."""
    if isinstance(value, str | bytes):
        try:
            value = orjson.loads(value) if value else {}
        except orjson.JSONDecodeError:
            return {}
    if not isinstance(value, dict):
        return {}
    out = {}
    for node, entry in value.items():
        if isinstance(entry, Allocation):
            out[node] = entry
            continue
        try:
            out[node] = allocation.normalized_entry(entry)
        except ValueError:
            continue
    return out


class Job(BaseModel):
    """A job as stored: the newest version the scheduler sent."""

    job_id: str = Field(examples=["4242"])
    user: str = Field(examples=["alice"])
    project: str = Field(examples=[""])
    queue: str = Field(examples=["default"])
    nodes: list[str] = Field(examples=[["node-1", "node-2"]])
    start: str | None = Field(examples=["2026-11-23T09:00:00.000000+00:00"])
    end: str | None = Field(examples=[None], description="null while the job runs")
    state: JobState = Field(examples=["running"])
    site: str = Field(examples=[""])
    labels: dict[str, str] = Field(examples=[{}])
    updated_at: str = Field(examples=["2026-11-23T09:00:00.123456+00:00"])
    allocations: dict[str, Allocation] = Field(
        default_factory=dict,
        description="per node, what the job was given inside it; {}: whole nodes",
        examples=[{"gpu-01": {"cpus": "0-15", "gpus": ["0", "1"]}}],
    )

    _read_allocations = field_validator("allocations", mode="before")(_stored_allocations)


class JobListed(Job):
    """A job of `GET /api/jobs`, with the figures of its record (null without one: a job
    running, or ended and not yet recorded)."""

    energy_j: float | None = Field(None, examples=[1.8e6], description="the job's energy")
    coverage: float | None = Field(None, examples=[0.98], description="of the job's energy")
    severity: str | None = Field(
        None, examples=["warning"], description="its worst note: '', info, warning or alert"
    )
    notes: list[str] = Field(default_factory=list, examples=[["node-power-idle"]])
    efficiency: float | None = Field(
        None,
        examples=[0.42],
        description="the mean of its footprint's positions (0 idle .. 1 peak)",
    )


class JobComparison(BaseModel):
    """`GET /api/jobs/compare`: jobs side by side, the first the reference."""

    figures: list[str] = Field(
        examples=[["duration_s", "energy_j", "footprint.bmc_power_watt.position"]],
        description="every figure some job has, in order",
    )
    jobs: list[dict[str, Any]] = Field(
        description="per job, in the order asked: `job` (its metadata), `notes` (as in its "
        "summary), `severity` (the worst), `footprint_source`, `figures` {name: number} "
        "(duration_s, energy_j, coverage, footprint.<metric>.mean|p95|position|"
        "above_caution_s|above_alert_s, metrics.<metric>.avg|max|delta|rate over its nodes) and "
        "`diff` {name: {delta, relative}}: each figure minus the first job's, and that "
        "difference relative to the first's (null when the first's is 0 or missing)"
    )


class OnDemandRequest(BaseModel):
    """Which optional metrics to switch on for a job (Kwollect's `oarsub -t monitor=...`)."""

    model_config = ConfigDict(extra="forbid")

    metrics: str | None = Field(
        None,
        description="regular expression (RE2 syntax: no backreferences or look-around) "
        "matched from the start of the metric name, at most JOBSCOPE_ONDEMAND_MAX_PATTERN_CHARS "
        "characters (4096 by default); null or absent: every optional metric",
        examples=["wattmetre_power_watt", "bmc_|prom_node_"],
    )
    until: str | float | None = Field(
        None,
        description="switch off then (ISO 8601 or Unix seconds); at the latest when the job ends",
        examples=[None],
    )

    _check_metrics = field_validator("metrics")(_pattern_or_none)
    _check_until = field_validator("until")(_time_or_none)


class OnDemand(BaseModel):
    """An activation, as published on the on-demand topic (kafka/ondemand.py's message)."""

    id: str = Field(examples=["job/4242"])
    job_id: str | None = Field(examples=["4242"])
    devices: list[str] = Field(examples=[["node-1", "node-2"]])
    metrics: str | None = Field(examples=["wattmetre_power_watt"])
    until: str | None = Field(examples=[None], description="null: until the job ends")


class OnDemandRemoved(BaseModel):
    """The activation switched off (nothing happens if there was none)."""

    id: str = Field(examples=["job/4242"])
    job_id: str = Field(examples=["4242"])


class CatalogEntry(BaseModel):
    """A metric present in a job's scope (Kwollect's available metrics, with counts)."""

    device_id: str = Field(examples=["node-1"])
    metric_id: str = Field(examples=["bmc_power_watt"])
    count: int = Field(examples=[3600])
    first: str = Field(examples=["2026-11-23T09:00:00.512000+00:00"])
    last: str = Field(examples=["2026-11-23T09:59:59.512000+00:00"])
    unit: str = Field(examples=["W"], description="the metric registry's unit")
    kind: str = Field(examples=["gauge"], description="gauge, counter or energy_counter")
    scope: str = Field(examples=["node"], description="what one series measures")
    description: str = Field(examples=["power of the node as its BMC reports it"])
    inferred: bool = Field(
        examples=[False], description="no registry entry: unit and kind inferred from the name"
    )


class MetricSummary(BaseModel):
    device_id: str = Field(examples=["node-1"])
    metric_id: str = Field(examples=["bmc_power_watt"])
    min: float = Field(examples=[112.0])
    avg: float = Field(examples=[151.3])
    max: float = Field(examples=[188.0])
    last: float = Field(examples=[140.0])
    count: int = Field(examples=[3600])
    pushed: bool = Field(
        False,
        description="values users wrote (pushed with source=user:*, or kwollect_custom): "
        "kept apart from the measured ones, never summed into them",
    )
    unit: str | None = Field(None, description="the metric registry's unit", examples=["W"])
    kind: str | None = Field(None, description="gauge, counter or energy_counter")
    p95: float | None = Field(None, description="95th percentile (gauges; null for counters)")
    delta: float | None = Field(
        None,
        description="counters: the increase over the job, summed over the series, across "
        "wraps (2^32, 2^64) and resets as as_rate reads them; null for gauges",
        examples=[1.8e9],
    )
    rate: float | None = Field(
        None,
        description="counters: per series its increase over the seconds from its first to its "
        "last reading, summed over the series (per second)",
    )
    resets: int | None = Field(None, description="counters: restarts from 0 seen")


class NodeEnergy(BaseModel):
    """Energy of one node by one source: a power metric of the node itself (its BMC) or of
    the devices aliased to it (PDU outlets, wattmeter channels), summed over those devices."""

    node: str = Field(examples=["node-1"])
    metric_id: str = Field(examples=["bmc_power_watt"])
    sources: list[str] = Field(
        description="the devices that measured it: the node itself, or its aliased devices",
        examples=[["node-1"]],
    )
    joules: float = Field(examples=[543210.5])
    covered_s: float = Field(
        description="seconds of the job the integral covers (gaps over 3 periods excluded; "
        "with several devices, the least any of them covers)",
        examples=[3599.0],
    )
    readings: int = Field(examples=[3600])
    pushed: bool = Field(
        False,
        description="values users wrote (pushed with source=user:*, or kwollect_custom): "
        "kept apart from the measured ones, never summed into them",
    )
    role: str | None = Field(
        None, description="the registry's energy_role of the metric", examples=["bmc"]
    )
    preferred: bool = Field(
        False, description="the node's energy by the site's priority (registry energy_priority)"
    )


class EnergyTotal(BaseModel):
    metric_id: str = Field(examples=["bmc_power_watt"])
    joules: float = Field(examples=[1086421.0])
    nodes: int = Field(examples=[2])
    pushed: bool = Field(False, description="a total of pushed power (see NodeEnergy.pushed)")


class EnergySpread(BaseModel):
    min_joules: float
    max_joules: float
    relative: float = Field(description="(max - min) / max", examples=[0.06])


class NodeEnergyChoice(BaseModel):
    """A node's energy by its preferred source, and how far its whole-node sources differ."""

    node: str = Field(examples=["node-1"])
    joules: float = Field(examples=[543210.5])
    metric_id: str = Field(examples=["wattmetre_power_watt"])
    role: str | None = Field(examples=["wattmeter"])
    covered_s: float = Field(examples=[3599.0])
    coverage: float = Field(description="covered_s / the job's duration", examples=[0.9997])
    sources_count: int = Field(description="sources measuring the whole node", examples=[2])
    spread: EnergySpread | None = Field(description="null with fewer than 2 such sources")
    node_joules: float | None = Field(
        None, description="the node's whole energy by that source (joules: the job's part)"
    )
    attribution: Literal["exclusive", "cores", "gpus"] = Field(
        "exclusive",
        description="how the job's part was drawn (JOBSCOPE_ENERGY_SHARING, docs/jobs.md): "
        "exclusive, the node's whole (also a node without the job's CPUs or of unknown size)",
    )
    share: float = Field(1.0, description="joules / node_joules", examples=[0.25])
    cpu_share: float | None = Field(
        None, description="the job's CPUs / the node's (null when exclusive)", examples=[0.25]
    )
    gpu_joules: float | None = Field(
        None, description="gpus: the job's own GPUs' measured energy, in joules"
    )
    node_gpu_joules: float | None = Field(
        None, description="gpus: all the node's GPUs' energy over the job (null: unknown)"
    )


class JobEnergy(BaseModel):
    joules: float = Field(examples=[1086421.0])
    role: str | None = Field(description="the nodes' preferred role; mixed if they differ")
    coverage: float = Field(
        description="the least coverage of any of the job's nodes (0: a node not measured)"
    )
    nodes: int = Field(examples=[2])
    node_joules: float | None = Field(None, description="its nodes' whole energy summed")
    policy: Literal["exclusive", "cores", "gpus"] = Field(
        "exclusive", description="the site's JOBSCOPE_ENERGY_SHARING when it was computed"
    )
    attribution: Literal["exclusive", "cores", "gpus", "mixed"] = Field(
        "exclusive", description="its nodes' attribution; mixed if they differ"
    )
    share: float = Field(1.0, description="joules / node_joules", examples=[1.0])


class SummarySource(BaseModel):
    computed_at: str | None = Field(
        description="when the record was computed; null from raw readings (computed now)",
        examples=["2026-11-23T10:01:00.000000+00:00"],
    )
    source: Literal["raw", "record"] = Field(
        description="record: the job record kept after the job ended (docs/jobs.md)"
    )
    version: int | None = Field(description="the record's version; null from raw readings")


class JobSummary(BaseModel):
    job_id: str = Field(examples=["4242"])
    start: str | None = Field(examples=["2026-11-23T09:00:00.000000+00:00"])
    end: str | None = Field(description="the end of the span summarised (now while it runs)")
    duration_s: float = Field(examples=[3600.0])
    metrics: list[MetricSummary]
    energy: list[NodeEnergy]
    energy_total: list[EnergyTotal] = Field(
        description="per source (power metric), over the nodes; pushed apart"
    )
    energy_nodes: list[NodeEnergyChoice] = Field(
        default_factory=list, description="per measured node: its preferred source's energy"
    )
    energy_job: JobEnergy | None = Field(
        None, description="the job's energy by its nodes' preferred sources"
    )
    footprint: list[dict[str, Any]] = Field(default_factory=list)
    notes: list[dict[str, Any]] = Field(default_factory=list)
    record: SummarySource | None = Field(None, description="where the answer came from")
    truncated: dict[str, int] | None = Field(
        None,
        description="only in a record too large to keep whole (JOBSCOPE_RECORDS_MAX_BYTES): "
        "the lists it left out, with the rows each had",
        examples=[{"metrics": 120000}],
    )


class DeviceInfo(BaseModel):
    device_id: str = Field(examples=["node-1"])
    metrics: int = Field(examples=[20])
    last_reading: str = Field(examples=["2026-11-23T09:59:59.512000+00:00"])


class LatestReading(Reading):
    """The newest reading of one series."""


class AvailableMetric(BaseModel):
    """A metric a device reported lately (Kwollect's available_metrics)."""

    device_id: str = Field(examples=["node-1"])
    metric_id: str = Field(examples=["bmc_power_watt"])
    unit: str = Field(examples=["W"], description="the metric registry's unit")
    kind: str = Field(examples=["gauge"], description="gauge, counter or energy_counter")
    scope: str = Field(examples=["node"], description="what one series measures")
    description: str = Field(examples=["power of the node as its BMC reports it"])
    inferred: bool = Field(
        examples=[False], description="no registry entry: unit and kind inferred from the name"
    )


class PushAccepted(BaseModel):
    """A push Kafka has acknowledged in full: durable, ingested within seconds."""

    accepted: int = Field(description="readings published", examples=[2])


class RemoteWriteSkipped(BaseModel):
    """Samples of a remote write that are not stored."""

    stale: int = Field(description="Prometheus' stale markers", examples=[0])
    non_finite: int = Field(description="other NaN and infinite values", examples=[0])
    histograms: int = Field(description="native histogram samples", examples=[0])


class RemoteWriteAccepted(BaseModel):
    """A remote write Kafka has acknowledged in full (Prometheus reads any 2xx as success)."""

    accepted: int = Field(description="readings published", examples=[500])
    skipped: RemoteWriteSkipped


class TokenRequest(BaseModel):
    user: str = Field(min_length=1, examples=["alice"])
    role: str = Field(
        examples=["pusher"],
        description="admin, scheduler, pusher, reader, user, project, support or agent",
    )
    ttl_days: float = Field(
        30,
        gt=0,
        allow_inf_nan=False,
        description="validity from now, at most JOBSCOPE_TOKEN_MAX_TTL_DAYS (365)",
    )
    projects: list[str] = Field(
        default_factory=list,
        examples=[["p1"]],
        description="the projects whose jobs a `project` token reads (docs/access.md)",
    )
    nodes: list[str] = Field(
        default_factory=list,
        examples=[["node-1"]],
        description="the nodes an `agent` token pushes for",
    )


class TokenCreated(BaseModel):
    token: str = Field(description="send as Authorization: Bearer <token>")
    user: str = Field(examples=["alice"])
    role: str = Field(examples=["pusher"])
    expires_at: str = Field(examples=["2026-12-23T10:00:00.000000+00:00"])


class TokenRevoked(BaseModel):
    jti: str = Field(description="the revoked token's id, refused by every API replica")
    revoked_by: str = Field(examples=["admin"])
    kept_until: str = Field(
        description="the revocation is kept until then, past any token's expiry",
        examples=["2027-11-23T10:00:00.000000+00:00"],
    )
