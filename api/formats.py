"""Output formats of readings. ClickHouse produces the bytes; the API streams them in large
blocks, never one Python object per reading.

| format  | media type                            | made by ClickHouse as               |
|---------|---------------------------------------|-------------------------------------|
| json    | application/json                      | JSONEachRow, joined into one array  |
| ndjson  | application/x-ndjson                  | JSONEachRow                         |
| csv     | text/csv                              | CSVWithNames, labels as JSON text   |
| parquet | application/vnd.apache.parquet        | Parquet, timestamps in microseconds |
| arrow   | application/vnd.apache.arrow.stream   | ArrowStream (Arrow IPC stream)      |

Text formats carry Kwollect's timestamp (ISO 8601, microseconds, `+00:00`); Parquet and
Arrow carry a UTC timestamp type and labels as a map. JSON and NDJSON carry `_device_orig`
as a list of device ids, as Kwollect does; CSV, Parquet and Arrow, whose labels map text to
text, as a comma-separated string.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import quote

from clickhouse_connect.driver.client import Client

from api.infra.errors import NotAcceptable, ParameterError
from api.infra.streaming import ExportResponse
from api.queries import iso_sql
from api.queries.metrics import readings_stream

BLOCK_SIZE = 1 << 18
ORIGINS = "_device_orig"
_LABEL = "Variant(String, Array(String))"
JSON_LABELS = (
    f"mapApply((k, v) -> (k, if(k = '{ORIGINS}', CAST(splitByChar(',', v), '{_LABEL}'), "
    f"CAST(v, '{_LABEL}'))), lab)"
)
"""Labels as Kwollect's JSON has them: `_device_orig` a list of device ids (the queries keep
it as a comma-separated string: a map's values share one type)."""


@dataclass(frozen=True)
class Format:
    name: str
    media_type: str
    clickhouse: str
    timestamp: str
    labels: str
    extension: str


FORMATS = {
    f.name: f
    for f in (
        Format("json", "application/json", "JSONEachRow", iso_sql("ts"), JSON_LABELS, "json"),
        Format(
            "ndjson", "application/x-ndjson", "JSONEachRow", iso_sql("ts"), JSON_LABELS, "ndjson"
        ),
        Format("csv", "text/csv", "CSVWithNames", iso_sql("ts"), "toJSONString(lab)", "csv"),
        Format("parquet", "application/vnd.apache.parquet", "Parquet", "ts", "lab", "parquet"),
        Format("arrow", "application/vnd.apache.arrow.stream", "ArrowStream", "ts", "lab", "arrow"),
    )
}
_BY_MEDIA_TYPE = {f.media_type: f for f in FORMATS.values()} | {
    "application/x-parquet": FORMATS["parquet"],
    "application/parquet": FORMATS["parquet"],
    "application/jsonl": FORMATS["ndjson"],
}


def choose(format_param: str | None, accept: str | None) -> Format:
    """`format=` wins; otherwise the first acceptable media type of `Accept` (by q); JSON
    when neither says anything."""
    if format_param:
        try:
            return FORMATS[format_param.strip().lower()]
        except KeyError:
            raise ParameterError("format", f"expected one of {', '.join(FORMATS)}") from None
    if not accept:
        return FORMATS["json"]
    ranked = []
    for i, item in enumerate(accept.split(",")):
        media, *options = (part.strip() for part in item.split(";"))
        q = 1.0
        for option in options:
            name, _, value = option.partition("=")
            if name.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        ranked.append((-q, i, media.lower()))
    for neg_q, _, media in sorted(ranked):
        if neg_q >= 0:
            continue
        if media in _BY_MEDIA_TYPE:
            return _BY_MEDIA_TYPE[media]
        if media in ("*/*", "application/*", "text/*"):
            return FORMATS["csv"] if media == "text/*" else FORMATS["json"]
    raise NotAcceptable(
        f"none of {accept!r} can be produced: " + ", ".join(f.media_type for f in FORMATS.values())
    )


def json_array(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """JSONEachRow -> JSON array. Newlines inside JSON strings are escaped, so each raw
    newline ends a row; the last separator is held back so it can close the array."""
    yield b"["
    carry = b""
    for chunk in chunks:
        data = carry + chunk.replace(b"\n", b",\n")
        carry, out = data[-2:], data[:-2]
        if out:
            yield out
    yield (b"\n" if carry == b",\n" else carry) + b"]\n"


def blocks(stream: IO[bytes], size: int = BLOCK_SIZE) -> Iterator[bytes]:
    """Read a response in large blocks: iterating it would yield one row (line) at a time."""
    try:
        while block := stream.read(size):
            yield block
    finally:
        stream.close()


def stream(
    client: Client,
    rows: str,
    params: dict[str, Any],
    fmt: Format,
    filename: str,
    send_timeout_s: float,
    release: Callable[[], None],
) -> ExportResponse:
    """Run the query and stream its output in `fmt`; `release` runs once the answer ends
    (or the query fails to start)."""
    headers = {"Content-Disposition": content_disposition(f"{filename}.{fmt.extension}")}
    try:
        raw = readings_stream(client, rows, params, fmt.timestamp, fmt.labels, fmt.clickhouse)
    except BaseException:
        release()
        raise
    body = blocks(raw)
    if fmt.name == "json":
        body = json_array(body)

    def closed() -> None:
        raw.close()  # a query still running is cancelled by ClickHouse when its client goes
        release()

    return ExportResponse(body, fmt.media_type, headers, send_timeout_s, closed)


def content_disposition(filename: str) -> str:
    """`inline` with the file name, as ASCII and (RFC 6266) in UTF-8: a job id may be any
    text, and a header is Latin-1."""
    ascii_name = "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in filename
    )
    return f"inline; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename, safe='')}"
