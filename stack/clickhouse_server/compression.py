"""HTTP body compression: request `Content-Encoding`, response by `Accept-Encoding`."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import lz4.frame
import zstandard

from stack.clickhouse_server.errors import CANNOT_DECOMPRESS, NOT_IMPLEMENTED, ClickHouseError

# Response encodings this server produces, most preferred first when the client ranks them alike.
RESPONSE_ENCODINGS = ("lz4", "zstd", "gzip", "deflate")


REQUEST_ENCODINGS = ("gzip", "x-gzip", "deflate", "zstd", "lz4")


def request_encoding(content_encoding: str | None) -> str:
    """The request body's encoding, normalised ('' for none); refused when not supported."""
    encoding = (content_encoding or "").strip().lower()
    if encoding == "identity":
        return ""
    if encoding and encoding not in REQUEST_ENCODINGS:
        raise ClickHouseError(NOT_IMPLEMENTED, f"Unsupported Content-Encoding: {encoding}")
    return encoding


def decompressed(
    encoding: str, raw: Iterator[bytes], slice_bytes: int, zstd_max_window: int
) -> Iterator[bytes]:
    """The decoded body in pieces of at most `slice_bytes`, however much one piece of `raw`
    expands (a compression bomb never makes more than a slice at once). Pieces of `raw`
    must be at most `slice_bytes` too; errors they raise pass through as they are."""
    if not encoding:
        return raw
    if encoding == "zstd":
        return _reported(_unzstd(raw, slice_bytes, zstd_max_window))
    if encoding == "lz4":
        return _reported(_unlz4(raw, slice_bytes))
    wbits = zlib.MAX_WBITS + (16 if encoding in ("gzip", "x-gzip") else 0)
    return _reported(_inflate(zlib.decompressobj(wbits), raw, slice_bytes))


def _inflate(inflater: Any, raw: Iterator[bytes], limit: int) -> Iterator[bytes]:
    for data in raw:
        while True:
            out = inflater.decompress(data, limit)
            if out:
                yield out
            data = inflater.unconsumed_tail
            if not data and len(out) < limit:  # a full slice may leave output pending
                break


def _unlz4(raw: Iterator[bytes], limit: int) -> Iterator[bytes]:
    frames = lz4.frame.LZ4FrameDecompressor()
    for data in raw:
        while True:
            out = frames.decompress(data, max_length=limit)
            if out:
                yield out
            data = b""
            if frames.eof and frames.unused_data:  # a further frame follows
                data = frames.unused_data
                frames = lz4.frame.LZ4FrameDecompressor()
            elif frames.needs_input:
                break


class _Source:
    """A read-only file over a body's raw pieces, for zstandard's stream reader."""

    def __init__(self, raw: Iterator[bytes]) -> None:
        self._raw = raw

    def read(self, _size: int = -1) -> bytes:
        return next(self._raw, b"")


def _unzstd(raw: Iterator[bytes], limit: int, max_window: int) -> Iterator[bytes]:
    decompressor = zstandard.ZstdDecompressor(max_window_size=max_window)
    reader = decompressor.stream_reader(_Source(raw), read_size=limit, read_across_frames=True)
    try:
        while out := reader.read(limit):
            yield out
    except zstandard.ZstdError as exc:
        if "memory" not in str(exc):
            raise
        raise ClickHouseError(
            CANNOT_DECOMPRESS,
            f"Cannot decompress request body: {exc}: the zstd window is larger than "
            f"{max_window} bytes (setting zstd_max_window_bytes)",
        ) from exc


def _reported(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """Codec errors as ClickHouse reports them; the socket's own errors pass through."""
    try:
        yield from pieces
    except (ClickHouseError, OSError):
        raise
    except Exception as exc:
        raise ClickHouseError(CANNOT_DECOMPRESS, f"Cannot decompress request body: {exc}") from exc


def choose_encoding(accept_encoding: str | None) -> str | None:
    """The first encoding of the client's `Accept-Encoding` that this server produces."""
    offered = [part.split(";")[0].strip().lower() for part in (accept_encoding or "").split(",")]
    for name in offered:
        if name in RESPONSE_ENCODINGS:
            return name
    return None


def compress_stream(chunks: Iterable[bytes], encoding: str | None) -> Iterator[bytes]:
    """Compress a response body chunk by chunk (or pass it through when encoding is None)."""
    if encoding is None:
        yield from chunks
        return
    if encoding == "lz4":
        comp = lz4.frame.LZ4FrameCompressor()
        yield comp.begin()
        for chunk in chunks:
            yield comp.compress(chunk)
        yield comp.flush()
        return
    if encoding == "zstd":
        zobj = zstandard.ZstdCompressor(level=1).compressobj()
        for chunk in chunks:
            yield zobj.compress(chunk)
        yield zobj.flush()
        return
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    zl = zlib.compressobj(1, zlib.DEFLATED, wbits)
    for chunk in chunks:
        yield zl.compress(chunk)
    yield zl.flush()
