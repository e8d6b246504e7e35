"""ClickHouse exceptions as the HTTP interface reports them: code, name, message, status."""

from __future__ import annotations

import re

ENGINE_VERSION = "26.1.2.1"

# Codes this server raises itself (names as ClickHouse spells them).
SYNTAX_ERROR = 62
UNKNOWN_FORMAT = 73
NOT_IMPLEMENTED = 48
READONLY = 164
AUTHENTICATION_FAILED = 516
ACCESS_DENIED = 497
TOO_MANY_SIMULTANEOUS_QUERIES = 202
QUERY_IS_TOO_LARGE = 62
CANNOT_DECOMPRESS = 271
UNKNOWN_SETTING = 115
SERVER_SHUTTING_DOWN = 210  # NETWORK_ERROR: what a client sees of a server going away
SESSION_IS_LOCKED = 373
BAD_ARGUMENTS = 36
QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING = 216
INCORRECT_DATA = 117
CANNOT_PARSE_INPUT_ASSERTION_FAILED = 27
SOCKET_TIMEOUT = 209
CANNOT_READ_ALL_DATA = 33
ARGUMENT_OUT_OF_BOUND = 69
LIMIT_EXCEEDED = 290

_NAMES = {
    SYNTAX_ERROR: "SYNTAX_ERROR",
    UNKNOWN_FORMAT: "UNKNOWN_FORMAT",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    READONLY: "READONLY",
    AUTHENTICATION_FAILED: "AUTHENTICATION_FAILED",
    ACCESS_DENIED: "ACCESS_DENIED",
    TOO_MANY_SIMULTANEOUS_QUERIES: "TOO_MANY_SIMULTANEOUS_QUERIES",
    CANNOT_DECOMPRESS: "CANNOT_DECOMPRESS",
    UNKNOWN_SETTING: "UNKNOWN_SETTING",
    SERVER_SHUTTING_DOWN: "NETWORK_ERROR",
    SESSION_IS_LOCKED: "SESSION_IS_LOCKED",
    BAD_ARGUMENTS: "BAD_ARGUMENTS",
    QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING: "QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING",
    INCORRECT_DATA: "INCORRECT_DATA",
    CANNOT_PARSE_INPUT_ASSERTION_FAILED: "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
    SOCKET_TIMEOUT: "SOCKET_TIMEOUT",
    CANNOT_READ_ALL_DATA: "CANNOT_READ_ALL_DATA",
    ARGUMENT_OUT_OF_BOUND: "ARGUMENT_OUT_OF_BOUND",
    LIMIT_EXCEEDED: "LIMIT_EXCEEDED",
}

# HTTP statuses as ClickHouse's HTTP handler maps exception codes; anything else is 500.
_STATUS = {
    AUTHENTICATION_FAILED: 403,
    ACCESS_DENIED: 403,
    READONLY: 403,
    194: 401,  # REQUIRED_PASSWORD
    TOO_MANY_SIMULTANEOUS_QUERIES: 503,
    SERVER_SHUTTING_DOWN: 503,
    LIMIT_EXCEEDED: 413,  # a request body over a limit of this server (ClickHouse: 500)
    **dict.fromkeys((27, 33, 38, 62, 69, 70, 73, 115, 271, 457, 456, 36, 53, 6), 400),
    **dict.fromkeys((46, 47, 60, 81, 16), 404),
}

_CODE_RE = re.compile(r"Code: (\d+)\. ")
_WRAPPED_RE = re.compile(r"^(?:Streaming query failed: )?(?:Code: \d+\. DB::Exception: )+")


class ClickHouseError(Exception):
    """An error with a ClickHouse exception code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return _STATUS.get(self.code, 500)

    def body(self) -> bytes:
        """The response body ClickHouse would send: `Code: N. DB::Exception: ... (NAME)`."""
        text = self.message
        name = _NAMES.get(self.code)
        if name and not text.endswith(f"({name})"):
            text = f"{text} ({name})"
        return f"Code: {self.code}. DB::Exception: {text} (version {ENGINE_VERSION})\n".encode()

    @classmethod
    def from_engine(cls, exc: BaseException) -> ClickHouseError:
        """Wrap an exception raised by chdb, keeping the engine's code and message."""
        text = str(exc).strip()
        match = _CODE_RE.search(text)
        code = int(match.group(1)) if match else 1001  # STD_EXCEPTION
        message = _WRAPPED_RE.sub("", text)
        message = re.sub(r" \(version [\d.]+\)(?=\.? \(|\.?$)", "", message).rstrip(".")
        return cls(code, message)
