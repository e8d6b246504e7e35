"""The VictoriaMetrics peer's phases (bench/systems/victoriametrics.py) on the real server
(the Debian package stack/install-system-deps.sh installs for the suite): the timed
load ends when its own counters say every reading is searchable, and a full count over the
data then finds every one; compaction and storage follow apart."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.dataset import DatasetSpec, load_or_generate
from bench.systems.victoriametrics import BINARY, VictoriaMetrics


@pytest.fixture(autouse=True)
def _installed() -> None:
    assert shutil.which(BINARY), f"{BINARY} is missing: stack/install-system-deps.sh installs it"


def test_load_ends_when_every_reading_is_searchable(tmp_path: Path) -> None:
    data = load_or_generate(DatasetSpec(devices=200, duration_s=120), tmp_path / "data")
    vm = VictoriaMetrics(tmp_path / "vm")
    vm.start()
    try:
        ingest = vm.load(data)

        assert vm.stored(data) == data.spec.readings == ingest.readings
        vm.compact()
        assert vm.storage_bytes() > 0
    finally:
        vm.stop()
