"""Every connector file: valid JSON with the keys Connect needs, its class on the worker's
plugin path, and Connect's own validation of the filled-in configuration finds no error;
registering it a second time changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from connectors import rest
from connectors.config import ConnectSettings
from connectors.worker import CONNECTORS_DIR, Worker

FILES = sorted(CONNECTORS_DIR.glob("*.json"))


def test_there_are_connector_files() -> None:
    assert [f.name for f in FILES] == ["oar-jobs.json"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_connector_file_is_valid(
    path: Path, connect_worker: Worker, connect_settings: ConnectSettings
) -> None:
    document = json.loads(path.read_text())
    assert set(document) == {"name", "config"} and document["name"] == path.stem
    name, config = rest.load(path, connect_settings.placeholders())
    assert "${" not in json.dumps(config)
    assert {"connector.class", "tasks.max"} <= set(config)
    plugins = httpx.get(f"{connect_worker.url}/connector-plugins", timeout=30).json()
    assert config["connector.class"] in {p["class"] for p in plugins}
    assert rest.validate(connect_worker.url, name, config) == []


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "jobscope-test-offsets"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()


def test_second_registration_changes_nothing(
    connect_worker: Worker, connect_settings: ConnectSettings
) -> None:
    configs_topic = f"_{connect_worker.name}-configs"
    before = _end_offset(connect_worker.bootstrap, configs_topic)
    tasks = rest.status(connect_worker.url, "oar-jobs")["tasks"]
    name, config = rest.load(CONNECTORS_DIR / "oar-jobs.json", connect_settings.placeholders())
    assert rest.register(connect_worker.url, name, config) is False
    assert _end_offset(connect_worker.bootstrap, configs_topic) == before
    assert rest.status(connect_worker.url, "oar-jobs")["tasks"] == tasks


def test_missing_placeholder_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "c", "config": {"a": "${NOPE}"}}))
    with pytest.raises(KeyError, match="NOPE"):
        rest.load(path, {})
