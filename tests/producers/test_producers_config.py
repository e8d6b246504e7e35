"""The devices file and the settings of the producers."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.config import DEMO_DEVICES, ConfigError, ProducerSettings, load_devices
from producers.demo_fleet import demo_fleet
from producers.entry import DeviceEntry
from producers.plugins import PLUGINS
from stack import secrets

PLUGINS_DIR = Path(__file__).resolve().parents[2] / "producers" / "plugins"

VALID = """\
- name: bmc_power_watt
  device_id: node-1
  url: tester://?metrics=1
  update_every: 5000
- name: tester_value
  device_id: node-2
  url: tester://?metrics=20
  update_every: 1000
  labels: {_device_alias: node-2, source: tester}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "devices.yaml"
    path.write_text(text)
    return path


def test_valid_file_loads(tmp_path: Path) -> None:
    entries = load_devices(write(tmp_path, VALID))
    assert entries == [
        DeviceEntry(
            name="bmc_power_watt", device_id="node-1", url="tester://?metrics=1", update_every=5000
        ),
        DeviceEntry(
            name="tester_value",
            device_id="node-2",
            url="tester://?metrics=20",
            update_every=1000,
            labels={"_device_alias": "node-2", "source": "tester"},
        ),
    ]


SECOND = "- name: tester_value\n  device_id: node-4\n"


@pytest.mark.parametrize(
    ("second_entry", "error"),
    [
        (
            SECOND + "  url: tester://\n  update_every: 0\n",
            "update_every: Input should be greater than 0",
        ),
        (
            SECOND + "  url: tester://\n  update_every: '1000'\n",
            "update_every: Input should be a valid integer",
        ),
        (SECOND + "  update_every: 1000\n", "url: Field required"),
        (
            SECOND + "  url: tester://\n  update_every: 1000\n  interval: 5\n",
            "interval: Extra inputs are not permitted",
        ),
        (
            SECOND + "  url: snmpx://public@pdu-1/1.3.6\n  update_every: 1000\n",
            "url: unknown scheme snmpx://; known: "
            + ", ".join(f"{scheme}://" for scheme in sorted(PLUGINS)),
        ),
        (
            SECOND + "  url: tester://?metrics=0\n  update_every: 1000\n",
            "url: metrics: Input should be greater than or equal to 1",
        ),
        (
            SECOND + "  url: tester://?metric=3\n  update_every: 1000\n",
            "url: metric: Extra inputs are not permitted",
        ),
        (
            SECOND + "  url: tester://?metrics=2&metrics=3\n  update_every: 1000\n",
            "url: option 'metrics' is given twice",
        ),
        (
            SECOND + "  url: tester://node-4\n  update_every: 1000\n",
            "url: tester:// takes no host or path",
        ),
        (
            SECOND + "  url: tester://\n  update_every: 1000\n  labels: {port: 1}\n",
            "labels.port: Input should be a valid string",
        ),
        (
            SECOND.replace("tester_value", "tester-value")
            + "  url: tester://\n  update_every: 1000\n",
            "name: String should match pattern",
        ),
    ],
)
def test_bad_entry_is_named_with_its_field(tmp_path: Path, second_entry: str, error: str) -> None:
    path = write(
        tmp_path,
        "- {name: ok, device_id: node-1, url: 'tester://', update_every: 1000}\n" + second_entry,
    )
    with pytest.raises(ConfigError) as raised:
        load_devices(path)
    assert str(raised.value).startswith(f"{path} entry 2 (line 2, device_id=node-4): {error}")


def test_every_bad_entry_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        VALID + "- just a string\n"
        "- {name: tester_value, device_id: node-2, url: 'tester://', update_every: 1,\n"
        "   labels: {source: tester, _device_alias: node-2}}\n",
    )
    with pytest.raises(ConfigError) as raised:
        load_devices(path)
    assert str(raised.value).splitlines() == [
        f"{path} entry 3 (line 10): Input should be a valid dictionary or instance of DeviceEntry",
        f"{path} entry 4 (line 11, device_id=node-2): name: tester_value of node-2 with these "
        "labels is already defined by devices.yaml entry 2",
    ]


def test_same_name_with_other_labels_is_another_series(tmp_path: Path) -> None:
    """A PDU's outlets: one metric name, told apart by their labels."""
    path = write(
        tmp_path,
        "".join(
            f"- {{name: pdu_outlet_power_watt, device_id: pdu-1, url: 'tester://', "
            f"update_every: 1000, labels: {{outlet: '{i}', _device_alias: node-{i}}}}}\n"
            for i in (1, 2)
        ),
    )
    assert [e.labels["outlet"] for e in load_devices(path)] == ["1", "2"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "no device entries"),
        ("[]\n", "no device entries"),
        ("42\n", "expected a list of device entries or one entry"),
        ("- {name: [\n", "not valid YAML"),
    ],
)
def test_file_that_is_not_a_list_of_entries(tmp_path: Path, text: str, error: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=f"^{path}: {error}"):
        load_devices(path)


def test_kwollect_metrics_dir_loads_as_it_is(tmp_path: Path) -> None:
    """Kwollect's `metrics_dir`: files holding a list, one mapping, or nothing; its
    defaults (update_every 10 s, optional false) and fields (scale_factor) apply."""
    (tmp_path / "a.yaml").write_text(
        "- {name: m1, device_id: node-1, url: 'tester://', scale_factor: 0.1}\n"
        "- {name: m2, device_id: node-1, url: 'tester://', update_every: 500, optional: true}\n"
    )
    (tmp_path / "b.yml").write_text("name: m3\ndevice_id: node-2\nurl: tester://\n")
    (tmp_path / "empty.yaml").write_text("")
    entries = load_devices(tmp_path)
    assert [(e.name, e.update_every, e.optional, e.scale_factor) for e in entries] == [
        ("m1", 10_000, False, 0.1),
        ("m2", 500, True, None),
        ("m3", 10_000, False, None),
    ]


def test_errors_of_a_directory_name_their_file(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text("name: m1\ndevice_id: node-1\nurl: tester://\n")
    (tmp_path / "bad.yaml").write_text("- {name: m1, device_id: node-2, url: 'nope://'}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml entry 1 \(line 1, device_id=node-2\): url"):
        load_devices(tmp_path)


@pytest.mark.parametrize(
    "sample", sorted(PLUGINS_DIR.glob("*/sample.yaml")), ids=lambda path: path.parent.name
)
def test_plugin_sample_config_loads(sample: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Passwords come from the environment (`make up` sets them from state/secrets.env)."""
    for name in secrets.NAMES:
        monkeypatch.setenv(name, "a-password")
    assert load_devices(sample)


def test_make_up_devices_sample_polls_every_plugins_sample() -> None:
    """`make up DEVICES=sample` reads producers/config/sample/: a link to each sample.yaml
    (but tester://'s: the demo fleet, `make up`'s default, is tester://)."""
    linked = {p.resolve() for p in (PLUGINS_DIR.parent / "config" / "sample").glob("*.yaml")}
    samples = {p.resolve() for p in PLUGINS_DIR.glob("*/sample.yaml")}
    assert samples - linked == {(PLUGINS_DIR / "tester" / "sample.yaml").resolve()}


def test_demo_fleet_is_generated_and_valid() -> None:
    """The file is what producers/demo_fleet.py prints: 50 nodes with 21 metrics each and 5
    PDUs whose outlets power them, every second."""
    assert DEMO_DEVICES.read_text() == demo_fleet()
    entries = load_devices(DEMO_DEVICES)
    assert {e.update_every for e in entries} == {1000}
    nodes = [e.device_id for e in entries if e.name == "bmc_power_watt"]
    assert nodes == [f"node-{i}" for i in range(1, 51)]
    outlets = [e.labels["_device_alias"] for e in entries if e.device_id.startswith("pdu-")]
    assert outlets == nodes  # every node is powered by exactly one outlet


def test_settings_come_from_jobscope_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBSCOPE_KAFKA_BOOTSTRAP", "kafka-1:9092,kafka-2:9092")
    monkeypatch.setenv("JOBSCOPE_LINGER_MS", "5")
    monkeypatch.setenv("JOBSCOPE_STATE_DIR", "/elsewhere")  # another service's setting
    settings = ProducerSettings()
    assert settings.kafka_bootstrap == "kafka-1:9092,kafka-2:9092"
    assert settings.linger_ms == 5
    assert settings.devices_file == DEMO_DEVICES
    monkeypatch.setenv("JOBSCOPE_COMPRESSION", "brotli")
    with pytest.raises(ValueError, match="compression"):
        ProducerSettings()
