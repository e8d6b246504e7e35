"""The Python client of jobscope's API: readings as pandas DataFrames (fetched as Arrow),
jobs, summaries, pushes and tokens. The CLI goes through it: one place for URLs, HTTP and
errors.

`Client(url, token).metrics(job="4242", metrics="bmc_*")` returns one row per reading:
`timestamp` (datetime64[us, UTC]), `device_id`, `metric_id`, `value` (float64) and
`labels` (a dict per row, `{}` when the reading has none).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx
import pandas as pd
import pyarrow as pa

from jobscope.errors import ApiError
from jobscope.login import StoredLogin
from jobscope.sse import EventParser

DEFAULT_API = "http://127.0.0.1:8000"
READING_FORMATS = ("csv", "parquet", "ndjson", "json", "arrow")
READING_COLUMNS = ["timestamp", "device_id", "metric_id", "value", "labels"]
REPORT_FORMATS = ("html", "pdf", "md", "json")
TimeArg = str | int | float | datetime | None


def _time(value: TimeArg) -> str | None:
    """A time parameter as the API takes it: ISO 8601 text or Unix seconds."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _error(response: httpx.Response) -> ApiError:
    """The API's `{"error": ..., "parameter": ...}` body (or the status line) as an ApiError."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        message, parameter = body["error"], body.get("parameter")
    else:
        message, parameter = (response.text.strip() or response.reason_phrase), None
    return ApiError(
        f"{response.status_code} {response.reason_phrase}: {message}",
        response.status_code,
        parameter,
    )


class Client:
    """One API at `url` (default: $JOBSCOPE_API, else http://127.0.0.1:8000), with an
    optional bearer `token` (default: $JOBSCOPE_TOKEN, else the token `jobscope login` stored
    for this URL, refreshed when it expires: jobscope/login.py)."""

    def __init__(
        self, url: str | None = None, token: str | None = None, timeout: float = 60.0
    ) -> None:
        self.url = (url or os.environ.get("JOBSCOPE_API") or DEFAULT_API).rstrip("/")
        self.token = token if token is not None else os.environ.get("JOBSCOPE_TOKEN") or None
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        auth = None if self.token else StoredLogin(self.url)
        self._http = httpx.Client(base_url=self.url, headers=headers, auth=auth, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextmanager
    def _send(self, method: str, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """A streamed response with a 2xx status, or an ApiError."""
        try:
            with self._http.stream(method, path, **kwargs) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _error(response)
                yield response
        except httpx.ConnectError as exc:
            raise ApiError(f"cannot reach the jobscope API at {self.url}: {exc}") from None
        except httpx.TimeoutException as exc:
            raise ApiError(f"no answer from the jobscope API at {self.url}: {exc!r}") from None

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        with self._send(method, path, **kwargs) as response:
            response.read()
            return response.json()

    @contextmanager
    def readings(
        self,
        *,
        job: str | int | None = None,
        devices: str | Iterable[str] | None = None,
        metrics: str | Iterable[str] | None = None,
        start_time: TimeArg = None,
        end_time: TimeArg = None,
        format: str = "csv",
        **extra: Any,
    ) -> Iterator[httpx.Response]:
        """The streamed response of a readings query: a job's (`job`) or devices' readings.
        `extra` passes further query parameters as they are (step, agg, label, as_rate...)."""
        if format not in READING_FORMATS:
            raise ApiError(
                f"unknown format {format!r}: expected one of {', '.join(READING_FORMATS)}"
            )
        params: dict[str, Any] = {"format": format}
        for name, value in (("devices", devices), ("metrics", metrics)):
            if value is not None:
                params[name] = value if isinstance(value, str) else ",".join(value)
        for name, value in (("start_time", start_time), ("end_time", end_time)):
            if value is not None:
                params[name] = _time(value)
        params.update({k: v for k, v in extra.items() if v is not None})
        path = f"/api/jobs/{_segment(job)}/metrics" if job is not None else "/api/metrics"
        with self._send("GET", path, params=params) as response:
            yield response

    def metrics(self, **query: Any) -> pd.DataFrame:
        """Readings as a DataFrame (see the module's docstring for its columns); takes what
        `readings` takes but the format: Arrow is always used."""
        with self.readings(**query, format="arrow") as response:
            body = response.read()
        return readings_frame(body)

    def live_events(
        self,
        job: str | int,
        *,
        metrics: str | Iterable[str] | None = None,
        devices: str | Iterable[str] | None = None,
        since: TimeArg = None,
    ) -> Iterator[tuple[str, Any]]:
        """The events of GET /api/jobs/{job}/live as (name, decoded data) pairs, comments
        left out, until the server ends the stream (after `end`, `dropped` or `error`)."""
        params = {
            k: v if isinstance(v, str) else ",".join(v)
            for k, v in (("metrics", metrics), ("devices", devices))
            if v is not None
        }
        if since is not None:
            params["since"] = _time(since)
        # no read timeout: the server sends a comment every 15 s, an idle job is no error
        timeout = httpx.Timeout(self._http.timeout.connect, read=None)
        with self._send(
            "GET", f"/api/jobs/{_segment(job)}/live", params=params, timeout=timeout
        ) as response:
            parser = EventParser()
            for line in response.iter_lines():
                if (event := parser.feed(line)) is not None:
                    yield event.name, json.loads(event.data)

    def live(
        self,
        job: str | int,
        *,
        metrics: str | Iterable[str] | None = None,
        devices: str | Iterable[str] | None = None,
        since: TimeArg = None,
        frames: bool = True,
    ) -> Iterator[Any]:
        """A job's readings as they arrive, until the job ends: a DataFrame per batch (the
        columns of `metrics`), or with `frames=False` each reading as a dict in Kwollect's
        shape. `since` replays the job's readings from then first. ApiError if the server
        dropped the stream (the client did not keep up) or could not go on."""
        events = self.live_events(job, metrics=metrics, devices=devices, since=since)
        for name, data in events:
            if name == "readings":
                if frames:
                    yield live_frame(data)
                else:
                    yield from data
            elif name in ("dropped", "error"):
                raise ApiError(f"live stream of job {job} {name}: {data.get('error')}")
            elif name == "end":
                return

    def jobs(
        self,
        *,
        user: str | None = None,
        state: str | None = None,
        node: str | None = None,
        start_time: TimeArg = None,
        end_time: TimeArg = None,
        limit: int | None = None,
    ) -> pd.DataFrame:
        """Jobs, newest first, one row each (the columns of GET /api/jobs)."""
        params = {
            "user": user,
            "state": state,
            "node": node,
            "start_time": _time(start_time),
            "end_time": _time(end_time),
            "limit": limit,
        }
        rows = self._json("GET", "/api/jobs", params={k: v for k, v in params.items() if v})
        return pd.DataFrame(rows)

    def compare(self, *jobs: str | int) -> dict[str, Any]:
        """GET /api/jobs/compare: the jobs' figures side by side, each with its difference
        to the first job's (`diff`: delta and relative)."""
        ids = ",".join(str(job) for job in jobs)
        return self._json("GET", "/api/jobs/compare", params={"ids": ids})

    def job(self, job: str | int) -> dict[str, Any]:
        return self._json("GET", f"/api/jobs/{_segment(job)}")

    def summary(self, job: str | int, metrics: str | None = None) -> dict[str, Any]:
        """GET /api/jobs/{job}/summary as it is: `metrics` (min/avg/max/last/count per
        device and metric), `energy` (joules per node and power metric) and `energy_total`."""
        params = {"metrics": metrics} if metrics else {}
        return self._json("GET", f"/api/jobs/{_segment(job)}/summary", params=params)

    def registry(self, metric: str | None = None) -> dict[str, Any]:
        """GET /api/metrics/registry: `energy_priority` and every entry (`metrics`); with
        `metric`, the entry describing it (`inferred: true` when none matched)."""
        params = {"metric": metric} if metric else {}
        return self._json("GET", "/api/metrics/registry", params=params)

    def report(self, job: str | int, format: str = "html") -> bytes:
        """GET /api/jobs/{job}/report: the job's report as the API renders it (`html`, `pdf`,
        `md` or `json`)."""
        if format not in REPORT_FORMATS:
            raise ApiError(
                f"unknown report format {format!r}: expected one of {', '.join(REPORT_FORMATS)}"
            )
        path = f"/api/jobs/{_segment(job)}/report"
        with self._send("GET", path, params={"format": format}) as response:
            return response.read()

    def push(self, readings: pd.DataFrame | Iterable[Mapping[str, Any]]) -> int:
        """POST readings (a DataFrame with the columns of `metrics`, or dicts in Kwollect's
        shape) as NDJSON to /api/metrics; returns the count the API accepted."""
        rows = readings.to_dict("records") if isinstance(readings, pd.DataFrame) else readings
        body = b"".join(json.dumps(_pushable(r)).encode() + b"\n" for r in rows)
        return self.push_ndjson(body)

    def push_ndjson(self, body: bytes) -> int:
        """POST an NDJSON body (one reading per line) as it is."""
        headers = {"Content-Type": "application/x-ndjson"}
        answer = self._json("POST", "/api/metrics", content=body, headers=headers)
        return int(answer["accepted"])

    def create_token(
        self,
        user: str,
        role: str,
        ttl_days: int | None = None,
        projects: Sequence[str] = (),
        nodes: Sequence[str] = (),
    ) -> dict[str, Any]:
        """POST /api/tokens (an admin token is needed); the API's answer, with the token.
        `projects`: those a `project` token reads; `nodes`: those an `agent` pushes for."""
        body: dict[str, Any] = {"user": user, "role": role}
        if ttl_days is not None:
            body["ttl_days"] = ttl_days
        if projects:
            body["projects"] = list(projects)
        if nodes:
            body["nodes"] = list(nodes)
        return self._json("POST", "/api/tokens", json=body)

    def revoke_token(self, jti: str) -> dict[str, Any]:
        """DELETE /api/tokens/{jti} (an admin token is needed): every API replica refuses it."""
        return self._json("DELETE", f"/api/tokens/{_segment(jti)}")


def token_id(token: str) -> str:
    """The `jti` of a signed token, read without checking its signature (only the API can):
    enough to name it in a revocation. ValueError if it has none."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return str(claims["jti"])
    except (IndexError, KeyError, TypeError, ValueError, binascii.Error):
        raise ValueError("not a signed jobscope token with a jti") from None


def _segment(job: str | int) -> str:
    """A job id as one URL path segment (a job id may hold `/` or `%`)."""
    return quote(str(job), safe="")


def _pushable(row: Mapping[str, Any]) -> dict[str, Any]:
    """A reading as JSON takes it: timestamps as ISO 8601, labels dropped when empty."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, pd.Timestamp | datetime):
            value = value.isoformat()
        elif key == "labels" and not value:
            continue
        elif isinstance(value, float) and math.isnan(value):
            raise ApiError(f"reading {dict(row)!r}: the value is not a number")
        out[key] = value
    return out


def live_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Readings in Kwollect's shape as a DataFrame with the columns of `readings_frame`."""
    frame = pd.DataFrame(rows, columns=READING_COLUMNS)
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True, format="ISO8601").astype(
        "datetime64[us, UTC]"
    )
    frame["value"] = frame["value"].astype("float64")
    return frame


def readings_frame(arrow_stream: bytes) -> pd.DataFrame:
    """An Arrow IPC stream of readings as a DataFrame: UTC microsecond timestamps and labels
    as dicts."""
    if not arrow_stream:
        table = pa.table(
            {
                "timestamp": pa.array([], pa.timestamp("us", "UTC")),
                "device_id": pa.array([], pa.string()),
                "metric_id": pa.array([], pa.string()),
                "value": pa.array([], pa.float64()),
                "labels": pa.array([], pa.map_(pa.string(), pa.string())),
            }
        )
    else:
        table = pa.ipc.open_stream(io.BytesIO(arrow_stream)).read_all()
    frame = table.to_pandas()
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True).astype("datetime64[us, UTC]")
    frame["labels"] = [dict(pairs) if pairs is not None else {} for pairs in frame["labels"]]
    for name in ("device_id", "metric_id"):
        frame[name] = frame[name].astype(str)
    return frame[READING_COLUMNS]
