"""HTTP body compression: request `Content-Encoding`, response by `Accept-Encoding`."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator

import lz4.frame
import zstandard

from clickhouse.server.errors import CANNOT_DECOMPRESS, NOT_IMPLEMENTED, ClickHouseError

# Response encodings this server produces, most preferred first when the client ranks them alike.
RESPONSE_ENCODINGS = ("lz4", "zstd", "gzip", "deflate")


def decompressor(encoding: str | None) -> Callable[[bytes], bytes]:
    """A function that decompresses successive chunks of a request body."""
    encoding = (encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return lambda chunk: chunk
    if encoding in ("gzip", "x-gzip"):
        return _checked(zlib.decompressobj(16 + zlib.MAX_WBITS).decompress)
    if encoding == "deflate":
        return _checked(zlib.decompressobj().decompress)
    if encoding == "zstd":
        return _checked(zstandard.ZstdDecompressor().decompressobj().decompress)
    if encoding == "lz4":
        return _checked(lz4.frame.LZ4FrameDecompressor().decompress)
    raise ClickHouseError(NOT_IMPLEMENTED, f"Unsupported Content-Encoding: {encoding}")


def _checked(fn: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
    def run(chunk: bytes) -> bytes:
        try:
            return fn(chunk)
        except Exception as exc:
            raise ClickHouseError(
                CANNOT_DECOMPRESS, f"Cannot decompress request body: {exc}"
            ) from exc

    return run


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
