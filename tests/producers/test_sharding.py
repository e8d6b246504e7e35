"""`--shard i/N`: every device is polled by exactly one of N processes, and adding a process
moves only the devices it takes (two real processes: test_producers_kafka.py)."""

from __future__ import annotations

import pytest

from producers.sharding import Shard, shard_of

DEVICES = [f"node-{i}" for i in range(4000)]


def test_each_device_belongs_to_exactly_one_shard() -> None:
    shards = [Shard(i, 4) for i in range(4)]
    for device in DEVICES[:500]:
        assert sum(shard.owns(device) for shard in shards) == 1
    sizes = [sum(shard.owns(d) for d in DEVICES) for shard in shards]
    assert all(abs(size - 1000) < 150 for size in sizes), sizes


def test_adding_a_shard_moves_only_what_the_new_shard_takes() -> None:
    before = {device: shard_of(device, 4) for device in DEVICES}
    after = {device: shard_of(device, 5) for device in DEVICES}
    moved = [device for device in DEVICES if before[device] != after[device]]
    assert all(after[device] == 4 for device in moved)
    assert 0.15 < len(moved) / len(DEVICES) < 0.25  # about 1/5


@pytest.mark.parametrize("text", ["2/2", "1", "-1/2", "a/b", "0/0"])
def test_bad_shards_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="shard"):
        Shard.parse(text)
