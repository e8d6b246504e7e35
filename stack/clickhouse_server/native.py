"""Native output in the layout of the client's protocol revision (`client_protocol_version`).

The engine (chdb) writes Native as ClickHouse does for revision 0, the HTTP default: no
BlockInfo before a block, and a top-level `DateTime('zone')` column typed plain `DateTime`
(ClickHouse strips only a type name that starts with `DateTime(`: nested zones and
DateTime64 keep theirs). A client that sends `client_protocol_version` (clickhouse-connect
sends 54405 once its start-up probe succeeds, on every Native query) reads what ClickHouse's
NativeWriter writes for that revision, and this module turns the one into the other:

- BlockInfo before every block (revision > 0; with its out-of-order-buckets field from 54480);
- the zone back into the type name of top-level DateTime columns (revision >= 54337), taken
  from `DESCRIBE (<query>)`, which the engine answers with the full types;
- a "no custom serialization" byte after every type name (revision >= 54454).

Cost: a streamed chunk is one Native block, so when no type name needs its zone back and
the revision is below 54454, a chunk is its BlockInfo plus the chunk's bytes, with no
per-row work. Otherwise column boundaries are found by skipping each column's data (types
sized below); a type that cannot be sized fails the request only if the walk has to pass it.

Not honoured (the request fails with NOT_IMPLEMENTED naming the column type rather than
sending bytes the client would misread): revisions 1..54404 with LowCardinality columns
(ClickHouse would convert them to their plain type), AggregateFunction states from 54452
(versioned states) and Dynamic/JSON/Object from 54473 (their V2 serialization). Later
gates change nothing here: sparse and replicated columns (54465, 54482, 54483) only follow a
custom-serialization byte other than 0, and size-stream Strings (54492) are newer than the
engine's ClickHouse 26.1, which would not write them either.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from stack.clickhouse_server.engine import EngineConnection
from stack.clickhouse_server.errors import (
    BAD_ARGUMENTS,
    INCORRECT_DATA,
    NOT_IMPLEMENTED,
    ClickHouseError,
)
from stack.clickhouse_server.statements import trailing_format

log = logging.getLogger("clickhouse.server")

# Protocol revisions (ClickHouse's src/Core/ProtocolDefines.h) whose gates change Native output.
TIME_ZONE_IN_DATETIME = 54337
LOW_CARDINALITY = 54405
AGGREGATE_FUNCTIONS_VERSIONING = 54452
CUSTOM_SERIALIZATION = 54454
V2_DYNAMIC_AND_JSON = 54473
OUT_OF_ORDER_BUCKETS = 54480

_LOW_CARDINALITY = re.compile(r"(?<![\w'`])LowCardinality\(")
_AGGREGATE_FUNCTION = re.compile(r"(?<![\w'`])AggregateFunction\(")
_DYNAMIC_OR_JSON = re.compile(r"(?<![\w'`])(?:Dynamic|JSON|Object)(?=[(),]|$)")
_ELEMENT_NAME = re.compile(r"(?:`(?:[^`\\]|\\.)*`|[A-Za-z_][A-Za-z0-9_]*)\s+(?=\S)")

_FIXED_WIDTH = {
    **dict.fromkeys(("UInt8", "Int8", "Bool", "Enum8", "Nothing"), 1),
    **dict.fromkeys(("UInt16", "Int16", "Date", "Enum16", "BFloat16"), 2),
    **dict.fromkeys(
        ("UInt32", "Int32", "Float32", "Date32", "DateTime", "IPv4", "Time", "Decimal32"), 4
    ),
    **dict.fromkeys(("UInt64", "Int64", "Float64", "DateTime64", "Time64", "Decimal64"), 8),
    **dict.fromkeys(("UInt128", "Int128", "UUID", "IPv6", "Decimal128", "Point"), 16),
    **dict.fromkeys(("UInt256", "Int256", "Decimal256"), 32),
}
# Geo types are arrays of points under another name.
_ALIASES = {
    "Ring": "Array(Point)",
    "LineString": "Array(Point)",
    "Polygon": "Array(Array(Point))",
    "MultiLineString": "Array(Array(Point))",
    "MultiPolygon": "Array(Array(Array(Point)))",
}
_LC_GLOBAL_DICTIONARY = 1 << 8
_LC_ADDITIONAL_KEYS = 1 << 9


def client_revision(params: Mapping[str, str]) -> int:
    """The request's `client_protocol_version` (0 when absent, as in ClickHouse)."""
    value = params.get("client_protocol_version", "").strip()
    if not value:
        return 0
    if not value.isdigit():
        raise ClickHouseError(
            BAD_ARGUMENTS, f"client_protocol_version must be a number, got {value!r}"
        )
    return int(value)


def block_info(revision: int) -> bytes:
    """BlockInfo as ClickHouse writes it for a result block: not an overflow row, bucket -1."""
    buckets = b"\x03\x00" if revision >= OUT_OF_ORDER_BUCKETS else b""  # no out-of-order buckets
    return b"\x01\x00\x02\xff\xff\xff\xff" + buckets + b"\x00"


# --- column types and their sizes ------------------------------------------------------


@dataclass(frozen=True)
class _Type:
    """How a column type is laid out in Native: what its data walk needs to know."""

    kind: str  # fixed, string, nullable, array, tuple, low_cardinality, unsized
    name: str
    width: int = 0
    children: tuple[_Type, ...] = ()


def _split_arguments(text: str) -> list[str]:
    """Top-level comma-separated arguments of a type, quotes and parentheses respected."""
    parts: list[str] = []
    depth, start, quote, i = 0, 0, "", 0
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "'`\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
        i += 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _without_element_name(element: str) -> str:
    """`name Type` (a named Tuple element) -> `Type`."""
    match = _ELEMENT_NAME.match(element)
    return element[match.end() :] if match else element


def _decimal_width(precision: int) -> int:
    return 4 if precision <= 9 else 8 if precision <= 18 else 16 if precision <= 38 else 32


@functools.lru_cache(maxsize=1024)
def _parse_type(name: str) -> _Type:
    """A type name as ClickHouse prints it, as a layout tree."""
    name = _ALIASES.get(name, name)
    base, paren, rest = name.partition("(")
    args = _split_arguments(rest[:-1]) if paren and rest.endswith(")") else []
    if base in _FIXED_WIDTH:
        return _Type("fixed", name, _FIXED_WIDTH[base])
    if base == "String":
        return _Type("string", name)
    if base.startswith("Interval") and not paren:
        return _Type("fixed", name, 8)
    if base == "Decimal" and args:
        return _Type("fixed", name, _decimal_width(int(args[0])))
    if base == "FixedString" and args:
        return _Type("fixed", name, int(args[0]))
    if base == "Nullable" and len(args) == 1:
        return _Type("nullable", name, children=(_parse_type(args[0]),))
    if base == "Array" and len(args) == 1:
        return _Type("array", name, children=(_parse_type(args[0]),))
    if base == "Map" and len(args) == 2:
        pair = _Type("tuple", name, children=(_parse_type(args[0]), _parse_type(args[1])))
        return _Type("array", name, children=(pair,))
    if base == "Tuple":
        elements = tuple(_parse_type(_without_element_name(a)) for a in args)
        return _Type("tuple", name, children=elements)
    if base == "SimpleAggregateFunction" and len(args) >= 2:
        return _parse_type(args[-1])
    if base == "LowCardinality" and len(args) == 1:
        inner = _parse_type(args[0])
        keys = inner.children[0] if inner.kind == "nullable" else inner  # NULL is key 0
        return _Type("low_cardinality", name, children=(keys,))
    return _Type("unsized", name)


def _unsized(column_type: _Type) -> ClickHouseError:
    return ClickHouseError(
        NOT_IMPLEMENTED,
        f"Cannot find the end of a column of type {column_type.name} in Native output, which "
        "this server must skip to honour client_protocol_version: query without "
        "client_protocol_version, or select this column last",
    )


def _u64(buf: bytes, pos: int) -> int:
    if pos + 8 > len(buf):
        raise IndexError(pos)
    return int.from_bytes(buf[pos : pos + 8], "little")


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _skip_strings(buf: bytes, pos: int, count: int) -> int:
    for _ in range(count):
        size = buf[pos]
        if size < 0x80:
            pos += 1 + size
        else:
            size, pos = _varint(buf, pos)
            pos += size
    return pos


def _skip_prefix(column_type: _Type, pos: int) -> int:
    """Past the serialization state a column writes before its data (LowCardinality's
    key version, 8 bytes): all of a column's prefixes come first, nested ones included."""
    kind = column_type.kind
    if kind == "unsized":
        raise _unsized(column_type)
    if kind == "low_cardinality":
        return pos + 8
    for child in column_type.children:
        pos = _skip_prefix(child, pos)
    return pos


def _skip_data(column_type: _Type, buf: bytes, pos: int, rows: int) -> int:
    kind = column_type.kind
    if kind == "fixed":
        return pos + column_type.width * rows
    if kind == "string":
        return _skip_strings(buf, pos, rows)
    if kind == "nullable":
        return _skip_data(column_type.children[0], buf, pos + rows, rows)
    if kind == "array":
        if rows == 0:
            return pos
        end = pos + 8 * rows
        return _skip_data(column_type.children[0], buf, end, _u64(buf, end - 8))
    if kind == "tuple":
        for child in column_type.children:
            pos = _skip_data(child, buf, pos, rows)
        return pos
    if kind == "low_cardinality":
        if rows == 0:
            return pos
        flags = _u64(buf, pos)
        if flags & _LC_GLOBAL_DICTIONARY:
            raise _unsized(column_type)
        pos += 8
        if flags & _LC_ADDITIONAL_KEYS:
            pos = _skip_data(column_type.children[0], buf, pos + 8, _u64(buf, pos))
        return pos + 8 + (1 << (flags & 0xFF)) * _u64(buf, pos)
    raise _unsized(column_type)


def _skip_column(type_name: str, buf: bytes, pos: int, rows: int) -> int:
    """The offset just past a column's data starting at `pos` (nothing for zero rows)."""
    if rows == 0:
        return pos
    column_type = _parse_type(type_name)
    try:
        end = _skip_data(column_type, buf, _skip_prefix(column_type, pos), rows)
    except IndexError:
        end = len(buf) + 1
    if end > len(buf):
        raise ClickHouseError(
            INCORRECT_DATA, f"Native output ends inside a column of type {type_name}"
        )
    return end


# --- revisions ---------------------------------------------------------------------------


def check_types(types: Sequence[str], revision: int) -> None:
    """Refuse columns whose layout at `revision` this module does not produce."""
    for type_name in types:
        if revision < LOW_CARDINALITY and _LOW_CARDINALITY.search(type_name):
            gate = f"below {LOW_CARDINALITY}, where ClickHouse removes LowCardinality"
        elif revision >= AGGREGATE_FUNCTIONS_VERSIONING and _AGGREGATE_FUNCTION.search(type_name):
            gate = f"from {AGGREGATE_FUNCTIONS_VERSIONING}, where aggregate states are versioned"
        elif revision >= V2_DYNAMIC_AND_JSON and _DYNAMIC_OR_JSON.search(type_name):
            gate = f"from {V2_DYNAMIC_AND_JSON}, where Dynamic and JSON change serialization"
        else:
            continue
        raise ClickHouseError(
            NOT_IMPLEMENTED,
            f"Native output of type {type_name} for client_protocol_version {revision} "
            f"({gate}) is not implemented by this server; query without "
            "client_protocol_version or with 54405",
        )


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    size, pos = _varint(buf, pos)
    return buf[pos : pos + size].decode(), pos + size


def _string(text: str) -> bytes:
    data = text.encode()
    size, out = len(data), bytearray()
    while size >= 0x80:
        out.append(size & 0x7F | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out) + data


@dataclass(frozen=True)
class _Conversion:
    """What turns revision-0 Native into a client's revision."""

    revision: int
    zones: Mapping[int, str]
    """Column index -> full type name, for top-level DateTime columns with a zone."""
    chunk_is_block: bool
    """A chunk holds exactly one block (the engine's streamed output)."""

    @property
    def marker(self) -> bytes:
        return b"\x00" if self.revision >= CUSTOM_SERIALIZATION else b""

    @property
    def needs_walk(self) -> bool:
        return bool(self.zones) or bool(self.marker) or not self.chunk_is_block

    def blocks(self, buf: bytes) -> tuple[bytes, bytes]:
        """One chunk converted, as a head and a tail copied unread (the rest of a one-block
        chunk past the last column that changes); walks columns only as far as needed."""
        info, marker = block_info(self.revision), self.marker
        last_zone = max(self.zones, default=-1)
        out: list[bytes] = []
        tail = b""
        pos = 0
        try:
            while pos < len(buf):
                start = pos
                columns, pos = _varint(buf, pos)
                rows, pos = _varint(buf, pos)
                out += (info, buf[start:pos])
                for index in range(columns):
                    name_start = pos
                    _, pos = _read_string(buf, pos)
                    type_start = pos
                    type_name, pos = _read_string(buf, pos)
                    check_types((type_name,), self.revision)
                    full = self.zones.get(index) if type_name == "DateTime" else None
                    out.append(buf[name_start:type_start])
                    out += (_string(full) if full else buf[type_start:pos], marker)
                    rest_is_data = self.chunk_is_block and (
                        index == columns - 1 or (not marker and index >= last_zone)
                    )
                    if rest_is_data:
                        tail, pos = buf[pos:], len(buf)
                        break
                    end = _skip_column(type_name, buf, pos, rows)
                    out.append(buf[pos:end])
                    pos = end
        except (IndexError, UnicodeDecodeError):
            raise ClickHouseError(INCORRECT_DATA, "Native output ends inside a block") from None
        return b"".join(out), tail


def convert(
    chunks: Iterator[bytes],
    revision: int,
    column_types: Sequence[str] | None = None,
    chunk_is_block: bool = True,
) -> Iterator[bytes]:
    """The engine's Native chunks in the layout of `revision` (unchanged when it is 0).

    `column_types`: the result's full column types (DESCRIBE), the source of the zones of
    top-level DateTime columns; None: zones stay as the engine wrote them.
    `chunk_is_block`: False when a chunk may hold several blocks (the output of
    `EngineConnection.run`): then every column is walked to find where blocks end.
    """
    if revision <= 0:
        yield from chunks
        return
    zones: dict[int, str] = {}
    if column_types is not None:
        check_types(column_types, revision)
        if revision >= TIME_ZONE_IN_DATETIME:
            zones = {i: t for i, t in enumerate(column_types) if t.startswith("DateTime(")}
    conversion = _Conversion(revision, zones, chunk_is_block)
    info = block_info(revision)
    try:
        for chunk in chunks:
            if not chunk:
                continue
            head, tail = conversion.blocks(chunk) if conversion.needs_walk else (info, chunk)
            yield head  # apart from the tail: joining would copy every result byte once more
            if tail:
                yield tail
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def describe_types(conn: EngineConnection, sql: str, params: Mapping[str, str]) -> list[str] | None:
    """The full column types of a query's result (`sql` as run, perhaps ending in `FORMAT X
    [SETTINGS ...]`), from the engine's DESCRIBE; None when it cannot describe the query."""
    clause = trailing_format(sql)
    describe = f"DESCRIBE ({sql[: clause.start] if clause else sql})"
    if clause and clause.settings:
        describe += f" SETTINGS {clause.settings}"
    try:
        output = conn.run(describe, params, "JSONCompactEachRow")
    except ClickHouseError as exc:
        log.debug("no DESCRIBE for the query: %s", exc.message)
        return None
    return [json.loads(line)[1] for line in output.decode().splitlines() if line]


def output_for_client(
    conn: EngineConnection,
    sql: str,
    params: Mapping[str, str],
    fmt: str,
    revision: int,
    streamed: bool,
) -> Iterator[bytes]:
    """Run a Native query (`conn.stream` when `streamed`, else `conn.run`) and convert its
    output to `revision`. DESCRIBE runs first: the connection serves one query at a time."""
    if revision <= 0:
        return conn.stream(sql, params, fmt) if streamed else iter([conn.run(sql, params, fmt)])
    if not streamed:
        return convert(iter([conn.run(sql, params, fmt)]), revision, None, chunk_is_block=False)
    types = describe_types(conn, sql, params)
    return convert(conn.stream(sql, params, fmt), revision, types)
