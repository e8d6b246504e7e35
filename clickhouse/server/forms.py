"""multipart/form-data requests, as ClickHouse takes them: clients put the query and its
`param_*` values in form fields when they are too long for a URL (clickhouse-connect does so
past 4 KiB of bound parameters). Parts with a file name are external tables, which this
server does not provide: refused with a clear error rather than read as SQL."""

from __future__ import annotations

from collections.abc import Iterable
from email.parser import BytesParser
from email.policy import HTTP

from clickhouse.server.errors import NOT_IMPLEMENTED, QUERY_IS_TOO_LARGE, ClickHouseError

MAX_FORM_BYTES = 64 << 20


def is_form(content_type: str | None) -> bool:
    return (content_type or "").lower().startswith("multipart/form-data")


def read_form(chunks: Iterable[bytes]) -> bytes:
    """The whole form body, refused past MAX_FORM_BYTES as soon as it gets there (it is
    read before the credentials are checked)."""
    parts, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            raise ClickHouseError(QUERY_IS_TOO_LARGE, f"form body over {MAX_FORM_BYTES} bytes")
        parts.append(chunk)
    return b"".join(parts)


def form_fields(content_type: str, body: bytes) -> dict[str, str]:
    """The fields of a multipart/form-data body by name."""
    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body
    )
    if not message.is_multipart():
        raise ClickHouseError(NOT_IMPLEMENTED, "malformed multipart/form-data body")
    fields: dict[str, str] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            continue
        if part.get_filename() is not None:
            raise ClickHouseError(
                NOT_IMPLEMENTED,
                f"external table {name!r} (a file part of a form): external tables are not "
                "supported by this server",
            )
        payload = part.get_payload(decode=True) or b""
        fields[str(name)] = payload.decode("utf-8")
    return fields
