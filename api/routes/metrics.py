"""GET /api/metrics: Kwollect's readings query, streamed as a JSON array."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import IO, Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from api.deps import ClickHouseDep, SettingsDep
from api.errors import ParameterError
from api.queries.metrics import ReadingsSelection, readings_query
from api.schemas import ErrorBody, Reading

router = APIRouter(prefix="/api", tags=["metrics"])


def parse_list(parameter: str, value: str | None) -> tuple[str, ...]:
    items = tuple(part.strip() for part in (value or "").split(",") if part.strip())
    if value is not None and not items:
        raise ParameterError(parameter, "expected a comma-separated list of names")
    return items


def parse_time(parameter: str, value: str | None) -> datetime | None:
    """ISO 8601 (naive means UTC) or Unix seconds -> naive UTC datetime."""
    if value is None:
        return None
    try:
        parsed = (
            datetime.fromtimestamp(float(value), UTC)
            if _is_number(value)
            else datetime.fromisoformat(value.replace(" ", "T", 1))
        )
    except (ValueError, OverflowError, OSError) as exc:
        raise ParameterError(
            parameter,
            f"{value!r} is not an ISO 8601 time (e.g. 2026-11-21T10:00:00+01:00) or Unix seconds",
        ) from exc
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


BLOCK_SIZE = 1 << 18


def json_array(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """JSONEachRow -> JSON array. Newlines inside JSON strings are escaped, so each raw
    newline ends a row; the last separator is held back so it can close the array."""
    yield b"["
    carry = b""
    for chunk in chunks:
        data = carry + chunk.replace(b"\n", b",\n")
        carry, out = data[-2:], data[:-2]
        if out:
            yield out
    yield (b"\n" if carry == b",\n" else carry) + b"]\n"


def blocks(stream: IO[bytes], size: int = BLOCK_SIZE) -> Iterator[bytes]:
    """Read a response in large blocks: iterating it would yield one row (line) at a time."""
    try:
        while block := stream.read(size):
            yield block
    finally:
        stream.close()


@router.get(
    "/metrics",
    operation_id="get_metrics",
    response_model=list[Reading],
    responses={400: {"model": ErrorBody}},
    summary="Readings of devices over a time range",
)
def get_metrics(
    clickhouse: ClickHouseDep,
    settings: SettingsDep,
    devices: Annotated[str, Query(description="comma-separated device ids, e.g. node-1,node-2")],
    metrics: Annotated[
        str | None, Query(description="comma-separated metric ids (all if absent)")
    ] = None,
    start_time: Annotated[
        str | None, Query(description="ISO 8601 or Unix seconds; default end_time - 5 min")
    ] = None,
    end_time: Annotated[
        str | None, Query(description="ISO 8601 or Unix seconds; default now")
    ] = None,
) -> StreamingResponse:
    """Every reading of the given devices (and metrics) between start_time and end_time,
    oldest first, as a JSON array of Kwollect-shaped readings."""
    end = parse_time("end_time", end_time) or datetime.now(UTC).replace(tzinfo=None)
    start = parse_time("start_time", start_time) or end - timedelta(
        seconds=settings.default_window_s
    )
    if start > end:
        raise ParameterError("start_time", "must not be after end_time")
    selection = ReadingsSelection(
        devices=parse_list("devices", devices),
        metrics=parse_list("metrics", metrics),
        start=start,
        end=end,
    )
    sql, params = readings_query(selection)
    stream = clickhouse.raw_stream(sql, parameters=params, fmt="JSONEachRow")
    return StreamingResponse(json_array(blocks(stream)), media_type="application/json")
