"""multipart/form-data requests, as ClickHouse takes them: clients put the query and its
`param_*` values in form fields when they are too long for a URL (clickhouse-connect does so
past 4 KiB of bound parameters), and each part with a file name is an external table for
the query: its data, named by the part, described by the `<name>_structure` (or
`<name>_types`) and `<name>_format` parameters."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP

from stack.clickhouse_server.errors import (
    BAD_ARGUMENTS,
    LIMIT_EXCEEDED,
    NOT_IMPLEMENTED,
    ClickHouseError,
)

# Form fields that are never parameters: credentials come from the headers or the URL only, as
# in ClickHouse, since the form is read after the request is authenticated.
CREDENTIAL_FIELDS = frozenset({"user", "password", "quota_key"})


def is_form(content_type: str | None) -> bool:
    return (content_type or "").lower().startswith("multipart/form-data")


def read_form(chunks: Iterable[bytes], limit: int) -> bytes:
    """The whole (decompressed) form body, refused as soon as it passes `limit` bytes."""
    parts, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise ClickHouseError(
                LIMIT_EXCEEDED,
                f"multipart/form-data body over {limit} bytes (setting max_form_bytes)",
            )
        parts.append(chunk)
    return b"".join(parts)


@dataclass(frozen=True)
class Form:
    fields: dict[str, str]
    """Parameters given as form fields (the query, `param_*`, settings)."""
    files: dict[str, bytes]
    """External tables' data by table name."""


def parse_form(content_type: str, body: bytes) -> Form:
    """The fields and files of a multipart/form-data body by name."""
    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body
    )
    if not message.is_multipart():
        raise ClickHouseError(NOT_IMPLEMENTED, "malformed multipart/form-data body")
    form = Form({}, {})
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            continue
        payload = part.get_payload(decode=True) or b""
        if part.get_filename() is not None:
            form.files[str(name)] = payload
        elif name not in CREDENTIAL_FIELDS:
            form.fields[str(name)] = payload.decode("utf-8")
    return form


@dataclass(frozen=True)
class ExternalTable:
    name: str
    structure: str
    """`name Type, ...` as ClickHouse's `<name>_structure` (or made of `<name>_types`)."""
    format: str
    data: bytes


def external_tables(files: dict[str, bytes], params: dict[str, str]) -> list[ExternalTable]:
    """The external tables of a form, their parameters taken out of `params` (they are not
    query settings)."""
    tables = []
    for name, data in files.items():
        structure = params.pop(f"{name}_structure", None)
        types = params.pop(f"{name}_types", None)
        if structure is None and types is not None:
            structure = ", ".join(f"_{i} {t.strip()}" for i, t in enumerate(types.split(","), 1))
        if not structure:
            raise ClickHouseError(
                BAD_ARGUMENTS,
                f"Neither structure nor types have not been provided for external table {name}. "
                f"Use fields {name}_structure or {name}_types to do so.",
            )
        fmt = params.pop(f"{name}_format", "TabSeparated")
        tables.append(ExternalTable(name, structure, fmt, data))
    return tables
