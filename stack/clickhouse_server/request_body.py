"""A request's body as the server takes it: only once the request is authenticated, read from
the socket in slices, de-chunked and decompressed slice by slice, under the limits of
ServerSettings. No client-chosen size (a chunk's, a compression ratio) decides how much is
read or held at once."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler

from stack.clickhouse_server.compression import decompressed, request_encoding
from stack.clickhouse_server.config import ServerSettings
from stack.clickhouse_server.errors import (
    ARGUMENT_OUT_OF_BOUND,
    CANNOT_PARSE_INPUT_ASSERTION_FAILED,
    CANNOT_READ_ALL_DATA,
    LIMIT_EXCEEDED,
    ClickHouseError,
)

# Framing lines (a chunk's size, a trailer) are read at most this long, and trailers at most
# this many: the framing itself never makes the server buffer without bound.
MAX_LINE = 8192
MAX_TRAILER_LINES = 100
_HEX = re.compile(rb"[0-9A-Fa-f]+")


class RequestBody:
    """The request body, de-chunked and decompressed, read incrementally in bounded slices."""

    def __init__(
        self, handler: BaseHTTPRequestHandler, settings: ServerSettings, send_continue: bool
    ) -> None:
        headers = handler.headers
        self._rfile = handler.rfile
        self._wfile = handler.wfile
        self._settings = settings
        self._chunked = _is_chunked(headers)
        self._remaining = 0 if self._chunked else _content_length(headers)
        self._encoding = request_encoding(headers.get("Content-Encoding"))
        self._send_continue = send_continue
        self._raw_bytes = 0
        self._stream: Iterator[bytes] | None = None
        self.finished = not self._chunked and self._remaining == 0
        """Whether the body has been read to its end (the connection may then serve another
        request)."""

    @staticmethod
    def declared(headers: Mapping[str, str]) -> bool:
        """Whether the request announces a body: then its bytes follow the headers."""
        length = (headers.get("Content-Length") or "").strip().lstrip("0")
        return _is_chunked(headers) or bool(length)

    def chunks(self) -> Iterator[bytes]:
        """The decoded body in pieces of at most `body_slice_bytes` (one iterator per request:
        a second call goes on where the first stopped)."""
        if self._stream is None:
            self._stream = self._decoded()
        return self._stream

    def _decoded(self) -> Iterator[bytes]:
        settings = self._settings
        total = 0
        for piece in decompressed(
            self._encoding, self._raw(), settings.body_slice_bytes, settings.zstd_max_window_bytes
        ):
            total += len(piece)
            if total > settings.max_body_bytes:
                raise _too_large(settings.max_body_bytes, "once decompressed")
            yield piece

    def _raw(self) -> Iterator[bytes]:
        if self.finished:
            return
        if self._send_continue:  # the client waits for this before it sends the body
            self._send_continue = False
            self._wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        for data in self._chunks() if self._chunked else self._sized():
            self._raw_bytes += len(data)
            if self._raw_bytes > self._settings.max_body_bytes:
                raise _too_large(self._settings.max_body_bytes, "as sent")
            yield data
        self.finished = True

    def _read(self, size: int) -> bytes:
        data = self._rfile.read(min(size, self._settings.body_slice_bytes))
        if not data:
            raise ClickHouseError(
                CANNOT_READ_ALL_DATA, "The request body ended before the size it announced"
            )
        return data

    def _sized(self) -> Iterator[bytes]:
        while self._remaining > 0:
            data = self._read(self._remaining)
            self._remaining -= len(data)
            yield data

    def _chunks(self) -> Iterator[bytes]:
        while size := self._chunk_size():
            while size > 0:
                data = self._read(size)
                size -= len(data)
                yield data
            if self._rfile.readline(MAX_LINE).strip():
                raise _malformed("a chunk is not followed by CRLF")
        for _ in range(MAX_TRAILER_LINES):
            if self._rfile.readline(MAX_LINE) in (b"\r\n", b"\n", b""):
                return
        raise _malformed(f"more than {MAX_TRAILER_LINES} trailer lines")

    def _chunk_size(self) -> int:
        line = self._rfile.readline(MAX_LINE)
        if not line:
            raise ClickHouseError(
                CANNOT_READ_ALL_DATA, "The request body ended before its last chunk"
            )
        digits = line.split(b";", 1)[0].strip()
        if not _HEX.fullmatch(digits):
            raise _malformed(f"Malformed chunk size in the request body: {line[:64]!r}")
        size = int(digits, 16)
        if size > self._settings.max_chunk_size:
            raise ClickHouseError(
                ARGUMENT_OUT_OF_BOUND,
                f"Chunk size exceeded the limit (max size: {self._settings.max_chunk_size}, "
                "setting max_chunk_size)",
            )
        return size


def _is_chunked(headers: Mapping[str, str]) -> bool:
    return "chunked" in (headers.get("Transfer-Encoding") or "").lower()


def _content_length(headers: Mapping[str, str]) -> int:
    value = (headers.get("Content-Length") or "0").strip()
    if not (value.isascii() and value.isdigit()):
        raise _malformed(f"Malformed Content-Length: {value[:64]!r}")
    return int(value)


def _malformed(message: str) -> ClickHouseError:
    return ClickHouseError(CANNOT_PARSE_INPUT_ASSERTION_FAILED, message)


def _too_large(limit: int, how: str) -> ClickHouseError:
    return ClickHouseError(
        LIMIT_EXCEEDED, f"Request body over {limit} bytes {how} (setting max_body_bytes)"
    )
