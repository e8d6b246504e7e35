"""The one error the client and the CLI report: what went wrong, in a line a user reads."""

from __future__ import annotations


class ApiError(Exception):
    """What went wrong, in one line a user understands; `status` is the HTTP status (0 when
    the API could not be reached) and `parameter` the request parameter at fault, if any."""

    def __init__(self, message: str, status: int = 0, parameter: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.parameter = parameter
