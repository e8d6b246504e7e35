"""Every connector file: valid JSON with the keys Connect needs, its class on the worker's
plugin path, and Connect's own validation of the filled-in configuration finds no error;
registering it a second time changes nothing."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from connectors import rest, services
from connectors.config import ConnectSettings
from connectors.worker import CONNECTORS_DIR, REST_USER, Worker
from stack.config import StackSettings
from stack.processes import wait_until

FILES = sorted(CONNECTORS_DIR.glob("*.json"))


def test_there_are_connector_files() -> None:
    assert [f.name for f in FILES] == ["oar-jobs.json"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_connector_file_is_valid(
    path: Path, connect_worker: Worker, connect_settings: ConnectSettings
) -> None:
    document = json.loads(path.read_text())
    assert set(document) == {"name", "config"} and document["name"] == path.stem
    references = connect_worker.references(connect_settings.secrets())
    name, config = rest.load(path, connect_settings.placeholders(references))
    # filled in, but for the config provider's references to secrets
    assert not re.search(r"\$\{(?!file:)", json.dumps(config))
    assert {"connector.class", "tasks.max"} <= set(config)
    plugins = httpx.get(
        f"{connect_worker.url}/connector-plugins", auth=connect_worker.auth, timeout=30
    ).json()
    assert config["connector.class"] in {p["class"] for p in plugins}
    assert rest.validate(connect_worker, name, config) == []


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
    tasks = rest.status(connect_worker, "oar-jobs")["tasks"]
    references = connect_worker.references(connect_settings.secrets())
    path = CONNECTORS_DIR / "oar-jobs.json"
    name, config = rest.load(path, connect_settings.placeholders(references))
    assert rest.register(connect_worker, name, config) is False
    assert _end_offset(connect_worker.bootstrap, configs_topic) == before
    assert rest.status(connect_worker, "oar-jobs")["tasks"] == tasks


def test_missing_placeholder_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "c", "config": {"a": "${NOPE}"}}))
    with pytest.raises(KeyError, match="NOPE"):
        rest.load(path, {})


def test_no_secret_in_the_configs_topic_nor_the_rest_api(
    connect_worker: Worker, stack_settings: StackSettings
) -> None:
    """The connectors run (test_oar_cdc) with the OAR password, yet neither the configs
    topic (every record ever written) nor the REST API's view of the configuration holds it:
    only a reference into the worker's private secrets file."""
    password = services.oar_database(stack_settings, ConnectSettings()).password
    config = httpx.get(
        f"{connect_worker.url}/connectors/oar-jobs/config", auth=connect_worker.auth, timeout=30
    ).json()
    assert config["database.password"].startswith("${file:")
    assert password not in json.dumps(config)
    topic = f"_{connect_worker.name}-configs"
    consumer = Consumer(
        {
            "bootstrap.servers": connect_worker.bootstrap,
            "group.id": "jobscope-test-configs",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        records: list[bytes] = []

        def read_all() -> bool:
            records.extend(m.value() or b"" for m in consumer.consume(100, 1) if not m.error())
            return len(records) >= end

        wait_until(read_all, 30, f"every record of {topic}")
    finally:
        consumer.close()
    assert any(b"database.password" in r for r in records)
    assert not any(password.encode() in r for r in records)
    secrets_file = connect_worker.secrets_file
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    assert f"oar_db_password={password}" in secrets_file.read_text()


def test_rest_api_answers_only_the_workers_user(connect_worker: Worker) -> None:
    """The attack Kafka's basic-auth extension stops: another local account POSTs a connector
    whose configuration names the worker's secrets file (the worker would resolve the OAR
    password into it), or one writing forged jobs. Without the password, or with a wrong one,
    every request gets 401 and nothing is created; the project's client (Worker.auth) is
    served. The credentials and login files are the worker's alone."""
    leak = connect_worker.references(["oar_db_password"])["oar_db_password"]
    attack = {
        "name": "exfiltrate",
        "config": {
            "connector.class": "org.apache.kafka.connect.mirror.MirrorHeartbeatConnector",
            "tasks.max": "1",
            "source.cluster.alias": "a",
            "target.cluster.alias": "b",
            "target.cluster.bootstrap.servers": connect_worker.bootstrap,
            "heartbeats.topic.replication.factor": "1",
            "emit.heartbeats.interval.seconds": "1",
            "password.to.leak": leak,
        },
    }
    url = f"{connect_worker.url}/connectors"
    wrong = httpx.BasicAuth(REST_USER, "not-the-password")
    try:
        for auth in (None, wrong):
            assert httpx.post(url, json=attack, auth=auth, timeout=30).status_code == 401
            assert httpx.get(url, auth=auth, timeout=30).status_code == 401
            assert httpx.get(f"{url}/oar-jobs/config", auth=auth, timeout=30).status_code == 401
        names = httpx.get(url, auth=connect_worker.auth, timeout=30).json()
        assert "oar-jobs" in names and "exfiltrate" not in names
        assert rest.status(connect_worker, "oar-jobs")["connector"]["state"] == "RUNNING"
    finally:  # a worker that accepted the attack does not keep its connector
        httpx.delete(f"{url}/exfiltrate", auth=connect_worker.auth, timeout=30)
    for path in (connect_worker.credentials_file, connect_worker.jaas_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
