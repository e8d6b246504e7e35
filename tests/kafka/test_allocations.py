"""A job's allocations (kafka/allocations.py): cpuset lists, the canonical form, what is
refused, and which readings the Python rule (live streams) keeps."""

from __future__ import annotations

import pytest

from kafka.allocations import Allocated, format_cpuset, normalized, parse_cpuset


@pytest.mark.parametrize(
    ("text", "ids", "canonical"),
    [
        ("0-15,32", [*range(16), 32], "0-15,32"),
        ("3,1,2, 2", [1, 2, 3], "1-3"),
        ("7", [7], "7"),
        ("0-1,3-4,6", [0, 1, 3, 4, 6], "0-1,3-4,6"),
    ],
)
def test_cpuset_lists(text: str, ids: list[int], canonical: str) -> None:
    assert parse_cpuset(text) == ids
    assert format_cpuset(ids) == canonical


@pytest.mark.parametrize(
    "text", ["", "a", "0-", "-3", "3-1", "0-65536", "0-99999999", "1,,2", "0x1", "0-3;id", "１"]
)
def test_not_a_cpuset(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpuset(text)


def test_normalized_is_canonical_and_drops_empty_nodes() -> None:
    got = normalized(
        {"a": {"cpus": "3,0-2", "gpus": [1, "0", "1"], "memory_mb": 5}, "b": {}}, ["a", "b"]
    )
    assert got == {"a": {"cpus": "0-3", "gpus": ["0", "1"], "memory_mb": 5}}


@pytest.mark.parametrize(
    ("allocations", "message"),
    [
        ({"z": {"gpus": ["0"]}}, "z: not a node"),
        ({"a": {"cpus": 0}}, "a.cpus"),
        ({"a": {"cpus": True}}, "a.cpus"),
        ({"a": {"gpus": "0"}}, "a.gpus"),
        ({"a": {"gpus": ["4096"]}}, "a.gpus"),
        ({"a": {"gpus": ["0"] * 257}}, "a.gpus"),
        ({"a": {"gpu_uuids": ["GPU-1 OR 1=1"]}}, "a.gpu_uuids"),
        ({"a": {"memory_mb": 1.5}}, "a.memory_mb"),
        ({"a": {"root": True}}, "a.root"),
        ({"a": []}, "a.an allocation"),
        ([], "an object"),
    ],
)
def test_refused(allocations: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        normalized(allocations, ["a"])


def test_admits_the_jobs_gpus_and_cpus_and_every_node_level_reading() -> None:
    held = Allocated.of(
        {
            "n1": {"gpus": ["0"], "gpu_uuids": ["GPU-b"], "cpus": "0-1"},
            "n2": {"cpus": 8},  # a count: per-CPU readings are not told apart
        }
    )
    assert held is not None
    cases = [
        ("n1", {}, True),
        ("n1", {"gpu": "0"}, True),
        ("n1", {"gpu": "1"}, False),
        ("n1", {"gpu": "1", "gpu_uuid": "GPU-b"}, True),
        ("n1", {"gpu_uuid": "GPU-c"}, False),
        ("n1", {"gpu": "GPU-b"}, True),  # a UUID in `gpu`
        ("n1", {"cpu": "1"}, True),
        ("n1", {"cpu": "2"}, False),
        ("n1", {"core": "2"}, False),
        ("n1", {"core": "all"}, True),  # not one CPU: node-level
        ("n2", {"gpu": "7", "cpu": "99"}, True),  # nothing held by id there
        ("n3", {"gpu": "7"}, True),
    ]
    for node, labels, expected in cases:
        assert held.admits(node, labels) is expected, (node, labels)
    assert Allocated.of({"n1": {"cpus": 4, "memory_mb": 10}}) is None
