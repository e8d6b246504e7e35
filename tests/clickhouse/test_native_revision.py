"""Native output in the layout of the client's `client_protocol_version` (issue 11, group 3).

The unit tests convert what the real engine (chdb, in-process) writes and read the result
with clickhouse-connect's own Native reader, or compare it with the exact bytes ClickHouse's
NativeWriter writes for that revision. `TestWiredIntoServer` runs against the local server
of tests/conftest.py and passes once the HTTP handler calls `native.output_for_client`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from clickhouse_connect.driver import ctypes as cc_ctypes
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.query import QueryContext, QueryResult
from clickhouse_connect.driver.transform import NativeTransform

from stack import services
from stack.clickhouse_server import native
from stack.clickhouse_server.engine import EngineConnection
from stack.clickhouse_server.errors import BAD_ARGUMENTS, NOT_IMPLEMENTED, ClickHouseError
from stack.config import StackSettings

CONNECT_REVISION = 54405  # what clickhouse-connect 1.12 sends once its probe succeeds
SHANGHAI = ZoneInfo("Asia/Shanghai")
PARIS = ZoneInfo("Europe/Paris")
INFO = b"\x01\x00\x02\xff\xff\xff\xff\x00"  # is_overflows 0, bucket_num -1, end

ZONE_COLUMNS = {
    "d": "toDateTime('2026-03-01 08:00:00', 'Asia/Shanghai') + number",
    "e": "toDateTime64('2026-03-01 09:00:00.125', 3, 'Europe/Paris') + number",
}
OTHER_COLUMNS = {
    "s": "repeat('x', 100 + number * 50)",  # lengths past 127: two-byte size prefixes
    "l": "toLowCardinality(toString(number % 2))",
}


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineConnection]:
    conn = EngineConnection(":memory:")
    yield conn
    conn.close()


class _Source:
    """A response body as clickhouse-connect's reader takes it: chunks from a generator."""

    def __init__(self, chunks: Sequence[bytes]) -> None:
        self.gen = iter(chunks)

    def close(self) -> None:
        pass


def decode(chunks: Sequence[bytes], block_info: bool = True) -> QueryResult:
    """Read Native output as clickhouse-connect does for a client at revision 54405."""
    context = QueryContext()
    context.block_info = block_info
    source = cc_ctypes.RespBuffCls(_Source(chunks))
    result = NativeTransform.parse_response(source, context)
    assert isinstance(result, QueryResult)
    return result


def string(text: str) -> bytes:
    data = text.encode()
    assert len(data) < 128
    return bytes([len(data)]) + data


def select(columns: dict[str, str], rows: int = 3, settings: str = "") -> str:
    exprs = ", ".join(f"{expr} AS {name}" for name, expr in columns.items())
    tail = f" SETTINGS {settings}" if settings else ""
    return f"SELECT {exprs} FROM numbers({rows}){tail} FORMAT Native"


def run(
    engine: EngineConnection, sql: str, revision: int = CONNECT_REVISION, streamed: bool = True
) -> list[bytes]:
    return list(native.output_for_client(engine, sql, {}, "Native", revision, streamed))


def test_probe_of_clickhouse_connect(engine: EngineConnection) -> None:
    result = b"".join(run(engine, "SELECT 1 AS check FORMAT Native"))
    assert result[8:16] == b"\x01\x01\x05check"  # clickhouse-connect's own check
    assert result == INFO + b"\x01\x01\x05check\x05UInt8\x01"


@pytest.mark.parametrize("place", ["first", "middle", "last"])
def test_zone_columns_after_string_and_low_cardinality(
    engine: EngineConnection, place: str
) -> None:
    order = {
        "first": [*ZONE_COLUMNS, *OTHER_COLUMNS],
        "middle": ["s", "d", "l", "e"],
        "last": [*OTHER_COLUMNS, *ZONE_COLUMNS],
    }[place]
    columns = {name: {**ZONE_COLUMNS, **OTHER_COLUMNS}[name] for name in order}
    sql = select(columns)
    (plain,) = engine.stream(sql, {}, "Native")
    converted = b"".join(run(engine, sql))

    # ClickHouse strips the zone only from a top-level DateTime: DateTime64 keeps its own.
    assert b"\x01d\x08DateTime" in plain and b"\x01d" + string("DateTime") not in converted
    expected = plain.replace(b"\x01d\x08DateTime", b"\x01d" + string("DateTime('Asia/Shanghai')"))
    assert converted == INFO + expected

    result = decode([converted])
    types = dict(zip(result.column_names, (t.name for t in result.column_types), strict=True))
    assert types == {
        "s": "String",
        "l": "LowCardinality(String)",
        "d": "DateTime('Asia/Shanghai')",
        "e": "DateTime64(3, 'Europe/Paris')",
    }
    rows = [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]
    for number, row in enumerate(rows):
        assert row["d"] == datetime(2026, 3, 1, 8, 0, number, tzinfo=SHANGHAI)
        assert row["d"].tzinfo == SHANGHAI
        assert row["e"] == datetime(2026, 3, 1, 9, 0, number, 125000, tzinfo=PARIS)
        assert row["e"].tzinfo == PARIS
        assert row["s"] == "x" * (100 + number * 50)
        assert row["l"] == str(number % 2)


def test_types_walked_past_before_a_zone_column(engine: EngineConnection) -> None:
    """Every sized type before the DateTime column: its header is found only by skipping them."""
    columns = {
        "i8": "toInt8(-number)",
        "u256": "toUInt256(number)",
        "f": "number / 3",
        "b": "number % 2 = 0",
        "dt": "toDate('2026-01-01') + number",
        "d32": "toDate32('2026-01-01') + number",
        "plain": "toDateTime(number, 'UTC')::DateTime",
        "dec": "toDecimal64(number, 4)",
        "dec2": "CAST(number AS Decimal(40, 2))",
        "uuid": "toUUID('8d4c3b1e-5f2a-4e7b-9c1d-0a2b3c4d5e6f')",
        "ip4": "toIPv4('10.0.0.1')",
        "ip6": "toIPv6('::1')",
        "enum": "CAST('b, c', 'Enum8(\\'a\\' = 1, \\'b, c\\' = 2)')",
        "fixed": "toFixedString(toString(number), 3)",
        "nul": "if(number = 1, NULL, toString(number))",
        "nothing": "NULL",
        "arr": "arrayMap(i -> toString(i), range(number))",
        "arr2": "[range(number), []]",
        "map": "map('k', toString(number), 'k2', '')",
        "tup": "(number, toString(number))::Tuple(a UInt64, `b c` String)",
        "lcn": "toLowCardinality(if(number = 0, NULL, toString(number)))",
        "lca": "[toLowCardinality(toString(number))]",
        "saf": "CAST(number, 'SimpleAggregateFunction(max, UInt64)')",
        "point": "(1.5, 2.5)::Point",
        "ring": "[(1.5, 2.5)]::Ring",
        "iv": "toIntervalSecond(number)",
        "d": ZONE_COLUMNS["d"],
    }
    sql = select(columns)
    (plain,) = engine.stream(sql, {}, "Native")
    converted = b"".join(run(engine, sql))
    expected = plain.replace(b"\x01d\x08DateTime", b"\x01d" + string("DateTime('Asia/Shanghai')"))
    assert converted == INFO + expected
    assert b"\x05plain\x08DateTime" in converted  # a DateTime without a zone stays one


def test_nested_zones_are_kept_and_walked(engine: EngineConnection) -> None:
    columns = {
        "n": "toNullable(toDateTime(number, 'Asia/Shanghai'))",
        "a": "[toDateTime64(number, 3, 'Europe/Paris')]",
        "t": "(toDateTime(number, 'Asia/Shanghai'), 'x')"
        "::Tuple(at DateTime('Asia/Shanghai'), s String)",
        "m": "map('k', toDateTime(number, 'Europe/Paris'))",
        "lc": "toLowCardinality(toNullable(toDateTime(number, 'Asia/Shanghai')))",
        "d": ZONE_COLUMNS["d"],
    }
    sql = select(columns, settings="allow_suspicious_low_cardinality_types = 1")
    converted = b"".join(run(engine, sql))
    result = decode([converted])
    assert [t.name for t in result.column_types] == [
        "Nullable(DateTime('Asia/Shanghai'))",
        "Array(DateTime64(3, 'Europe/Paris'))",
        "Tuple(`at` DateTime('Asia/Shanghai'), `s` String)",
        "Map(String, DateTime('Europe/Paris'))",
        "LowCardinality(Nullable(DateTime('Asia/Shanghai')))",
        "DateTime('Asia/Shanghai')",
    ]
    n, a, t, m, lc, d = result.result_rows[2]
    epoch2 = datetime(1970, 1, 1, 0, 0, 2, tzinfo=ZoneInfo("UTC"))
    assert n == epoch2 and n.tzinfo == SHANGHAI
    assert a == [epoch2] and a[0].tzinfo == PARIS
    assert t["at"] == epoch2 and t["at"].tzinfo == SHANGHAI and t["s"] == "x"
    assert m["k"] == epoch2 and m["k"].tzinfo == PARIS
    assert lc == epoch2 and lc.tzinfo == SHANGHAI
    assert d == datetime(2026, 3, 1, 8, 0, 2, tzinfo=SHANGHAI)


def test_streamed_blocks_each_get_block_info_and_zones(engine: EngineConnection) -> None:
    rows = 200_000
    columns = {"s": "toString(number)", **ZONE_COLUMNS, "l": OTHER_COLUMNS["l"]}
    chunks = run(engine, select(columns, rows=rows, settings="max_block_size = 65536"))
    assert chunks[0].startswith(INFO) and len(chunks) >= 4
    result = decode(chunks)
    assert len(result.result_rows) == rows
    for number in (0, 65_536, rows - 1):
        s, d, e, _ = result.result_rows[number]
        assert s == str(number)
        assert d == datetime(2026, 3, 1, 8, 0, 0, tzinfo=SHANGHAI) + timedelta(seconds=number)
        assert d.tzinfo == SHANGHAI and e.tzinfo == PARIS


def test_one_output_of_several_blocks(engine: EngineConnection) -> None:
    """`EngineConnection.run` returns all blocks in one bytes object: each gets its BlockInfo."""
    sql = select(
        {"s": "toString(number)", **ZONE_COLUMNS}, rows=3500, settings="max_block_size = 1000"
    )
    whole = engine.run(sql, {}, "Native")
    blocks = list(engine.stream(sql, {}, "Native"))
    assert len(blocks) == 4 and whole == b"".join(blocks)

    (converted,) = native.convert(iter([whole]), CONNECT_REVISION, chunk_is_block=False)
    assert converted == b"".join(INFO + block for block in blocks)  # zones unknown: kept as is
    types = native.describe_types(engine, sql, {})
    assert types == ["String", "DateTime('Asia/Shanghai')", "DateTime64(3, 'Europe/Paris')"]
    (converted,) = native.convert(iter([whole]), CONNECT_REVISION, types, chunk_is_block=False)
    result = decode([converted])
    assert len(result.result_rows) == 3500
    assert {row[1].tzinfo for row in result.result_rows} == {SHANGHAI}

    show = run(engine, "SHOW DATABASES FORMAT Native", streamed=False)
    assert decode(show).result_rows


def test_zone_from_a_query_parameter_under_read_only_settings(engine: EngineConnection) -> None:
    """DESCRIBE sees the query as the engine runs it: tag comment, parameters, settings."""
    sql = (
        "/* jobscope query_id=q user=reader */ SELECT toString(number) AS s, "
        "toDateTime(number, {tz:String}) AS d FROM numbers(2) FORMAT Native "
        "SETTINGS final = '1', readonly = '1'"
    )
    chunks = list(
        native.output_for_client(engine, sql, {"tz": "Asia/Tokyo"}, "Native", 54405, True)
    )
    result = decode(chunks)
    assert result.column_types[1].name == "DateTime('Asia/Tokyo')"
    assert result.result_rows[1][1].tzinfo == ZoneInfo("Asia/Tokyo")


def test_unsizable_type_before_a_zone_column_fails_clearly(engine: EngineConnection) -> None:
    sql = select({"agg": "initializeAggregation('sumState', number)", "d": ZONE_COLUMNS["d"]})
    with pytest.raises(ClickHouseError) as failure:
        run(engine, sql)
    assert failure.value.code == NOT_IMPLEMENTED
    assert "AggregateFunction(sum, UInt64)" in failure.value.message

    # Nothing has to walk past it when it comes after the last zone column.
    sql = select({"d": ZONE_COLUMNS["d"], "agg": "initializeAggregation('sumState', number)"})
    converted = b"".join(run(engine, sql))
    assert b"DateTime('Asia/Shanghai')" in converted and converted.startswith(INFO)


def test_revision_zero_or_absent_leaves_bytes_untouched(engine: EngineConnection) -> None:
    sql = select({**OTHER_COLUMNS, **ZONE_COLUMNS})
    plain = list(engine.stream(sql, {}, "Native"))
    assert native.client_revision({}) == 0
    assert native.client_revision({"client_protocol_version": "0"}) == 0
    assert run(engine, sql, revision=0) == plain
    assert list(native.convert(iter(plain), 0)) == plain
    assert decode(plain, block_info=False).column_types[2].name == "DateTime"


def test_revision_parameter() -> None:
    assert native.client_revision({"client_protocol_version": "54405"}) == 54405
    with pytest.raises(ClickHouseError) as failure:
        native.client_revision({"client_protocol_version": "new"})
    assert failure.value.code == BAD_ARGUMENTS


def test_revisions_with_custom_serialization_and_bucket_list(engine: EngineConnection) -> None:
    """From 54454 a "no custom serialization" byte follows each type; from 54480 BlockInfo
    carries an empty out-of-order bucket list (field 3)."""
    sql = "SELECT 'ab' AS s, toDateTime(0, 'UTC') AS d FORMAT Native"
    s_column = b"\x01s\x06String"
    d_column = b"\x01d" + string("DateTime('UTC')")
    data_s, data_d = b"\x02ab", b"\x00\x00\x00\x00"
    assert b"".join(run(engine, sql, revision=54454)) == (
        INFO + b"\x02\x01" + s_column + b"\x00" + data_s + d_column + b"\x00" + data_d
    )
    info_54480 = b"\x01\x00\x02\xff\xff\xff\xff\x03\x00\x00"
    assert b"".join(run(engine, sql, revision=54480)) == (
        info_54480 + b"\x02\x01" + s_column + b"\x00" + data_s + d_column + b"\x00" + data_d
    )
    # Before 54337 a DateTime goes without its zone, as ClickHouse sends it to old clients.
    assert b"".join(run(engine, sql, revision=54300)) == (
        INFO + b"\x02\x01" + s_column + data_s + b"\x01d\x08DateTime" + data_d
    )


@pytest.mark.parametrize(
    "revision,expr,named",
    [
        (54300, "toLowCardinality('x')", "LowCardinality(String)"),
        (54452, "initializeAggregation('sumState', number)", "AggregateFunction(sum, UInt64)"),
    ],
)
def test_layouts_not_produced_are_refused(
    engine: EngineConnection, revision: int, expr: str, named: str
) -> None:
    with pytest.raises(ClickHouseError) as failure:
        run(engine, select({"x": expr}), revision=revision)
    assert failure.value.code == NOT_IMPLEMENTED and named in failure.value.message


class TestWiredIntoServer:
    """The local server (real engine, shifted ports) answers clickhouse-connect at the
    revision it negotiates. Fails until stack/clickhouse_server/http_handler.py produces Native
    output through `native.output_for_client`."""

    def test_client_reads_zones_at_protocol_54405(
        self, clickhouse: StackSettings, admin_client: Client
    ) -> None:
        client = services.clickhouse_client(clickhouse, "jobscope")
        assert client.protocol_version == CONNECT_REVISION  # its start-up probe succeeded

        table = f"zones_{uuid.uuid4().hex[:8]}"
        admin_client.command(
            f"CREATE TABLE {table} (id UInt32, name String, "
            "d DateTime('Asia/Shanghai'), e DateTime64(3, 'Europe/Paris')) "
            "ENGINE = MergeTree ORDER BY id"
        )
        rows = [
            (
                1,
                "one",
                datetime(2026, 3, 1, 8, 0, 1, tzinfo=SHANGHAI),
                datetime(2026, 3, 1, 9, 0, 0, 125000, tzinfo=PARIS),
            ),
            (
                2,
                "two",
                datetime(2026, 7, 1, 20, 30, 0, tzinfo=SHANGHAI),
                datetime(2026, 7, 1, 12, 0, 0, 999000, tzinfo=PARIS),
            ),
        ]
        client.insert(table, rows, column_names=["id", "name", "d", "e"])
        result = client.query(f"SELECT id, name, d, e FROM {table} ORDER BY id")
        assert [t.name for t in result.column_types] == [
            "UInt32",
            "String",
            "DateTime('Asia/Shanghai')",
            "DateTime64(3, 'Europe/Paris')",
        ]
        assert result.result_rows == rows
        for _, _, d, e in result.result_rows:
            assert d.tzinfo == SHANGHAI and e.tzinfo == PARIS
        client.close()
