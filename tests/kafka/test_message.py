"""The wire format: pack/unpack, the documented layout, and what the real ClickHouse engine
reads from it (RowBinary into MESSAGE_STRUCTURE, as the Kafka engine does)."""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path
from types import MappingProxyType

import chdb
import orjson
import pytest

from kafka.message import MESSAGE_STRUCTURE, header, pack, unpack
from kafka.reading import Reading

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
    Reading(1_795_288_158_999_999, "x" * 300, "long_id_needs_a_two_byte_varint", 1.0),
]


def test_layout_is_exactly_the_documented_one() -> None:
    payload = pack([Reading(1_000_002, "n1", "m", 2.5, {"a": "bc"})]).payload
    assert payload == (
        b"\x01"  # one reading
        + struct.pack("<q", 1_000_002)
        + b"\x02n1"
        + b"\x01m"
        + struct.pack("<d", 2.5)
        + b"\x01"
        + b"\x01a"
        + b"\x02bc"
    )
    assert pack([Reading(0, "d", "m", 0.0)]).payload.endswith(b"\x00")  # no labels
    assert header(300) == b"\xac\x02"  # counts are varints
    assert pack([Reading(0, "d", "m", 0.0)] * 300).payload.startswith(b"\xac\x02")


def test_messages_back_to_back_are_one_message() -> None:
    first, second = pack(READINGS[:2]).payload, pack(READINGS[2:]).payload
    assert unpack(first + second) == unpack(pack(READINGS).payload)


def test_pack_unpack_roundtrip() -> None:
    packed = pack(READINGS)
    assert packed.count == len(READINGS) and packed.skipped == []
    assert unpack(packed.payload) == [
        Reading(r.timestamp_us, r.device_id, r.metric_id, float(r.value), dict(r.labels))
        for r in READINGS
    ]


def test_non_finite_values_are_skipped_and_returned() -> None:
    nan = Reading(10, "node-1", "a", math.nan)
    inf = Reading(10, "node-1", "b", math.inf)
    minus_inf = Reading(10, "node-1", "c", -math.inf)
    ok = Reading(10, "node-1", "d", 1.5)
    packed = pack([nan, ok, inf, minus_inf])
    assert unpack(packed.payload) == [ok]
    assert packed.count == 1
    assert packed.skipped == [nan, inf, minus_inf]
    assert pack([nan], with_json=True) == (b"", 0, [nan], b"")
    assert pack([]) == (b"", 0, [], b"")


def test_read_only_labels_and_float_subclasses_are_packed() -> None:
    numpy_like = type("Float64", (float,), {})(2.5)
    packed = pack([Reading(10, "node-1", "a", numpy_like, MappingProxyType({"k": "v"}))])
    assert unpack(packed.payload) == [Reading(10, "node-1", "a", 2.5, {"k": "v"})]


@pytest.mark.parametrize(
    "bad",
    [
        b"\x05short",  # 5 readings announced, a few bytes follow
        b"\x01" + b"\x00" * 8 + b"\x05ab",  # device id shorter than its length
        b"\x01" + b"\x00" * 8 + b"\x02\xff\xfe",  # device id not UTF-8
        b"\xff" * 12,  # a count that never ends
    ],
)
def test_unpack_refuses_what_is_not_a_message(bad: bytes) -> None:
    with pytest.raises(ValueError):
        unpack(bad)


def _clickhouse(select: str, payload: bytes, tmp_path: Path) -> list[dict]:
    path = tmp_path / "message.bin"
    path.write_bytes(payload)
    readings = (
        "SELECT r.timestamp AS timestamp, r.device_id AS device_id, r.metric_id AS metric_id, "
        "r.value AS value, r.labels AS labels "
        f"FROM file('{path}', RowBinary, $${MESSAGE_STRUCTURE}$$) ARRAY JOIN readings AS r"
    )
    result = chdb.query(f"{select} FROM ({readings})", "JSONEachRow")
    return [orjson.loads(line) for line in result.bytes().splitlines()]


def _float_bits(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


def test_clickhouse_parses_exactly_what_was_packed(tmp_path: Path) -> None:
    rows = _clickhouse(
        "SELECT toUnixTimestamp64Micro(timestamp) AS us, device_id, metric_id, "
        "reinterpretAsUInt64(value) AS bits, labels",
        pack(READINGS).payload,
        tmp_path,
    )
    assert rows == [
        {
            "us": r.timestamp_us,
            "device_id": r.device_id,
            "metric_id": r.metric_id,
            "bits": _float_bits(float(r.value)),
            "labels": dict(r.labels),
        }
        for r in READINGS
    ]


def test_clickhouse_reads_every_float64_bit_exact(tmp_path: Path) -> None:
    """The reason for a binary format: ClickHouse's text float parser (JSON, CSV) reads some
    17-digit values 1-2 ULP off; RowBinary carries the IEEE 754 bits themselves."""
    rng = random.Random(42)
    values = [rng.uniform(0, 1) * 10.0 ** rng.randint(-300, 300) for _ in range(5000)]
    values += [rng.uniform(100, 200) for _ in range(5000)]
    payload = pack([Reading(10, "n", "m", value) for value in values]).payload
    rows = _clickhouse("SELECT reinterpretAsUInt64(value) AS bits", payload, tmp_path)
    assert [row["bits"] for row in rows] == [_float_bits(v) for v in values]


def test_json_lines_carry_the_same_readings() -> None:
    """The JSON topic's lines: one object per finite reading, values bit-exact, the API's
    timestamp text beside the exact microseconds."""
    readings = [
        Reading(1_795_400_000_123_456, "pdu-1", "power_watt", 97.25, {"_device_alias": "n-7"}),
        Reading(-1, "node-é", "x", -0.0, {}),
        Reading(0, "n", "y", 0.1 + 0.2, {"k": 'quote " and \\'}),
        Reading(0, "n", "z", math.nan, {}),
    ]
    packed = pack(readings, with_json=True)
    lines = packed.json.decode().splitlines()
    assert packed.json.endswith(b"\n") and len(lines) == 3
    decoded = [json.loads(line) for line in lines]
    assert decoded[0]["timestamp"] == "2026-11-23T02:13:20.123456+00:00"  # date -u -d @1795400000
    assert decoded[1]["timestamp"] == "1969-12-31T23:59:59.999999+00:00"
    again = [
        Reading(d["timestamp_us"], d["device_id"], d["metric_id"], d["value"], d["labels"])
        for d in decoded
    ]
    assert again == unpack(packed.payload)
    assert math.copysign(1.0, decoded[1]["value"]) == -1.0
