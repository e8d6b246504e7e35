"""Dependencies shared by the routes, as named `Annotated` aliases."""

from __future__ import annotations

from typing import Annotated

from clickhouse_connect.driver.client import Client
from fastapi import Depends, Path, Request

from api.infra.config import ApiSettings
from api.infra.limits import ExportSlots


async def get_settings(request: Request) -> ApiSettings:
    """(async: a sync dependency would take a worker thread, and could wait for one)"""
    return request.app.state.settings


def get_clickhouse(request: Request) -> Client:
    return request.app.state.clickhouse.get()


SettingsDep = Annotated[ApiSettings, Depends(get_settings)]
ClickHouseDep = Annotated[Client, Depends(get_clickhouse)]


async def get_exports(request: Request) -> ExportSlots:
    return request.app.state.exports


ExportsDep = Annotated[ExportSlots, Depends(get_exports)]

JobId = Annotated[str, Path(description="the scheduler's job id", examples=["4242"])]
