"""Errors as JSON that name what was wrong: `{"error": ..., "parameter": ...}`."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from api.clickhouse import ClickHouseUnavailable


class ParameterError(ValueError):
    """A query parameter that is present but unusable."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = message


def install(app: FastAPI) -> None:
    @app.exception_handler(ClickHouseUnavailable)
    async def clickhouse_unavailable(_request: Request, exc: ClickHouseUnavailable) -> JSONResponse:
        return JSONResponse(status_code=503, content={"error": str(exc)})

    @app.exception_handler(ParameterError)
    async def parameter_error(_request: Request, exc: ParameterError) -> JSONResponse:
        return JSONResponse(
            status_code=400,
            content={
                "error": f"invalid parameter {exc.parameter}: {exc.message}",
                "parameter": exc.parameter,
            },
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        parameter = str(first["loc"][-1]) if first.get("loc") else "request"
        return JSONResponse(
            status_code=400,
            content={
                "error": f"invalid parameter {parameter}: {first['msg']}",
                "parameter": parameter,
            },
        )
