"""Which producer process polls which device: `python -m producers --shard i/N`.

A device belongs to the shard that gives it the highest score, score = hash(shard, device_id)
(rendezvous hashing). Every process computes the same answer from the device id alone, so
N processes started with the same devices file and `--shard 0/N` ... `--shard N-1/N` poll
every device exactly once, without talking to each other. Adding or removing devices moves
no other device; going from N to N+1 processes moves only the devices the new shard wins
(about 1/(N+1) of them), each from its old shard to the new one.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_FORM = re.compile(r"^(\d+)/(\d+)$")


def _score(shard: int, device_id: str) -> int:
    digest = hashlib.blake2b(f"{shard}\0{device_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def shard_of(device_id: str, count: int) -> int:
    """The shard (0 .. count-1) that polls `device_id`."""
    return max(range(count), key=lambda shard: _score(shard, device_id))


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """`i/N` with 0 <= i < N; ValueError otherwise."""
        match = _FORM.match(text.strip())
        if match is None:
            raise ValueError(f"shard {text!r}: expected i/N, e.g. 0/4")
        index, count = int(match[1]), int(match[2])
        if count < 1 or index >= count:
            raise ValueError(f"shard {text!r}: i must be in 0..N-1 and N at least 1")
        return cls(index, count)

    def owns(self, device_id: str) -> bool:
        return self.count == 1 or shard_of(device_id, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
