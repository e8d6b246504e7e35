"""The test vectors of the readings topic (kafka/wire_vectors.json, documented in
kafka/WIRE_FORMAT.md): the reference codec and ClickHouse itself agree with them, so
a decoder written against the vectors reads what jobscope writes."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from kafka.message import MESSAGE_STRUCTURE, pack, unpack
from kafka.reading import Reading

VECTORS = json.loads((Path(__file__).parents[2] / "kafka" / "wire_vectors.json").read_text())
VALID: list[dict[str, Any]] = VECTORS["valid"]
MALFORMED: list[dict[str, Any]] = VECTORS["malformed"]
UTF8_ONLY = {"bad_utf8_device_id", "bad_utf8_label"}
"""Malformed for a decoder (strings are UTF-8), but ClickHouse's String is bytes: it reads them."""


def _value(expected: dict[str, Any]) -> float:
    """The vector's value from its IEEE 754 bits; its repr must name the same double."""
    (value,) = struct.unpack(">d", bytes.fromhex(expected["value_bits"]))
    assert struct.pack(">d", float(expected["value"])) == struct.pack(">d", value)
    return value


def _reading(expected: dict[str, Any]) -> Reading:
    return Reading(
        expected["timestamp_us"],
        expected["device_id"],
        expected["metric_id"],
        _value(expected),
        expected["labels"],
    )


def _bits(value: float) -> bytes:
    return struct.pack(">d", value)


def test_vectors_cover_the_documented_edge_cases() -> None:
    names = {case["name"] for case in VALID}
    assert {
        "one_reading_no_labels",
        "non_ascii_utf8",
        "two_byte_varint",
        "three_byte_varint",
        "negative_timestamp",
        "two_arrays_back_to_back",
        "special_values",
    } <= names
    assert len(names) == len(VALID) and len({c["name"] for c in MALFORMED}) == len(MALFORMED)


@pytest.mark.parametrize("case", VALID, ids=lambda c: c["name"])
def test_unpack_reads_each_vector(case: dict[str, Any]) -> None:
    got = unpack(bytes.fromhex(case["payload"]))
    expected = [_reading(r) for r in case["readings"]]
    assert got == expected
    # == treats -0.0 as 0.0: compare the bits too
    assert [_bits(r.value) for r in got] == [_bits(r.value) for r in expected]


@pytest.mark.parametrize("case", VALID, ids=lambda c: c["name"])
def test_pack_writes_each_vector(case: dict[str, Any]) -> None:
    """Each array of a vector is what `pack` makes of its readings: a single-array vector is
    reproduced byte for byte, several arrays concatenated."""
    payload = bytes.fromhex(case["payload"])
    if case["name"] == "two_arrays_back_to_back":
        first, second = ([_reading(r)] for r in case["readings"])
        assert pack(first).payload + pack(second).payload == payload
    elif case["readings"]:
        assert pack([_reading(r) for r in case["readings"]]).payload == payload
    else:  # a message without readings: pack sends nothing rather than an empty array
        assert payload in (b"", b"\x00") and pack([]).payload == b""


@pytest.mark.parametrize("case", MALFORMED, ids=lambda c: c["name"])
def test_unpack_refuses_each_malformed_vector(case: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        unpack(bytes.fromhex(case["payload"]))


def _clickhouse_readings(client: Client, payload_hex: str) -> list[tuple[Any, ...]]:
    """The readings ClickHouse parses from a payload with the Kafka table's format and
    structure (RowBinary into MESSAGE_STRUCTURE), through the test server."""
    return client.query(
        "SELECT toUnixTimestamp64Micro(r.timestamp), r.device_id, r.metric_id, "
        "hex(reinterpretAsFixedString(r.value)), r.labels, jobscope_reading_problem(r) "
        f"FROM format(RowBinary, $${MESSAGE_STRUCTURE}$$, unhex({{payload:String}})) "
        "ARRAY JOIN readings AS r",
        parameters={"payload": payload_hex},
    ).result_rows


@pytest.mark.parametrize(
    "case",
    [c for c in VALID if c["payload"]],  # format() cannot take zero bytes: no row, nothing to read
    ids=lambda c: c["name"],
)
def test_clickhouse_reads_each_vector_the_same(admin_client: Client, case: dict[str, Any]) -> None:
    rows = _clickhouse_readings(admin_client, case["payload"])
    assert [
        (us, device, metric, bytes.fromhex(value_le)[::-1].hex(), labels)
        for us, device, metric, value_le, labels, _ in rows
    ] == [
        (r["timestamp_us"], r["device_id"], r["metric_id"], r["value_bits"], r["labels"])
        for r in case["readings"]
    ]
    # what ingestion does with them (the filter of the views feeding `metrics`)
    problems = {problem for *_, problem in rows}
    if "ingest" in case:
        assert problems == {"timestamp outside 2000-2100"}
    else:
        assert problems <= {""}


@pytest.mark.parametrize("case", MALFORMED, ids=lambda c: c["name"])
def test_clickhouse_refuses_the_malformed_vectors(
    admin_client: Client, case: dict[str, Any]
) -> None:
    if case["name"] in UTF8_ONLY:
        assert len(_clickhouse_readings(admin_client, case["payload"])) == 1
    else:
        with pytest.raises(DatabaseError):
            _clickhouse_readings(admin_client, case["payload"])
