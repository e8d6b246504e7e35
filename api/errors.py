"""Errors as JSON that name what was wrong: `{"error": ..., "parameter": ...}`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

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


class Forbidden(PermissionError):
    """A valid token that may not do this (403): the message names what it may not touch."""


class Conflict(RuntimeError):
    """A request the resource's state does not allow (e.g. activating an ended job)."""


class TooLarge(ValueError):
    """A request over a configured size (413), e.g. a push of too many readings or bytes."""


class Busy(RuntimeError):
    """A configured limit of concurrent work is reached (503), e.g. live streams."""


def error_parameter(error: Mapping[str, Any]) -> tuple[str, str]:
    """The parameter (or body field) a pydantic error is about, and its message."""
    location = [str(part) for part in error.get("loc", ()) if part not in ("body", "query")]
    parameter, message = ".".join(location) or "body", str(error["msg"])
    if error["type"] in ("json_invalid", "model_attributes_type", "dict_type"):
        parameter = "body"  # invalid JSON is located by a character offset
        message = f"expected a JSON object, sent with Content-Type: application/json ({message})"
    return parameter, message


def _kafka_unavailable(exc: Exception) -> str:
    """What a failed Kafka write left behind: nothing, or the messages acknowledged first."""
    acknowledged = getattr(exc, "acknowledged", 0)
    if acknowledged:
        return (
            f"{exc}: the messages of {acknowledged} device(s) had been acknowledged "
            "and are written, the others not"
        )
    return f"{exc}: nothing was written"


def _parameter_response(parameter: str, message: str) -> JSONResponse:
    return JSONResponse(
        status_code=400,
        content={"error": f"invalid parameter {parameter}: {message}", "parameter": parameter},
    )


# Exceptions answered as `{"error": <message>}`: their status and message.
_ANSWERS: dict[type[Exception], tuple[int, Callable[[Exception], str]]] = {
    ClickHouseUnavailable: (503, str),
    OperationalError: (503, lambda exc: f"ClickHouse: {str(exc).splitlines()[0]}"),
    KafkaUnavailable: (503, _kafka_unavailable),
    NotFound: (404, str),
    Conflict: (409, str),
    Forbidden: (403, str),
    NotAcceptable: (406, str),
    TooLarge: (413, str),
    Busy: (503, str),
}


def _answer(
    status: int, describe: Callable[[Exception], str]
) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handler(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": describe(exc)})

    return handler


def install(app: FastAPI) -> None:
    for kind, (status, describe) in _ANSWERS.items():
        app.add_exception_handler(kind, _answer(status, describe))

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(
            status_code=exc.status_code, content={"error": exc.detail}, headers=exc.headers
        )

    @app.exception_handler(ParameterError)
    async def parameter_error(_request: Request, exc: ParameterError) -> JSONResponse:
        return _parameter_response(exc.parameter, exc.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _parameter_response(*error_parameter(exc.errors()[0]))
