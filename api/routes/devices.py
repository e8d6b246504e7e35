"""Devices: which exist, how many metrics each reports, and their newest values."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from api.deps import ClickHouseDep
from api.errors import NotFound
from api.queries.devices import devices_query, latest_query
from api.schemas import DeviceInfo, ErrorBody, LatestReading

router = APIRouter(prefix="/api/devices", tags=["devices"])


@router.get(
    "", operation_id="list_devices", response_model=list[DeviceInfo], summary="Every device"
)
def list_devices(clickhouse: ClickHouseDep) -> list[DeviceInfo]:
    """Each device that ever reported, with its number of metrics and newest reading time."""
    sql, params = devices_query()
    return [DeviceInfo(**r) for r in clickhouse.query(sql, parameters=params).named_results()]


@router.get(
    "/{device_id}/latest",
    operation_id="get_device_latest",
    response_model=list[LatestReading],
    responses={404: {"model": ErrorBody}},
    summary="The newest value of each metric of a device",
)
def get_latest(
    clickhouse: ClickHouseDep,
    device_id: Annotated[str, Path(examples=["node-1"])],
) -> list[LatestReading]:
    sql, params = latest_query(device_id)
    latest = [LatestReading(**r) for r in clickhouse.query(sql, parameters=params).named_results()]
    if not latest:
        raise NotFound(f"no device {device_id!r} has reported")
    return latest
