"""The wire format: pack/unpack, and what the real ClickHouse engine reads from it."""

from __future__ import annotations

import math
import random
import struct
from types import MappingProxyType

import chdb
import orjson

from producers.message import READING_STRUCTURE, format_timestamp, pack, parse_timestamp, unpack
from producers.reading import Reading

READINGS = [
    Reading(1_795_288_158_123_456, "node-1", "bmc_power_watt", 138.5, {"k": "v"}),
    Reading(1_795_288_158_123_456, "node-1", "tester_value_07", 151.23456789012345),
    Reading(
        1_795_288_158_000_001,
        "pdu-3",
        "outlet_power_watt",
        -0.0,
        {"_device_alias": "node-1", "port": "7"},
    ),
    Reading(1, "é'\"\\\n\t", "m:1", 1e-310, {"quote'\"": "back\\slash\nnewline", "ü": "✓"}),
    Reading(4_102_444_799_999_999, "node-2", "network_ifhcinoctets_total", 1.8e19),
    Reading(1_795_288_158_999_999, "node-2", "counter", 42),
    Reading(1_795_288_158_999_999, "node-2", "tiny", -1.25e-300),
]


def test_line_format_is_exactly_the_documented_one() -> None:
    packed = pack([Reading(1_795_288_158_123_456, "node-1", "bmc_power_watt", 138.5, {"k": "v"})])
    assert packed.payload == (
        b'{"timestamp":"2026-11-21 19:09:18.123456","device_id":"node-1",'
        b'"metric_id":"bmc_power_watt","value":138.5,"labels":{"k":"v"}}\n'
    )
    assert (packed.count, packed.skipped) == (1, [])


def test_pack_unpack_roundtrip() -> None:
    packed = pack(READINGS)
    assert packed.count == len(READINGS)
    assert packed.payload.count(b"\n") == len(READINGS)
    assert unpack(packed.payload) == READINGS


def test_timestamp_always_has_six_fractional_digits() -> None:
    assert format_timestamp(0) == "1970-01-01 00:00:00.000000"
    assert format_timestamp(1_795_288_158_000_010) == "2026-11-21 19:09:18.000010"
    assert parse_timestamp("2026-11-21 19:09:18.000010") == 1_795_288_158_000_010


def test_non_finite_values_are_skipped_and_returned() -> None:
    nan = Reading(10, "node-1", "a", math.nan)
    inf = Reading(10, "node-1", "b", math.inf)
    minus_inf = Reading(10, "node-1", "c", -math.inf)
    ok = Reading(10, "node-1", "d", 1.5)
    packed = pack([nan, ok, inf, minus_inf])
    assert unpack(packed.payload) == [ok]
    assert packed.count == 1
    assert packed.skipped == [nan, inf, minus_inf]
    assert pack([nan]) == (b"", 0, [nan])
    assert pack([]) == (b"", 0, [])


def test_read_only_labels_and_float_subclasses_are_packed() -> None:
    numpy_like = type("Float64", (float,), {})(2.5)
    packed = pack([Reading(10, "node-1", "a", numpy_like, MappingProxyType({"k": "v"}))])
    assert unpack(packed.payload) == [Reading(10, "node-1", "a", 2.5, {"k": "v"})]


def test_rows_split_only_between_readings_whatever_the_labels_hold() -> None:
    tricky = {"timestamp": '},{"timestamp":', "x": "}\n{"}
    packed = pack([Reading(10, "a", "m", 1.0, tricky), Reading(10, "b", "m", 2.0, tricky)])
    lines = packed.payload.splitlines()
    assert len(lines) == 2
    assert [orjson.loads(line)["labels"] for line in lines] == [tricky, tricky]


def _tsv_escaped(text: str) -> str:
    """Query parameters reach ClickHouse in TSV escaping."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def _float_bits(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


def _clickhouse(select: str, structure: str, payload: bytes, settings: str = "") -> list[dict]:
    """Run `select` over the rows ClickHouse parses from `payload` (in-memory chdb)."""
    result = chdb.query(
        f"{select} FROM format(JSONEachRow, {{structure:String}}, {{payload:String}}) {settings}",
        "JSONEachRow",
        params={"structure": _tsv_escaped(structure), "payload": _tsv_escaped(payload.decode())},
    )
    return [orjson.loads(line) for line in result.bytes().splitlines()]


def test_clickhouse_parses_exactly_what_was_packed() -> None:
    """The Kafka engine's parser (JSONEachRow into READING_STRUCTURE) on a packed message."""
    rows = _clickhouse(
        "SELECT toUnixTimestamp64Micro(timestamp) AS us, toString(timestamp) AS text, "
        "device_id, metric_id, reinterpretAsUInt64(value) AS bits, labels",
        READING_STRUCTURE,
        pack(READINGS).payload,
    )
    assert rows == [
        {
            "us": reading.timestamp_us,
            "text": format_timestamp(reading.timestamp_us),
            "device_id": reading.device_id,
            "metric_id": reading.metric_id,
            "bits": _float_bits(float(reading.value)),
            "labels": dict(reading.labels),
        }
        for reading in READINGS
    ]


def test_clickhouse_reads_every_float64_exactly_through_a_string() -> None:
    """ClickHouse's JSONEachRow float parser may be 1-2 ULP off on 16-17 digit values (26.1);
    the value read as String and converted by JSONExtract is exact."""
    rng = random.Random(42)
    values = [rng.uniform(0, 1) * 10.0 ** rng.randint(-300, 300) for _ in range(5000)]
    values += [rng.uniform(100, 200) for _ in range(5000)]
    payload = pack([Reading(10, "n", "m", value) for value in values]).payload
    expected = [_float_bits(value) for value in values]

    default = _clickhouse("SELECT reinterpretAsUInt64(value) AS bits", READING_STRUCTURE, payload)
    assert max(abs(row["bits"] - bits) for row, bits in zip(default, expected, strict=True)) <= 2

    as_string = READING_STRUCTURE.replace("value Float64", "value String")
    exact = _clickhouse(
        "SELECT reinterpretAsUInt64(JSONExtract(value, 'Float64')) AS bits", as_string, payload
    )
    assert [row["bits"] for row in exact] == expected
