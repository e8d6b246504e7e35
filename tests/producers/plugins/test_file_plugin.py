"""file://: textfiles read by the producer, named as prometheus:// names them when Debian's
node_exporter (stack/simulators/node_exporter.py) serves the same files."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka.reading import Reading
from producers.config import load_devices
from producers.entry import DeviceEntry
from producers.plugins.base import Plugin, Skips
from producers.plugins.file import plugin as file_plugin
from producers.plugins.prometheus.plugin import PrometheusPlugin
from producers.runtime import build_groups
from stack.simulators.node_exporter import NodeExporter

SAMPLE = Path(file_plugin.__file__).parent / "sample.yaml"
T = 1_795_288_158_123_456
ORIGIN = {"_metric_origin": "prom_kwollect_custom"}


def entry(url: str, name: str = "pushed", **fields: Any) -> DeviceEntry:
    return DeviceEntry(name=name, device_id="node-1", url=url, **fields)


def build(*entries: DeviceEntry) -> Plugin:
    (plugin,) = type_of(entries[0]).build(entries)
    plugin.skips = Skips(logging.getLogger("test"))
    return plugin


def type_of(e: DeviceEntry) -> type[Plugin]:
    return PrometheusPlugin if e.url.startswith("prometheus:") else file_plugin.FilePlugin


def polls(plugin: Plugin, *timestamps: int) -> list[list[Reading]]:
    async def run() -> list[list[Reading]]:
        try:
            return [await plugin.poll(ts) for ts in timestamps]
        finally:
            await plugin.close()

    return asyncio.run(run())


def rows(readings: list[Reading]) -> list[tuple[str, dict[str, str], float, int]]:
    ordered = sorted(readings, key=lambda r: (r.metric_id, sorted(r.labels.items())))
    return [(r.metric_id, dict(r.labels), r.value, r.timestamp_us) for r in ordered]


JOB_FILE = (
    "# HELP job_gpu_power_watt GPU power.\n"
    "# TYPE job_gpu_power_watt gauge\n"
    'job_gpu_power_watt{gpu="0"} 212\n'
    'job_gpu_power_watt{gpu="1",note="say \\"hi\\""} 198.5\n'
    'kwollect_custom{_metric_id="job_progress_ratio", _timestamp="1795288100.5"} 0.42\n'
    'kwollect_custom{_metric_id="job_phase", phase="io"} 2\n'
    "node_something_else 7\n"
)


def test_sample_reads_the_pushed_values(tmp_path: Path) -> None:
    folder = tmp_path / "textfiles"
    folder.mkdir()
    (folder / "job.prom").write_text(JOB_FILE)
    text = SAMPLE.read_text().replace("/var/lib/prometheus/node-exporter", str(folder))
    (tmp_path / "devices.yaml").write_text(text)
    entries = load_devices(tmp_path / "devices.yaml")
    assert len(entries) == len(yaml.safe_load(text)) == 2
    ((plugin,),) = [group.members for group in build_groups(entries)]  # one read of the folder
    (readings,) = polls(plugin, T)
    assert rows(readings) == [
        ("job_gpu_power_watt", {"gpu": "0"}, 212.0, T),
        ("job_gpu_power_watt", {"gpu": "1", "note": 'say "hi"'}, 198.5, T),
        ("job_phase", {"phase": "io", **ORIGIN}, 2.0, T),
        ("job_progress_ratio", ORIGIN, 0.42, 1_795_288_100_500_000),
    ]


def test_a_file_reads_as_node_exporter_serves_it(node_exporter: NodeExporter) -> None:
    """The same textfile, read by file:// and scraped through node_exporter by prometheus://
    with the same options, gives the same readings."""
    node_exporter.push("job.prom", JOB_FILE)
    query = "?metrics=kwollect_custom,job_gpu_power_watt"
    direct = build(entry(f"file://{node_exporter.textfile_dir}{query}"))
    scraped = build(entry(f"prometheus://127.0.0.1:{node_exporter.port}/metrics{query}"))
    (from_file,) = polls(direct, T)
    (from_exporter,) = polls(scraped, T)
    assert len(from_file) == 4
    assert rows(from_file) == rows(from_exporter)


def test_malformed_files_are_skipped_reported_once_and_read_once_fixed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(file_plugin, "MAX_FILE_BYTES", 100)
    (tmp_path / "a-good.prom").write_text("job_a 1\n")
    (tmp_path / "b-bad.prom").write_text("job_b 1\njob_b{x=1} 2\n")
    (tmp_path / "c-binary.prom").write_bytes(b"job_c 1\n\xff\xfe\n")
    (tmp_path / "d-big.prom").write_text("job_d 1\n" * 20)
    (tmp_path / "e-notes.txt").write_text("not read: not *.prom\n")
    (tmp_path / "f-folder.prom").mkdir()
    plugin = build(entry(f"file://{tmp_path}"))
    first, second = polls(plugin, T, T + 1)
    assert [r.metric_id for r in first] == [r.metric_id for r in second] == ["prom_job_a"]
    assert plugin.skips.count == 6  # three files, twice
    warnings = [r.getMessage() for r in caplog.records if r.name == "test"]
    assert len(warnings) == 3
    assert f"file {tmp_path}/b-bad.prom: malformed: line 2: Invalid labels" in warnings[0]
    assert "c-binary.prom: not UTF-8 text (byte 8)" in warnings[1]
    assert "d-big.prom: larger than 100 bytes" in warnings[2]
    (tmp_path / "b-bad.prom").write_text("job_b 1\n")
    (third,) = polls(plugin, T + 2)
    assert [r.metric_id for r in third] == ["prom_job_a", "prom_job_b"]


def test_a_missing_folder_fails_the_poll_until_it_exists(tmp_path: Path) -> None:
    folder = tmp_path / "not-yet"
    plugin = build(entry(f"file://{folder}"))
    with pytest.raises(RuntimeError, match=f"{folder}: No such file or directory"):
        polls(plugin, T)
    folder.mkdir()
    assert polls(plugin, T) == [[]]
    (folder / "x.prom").write_text("job_x 3\n")
    assert [(r.metric_id, r.value) for r in polls(plugin, T)[0]] == [("prom_job_x", 3.0)]


def test_one_file_and_sample_timestamps_published_once(tmp_path: Path) -> None:
    """A URL may name one file (any name); a sample's own time (ms) is its reading's, and it
    is published again only when that time changes."""
    path = tmp_path / "values.txt"
    path.write_text("job_energy_joules_total 10 1795288100000\njob_load 0.5\n")
    plugin = build(entry(f"file://{path}?prefix="))
    first, second = polls(plugin, T, T + 1)
    assert rows(first) == [
        ("job_energy_joules_total", {}, 10.0, 1_795_288_100_000_000),
        ("job_load", {}, 0.5, T),
    ]
    assert rows(second) == [("job_load", {}, 0.5, T + 1)]
    path.write_text("job_energy_joules_total 12 1795288101000\njob_load 0.5\n")
    (third,) = polls(plugin, T + 2)
    assert rows(third)[0] == ("job_energy_joules_total", {}, 12.0, 1_795_288_101_000_000)


def test_a_users_file_cannot_alias_nor_backdate(tmp_path: Path) -> None:
    """The file is the user's: a sample aliased to another node, or timed a week back (by
    its own time or `_timestamp`), is dropped and counted; `time_max_age_s` widens the
    window per entry."""
    path = tmp_path / "job.prom"
    week_ago = (T - 7 * 86400 * 1_000_000) // 1000
    path.write_text(
        f"job_power_watt 300 {week_ago}\n"
        'job_power_watt{_device_alias="node-9"} 300\n'
        f'kwollect_custom{{_metric_id="job_x", _timestamp="{week_ago / 1000}"}} 1\n'
        "job_load 0.5\n"
    )
    plugin = build(entry(f"file://{path}?prefix="))
    assert rows(polls(plugin, T)[0]) == [("job_load", {}, 0.5, T)]
    assert plugin.skips.count == 3
    wide = build(entry(f"file://{path}?prefix=&time_max_age_s=700000"))
    assert [r.metric_id for r in polls(wide, T)[0]] == ["job_power_watt", "job_x", "job_load"]


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("file://relative/path", "takes an absolute path"),
        ("file:relative", "takes an absolute path"),
        ("file:///x#y", "no #fragment"),
        ("file:///x?timeout_s=1", "timeout_s: Extra inputs are not permitted"),
        ("file:///x?match=(", "match: Input should be a valid regular expression"),
    ],
)
def test_bad_urls_are_refused_with_the_reason(url: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        file_plugin.FilePlugin.check(entry(url))


def test_entries_of_one_path_share_one_read() -> None:
    a = entry("file:///srv/pushed/?metrics=kwollect_custom")
    b = entry("file:///srv/pushed?match=job_.*", name="b")
    c = entry("file://localhost/srv/other", name="c")
    keys = [file_plugin.FilePlugin.batch_key(e) for e in (a, b, c)]
    assert keys == [Path("/srv/pushed"), Path("/srv/pushed"), Path("/srv/other")]
