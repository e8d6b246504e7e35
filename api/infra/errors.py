"""Errors as JSON that name what was wrong: `{"error": ..., "parameter": ...}`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import urllib3.exceptions
from clickhouse_connect.driver.exceptions import OperationalError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from api.infra.clickhouse import ClickHouseUnavailable, failure
from api.infra.kafka import KafkaUnavailable


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
    """A configured limit of concurrent work is reached (503 with Retry-After), e.g. live
    streams or exports."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


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
    KafkaUnavailable: (503, _kafka_unavailable),
    NotFound: (404, str),
    Conflict: (409, str),
    Forbidden: (403, str),
    NotAcceptable: (406, str),
    TooLarge: (413, str),
}


def _answer(
    status: int, describe: Callable[[Exception], str]
) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handler(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": describe(exc)})

    return handler


_ERROR_BODY = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
# What any operation may answer, whatever its own documentation says.
_ANY_OPERATION = {
    "503": "ClickHouse down or restarting, or a limit of concurrent work reached",
    "504": "ClickHouse did not answer within JOBSCOPE_QUERY_TIMEOUT_S",
}


def _documented(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """The app's OpenAPI with the errors it really answers: a request that fails validation
    is a 400 `ErrorBody` (FastAPI documents a 422 it never sends here), and any operation
    may answer 503 or 504 when ClickHouse fails."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = build()
        for item in spec.get("paths", {}).values():
            for operation in item.values():
                responses = operation.setdefault("responses", {})
                if responses.pop("422", None) is not None:
                    responses.setdefault(
                        "400", {"description": "a bad parameter", "content": _ERROR_BODY}
                    )
                if operation.get("operationId") == "get_health":
                    continue  # answers within its own timeout, with its own body
                for status, description in _ANY_OPERATION.items():
                    answer = {"description": description, "content": _ERROR_BODY}
                    responses.setdefault(status, answer)
        schemas = spec.get("components", {}).get("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        app.openapi_schema = spec
        return spec

    return openapi


def install(app: FastAPI) -> None:
    app.openapi = _documented(app)  # type: ignore[method-assign]
    for kind, (status, describe) in _ANSWERS.items():
        app.add_exception_handler(kind, _answer(status, describe))

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(
            status_code=exc.status_code, content={"error": exc.detail}, headers=exc.headers
        )

    @app.exception_handler(ClickHouseUnavailable)
    async def clickhouse_unavailable(_request: Request, exc: ClickHouseUnavailable) -> JSONResponse:
        return JSONResponse(status_code=exc.status, content={"error": str(exc)})

    async def clickhouse_failed(request: Request, exc: Exception) -> JSONResponse:
        timeout_s = request.app.state.settings.query_timeout_s
        status, message = failure(exc, request.app.state.clickhouse.url, timeout_s)
        return JSONResponse(status_code=status, content={"error": message})

    app.add_exception_handler(OperationalError, clickhouse_failed)
    app.add_exception_handler(urllib3.exceptions.HTTPError, clickhouse_failed)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(_request: Request, _exc: ClientDisconnect) -> Response:
        return Response(status_code=400)  # never sent: the client left mid-request (or was cut)

    @app.exception_handler(Busy)
    async def busy(_request: Request, exc: Busy) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse(status_code=503, content={"error": str(exc)}, headers=headers)

    @app.exception_handler(ParameterError)
    async def parameter_error(_request: Request, exc: ParameterError) -> JSONResponse:
        return _parameter_response(exc.parameter, exc.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _parameter_response(*error_parameter(exc.errors()[0]))
