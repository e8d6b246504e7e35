"""Devices: which exist, how many metrics each reports, and their newest values."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from api.deps import ClickHouseDep
from api.infra.errors import NotFound
from api.queries.devices import select_devices, select_latest
from api.schemas import DeviceInfo, ErrorBody, LatestReading
from api.visibility import ViewerDep

router = APIRouter(prefix="/api/devices", tags=["devices"])


@router.get(
    "", operation_id="list_devices", response_model=list[DeviceInfo], summary="Every device"
)
def list_devices(clickhouse: ClickHouseDep, viewer: ViewerDep) -> list[DeviceInfo]:
    """Each device that ever reported, with its number of metrics and newest reading time
    (under the `jobs` read policy, a user's: the nodes of their jobs)."""
    nodes_of = None if viewer.sees_all else viewer.jobs_condition()
    return [DeviceInfo(**r) for r in select_devices(clickhouse, nodes_of)]


@router.get(
    "/{device_id}/latest",
    operation_id="get_device_latest",
    response_model=list[LatestReading],
    responses={403: {"model": ErrorBody}, 404: {"model": ErrorBody}},
    summary="The newest value of each metric of a device",
)
def get_latest(
    clickhouse: ClickHouseDep,
    viewer: ViewerDep,
    device_id: Annotated[str, Path(examples=["node-1"])],
) -> list[LatestReading]:
    """Under the `jobs` read policy, a user's device must be a node of a running job of
    theirs (403 otherwise)."""
    viewer.check_running_node(clickhouse, device_id)
    latest = [LatestReading(**r) for r in select_latest(clickhouse, device_id)]
    if not latest:
        raise NotFound(f"no device {device_id!r} has reported")
    return latest
