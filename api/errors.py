"""Errors as JSON that name what was wrong: `{"error": ..., "parameter": ...}`."""

from __future__ import annotations

from clickhouse_connect.driver.exceptions import OperationalError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from api.clickhouse import ClickHouseUnavailable
from api.kafka import KafkaUnavailable


class ParameterError(ValueError):
    """A query parameter that is present but unusable."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = message


class NotAcceptable(ValueError):
    """No format the client accepts can be produced."""


class NotFound(LookupError):
    """A job or device that does not exist; the message names it."""


def install(app: FastAPI) -> None:
    @app.exception_handler(ClickHouseUnavailable)
    async def clickhouse_unavailable(_request: Request, exc: ClickHouseUnavailable) -> JSONResponse:
        return JSONResponse(status_code=503, content={"error": str(exc)})

    @app.exception_handler(OperationalError)
    async def clickhouse_gone(_request: Request, exc: OperationalError) -> JSONResponse:
        return JSONResponse(
            status_code=503, content={"error": f"ClickHouse: {str(exc).splitlines()[0]}"}
        )

    @app.exception_handler(KafkaUnavailable)
    async def kafka_unavailable(_request: Request, exc: KafkaUnavailable) -> JSONResponse:
        return JSONResponse(status_code=503, content={"error": f"{exc}: nothing was written"})

    @app.exception_handler(NotFound)
    async def not_found(_request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"error": str(exc)})

    @app.exception_handler(NotAcceptable)
    async def not_acceptable(_request: Request, exc: NotAcceptable) -> JSONResponse:
        return JSONResponse(status_code=406, content={"error": str(exc)})

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(
            status_code=exc.status_code, content={"error": exc.detail}, headers=exc.headers
        )

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
        location = [str(part) for part in first.get("loc", ()) if part not in ("body", "query")]
        parameter = ".".join(location) or "body"
        message = first["msg"]
        if first["type"] in ("json_invalid", "model_attributes_type", "dict_type"):
            parameter = "body"  # invalid JSON is located by a character offset
            message = (
                f"expected a JSON object, sent with Content-Type: application/json ({message})"
            )
        return JSONResponse(
            status_code=400,
            content={"error": f"invalid parameter {parameter}: {message}", "parameter": parameter},
        )
