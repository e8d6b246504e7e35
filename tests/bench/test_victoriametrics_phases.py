"""The VictoriaMetrics peer's phases (bench/systems/victoriametrics.py) on the real server
(the Debian package stack/install-system-deps.sh installs for the suite): the timed
load ends when its own counters say every reading is searchable, and a full count over the
data then finds every one; compaction and storage follow apart. Its input, Prometheus remote
write, holds exactly the data set's readings (read back by the API's own decoder)."""

from __future__ import annotations

import shutil
from pathlib import Path

import cramjam
import numpy as np
import pytest

from api.remote_write import decode
from bench import payloads
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


def test_remote_writes_hold_exactly_the_data_sets_readings(tmp_path: Path) -> None:
    """Every reading once, in writes of at most Prometheus' 2,000 samples: its device and
    metric as labels, its timestamp in milliseconds, its float64 value bit for bit."""
    data = load_or_generate(DatasetSpec(devices=3, duration_s=120), tmp_path / "data")
    got = []
    for part in payloads.remote_writes(data, 2):
        for body in part:
            series, histograms = decode(bytes(cramjam.snappy.decompress_raw(body)), 10**6)
            assert histograms == 0 and len(series) <= payloads.SAMPLES_PER_WRITE
            for one in series:
                labels = dict(one.labels)
                assert set(labels) == {"__name__", "device"}
                got += [
                    (ms, labels["device"], labels["__name__"], np.float64(v).view(np.int64))
                    for v, ms in one.samples
                ]
    expected = [
        (int(data.poll_us[t, d]) // 1000, device, metric, data.values[t, d, m].view(np.int64))
        for t in range(data.spec.ticks)
        for d, device in enumerate(data.devices)
        for m, metric in enumerate(data.metrics)
    ]
    assert len(got) == data.spec.readings
    assert sorted(got) == sorted(expected)
