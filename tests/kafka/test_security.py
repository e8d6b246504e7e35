"""kafka/security.py: the one place that turns a component's Kafka settings into client
properties (librdkafka, ClickHouse's <kafka> section, Java's JAAS line)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pydantic import ValidationError

from api.infra.config import ApiSettings
from connectors.mirror import MirrorMaker, MirrorSettings
from kafka.security import KafkaClientSettings
from producers.config import ProducerSettings

SASL = {
    "kafka_security_protocol": "SASL_SSL",
    "kafka_sasl_username": "producers",
    "kafka_sasl_password": "s3cret-pass",
    "kafka_ssl_ca_file": Path("/etc/kafka/ca.pem"),
}


def test_plaintext_adds_nothing() -> None:
    settings = KafkaClientSettings(kafka_bootstrap="k:9092")
    assert settings.kafka_client() == {"bootstrap.servers": "k:9092"}
    assert settings.clickhouse_kafka_settings() == {}
    assert settings.java_properties() == {}


def test_sasl_ssl_in_every_dialect() -> None:
    settings = KafkaClientSettings(**SASL)
    assert settings.kafka_security() == {
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "producers",
        "sasl.password": "s3cret-pass",
        "ssl.ca.location": "/etc/kafka/ca.pem",
    }
    assert settings.clickhouse_kafka_settings()["sasl_password"] == "s3cret-pass"
    java = settings.java_properties(password="${file:/run/secrets/kafka.properties:password}")
    assert java["security.protocol"] == "SASL_SSL"
    assert java["ssl.truststore.type"] == "PEM"
    assert "s3cret-pass" not in java["sasl.jaas.config"]
    assert 'password="${file:/run/secrets/kafka.properties:password}";' in java["sasl.jaas.config"]
    assert "s3cret-pass" not in repr(settings)  # a secret never prints


@pytest.mark.parametrize(
    "values",
    [
        {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_username": "u"},
        {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_password": "p"},
        {"kafka_ssl_ca_file": Path("/ca.pem")},
        {"kafka_security_protocol": "SSL"},
    ],
)
def test_incomplete_settings_are_refused_at_start(values: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        KafkaClientSettings(**values)


def test_every_python_component_reads_the_same_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBSCOPE_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("JOBSCOPE_KAFKA_SASL_USERNAME", "api")
    monkeypatch.setenv("JOBSCOPE_KAFKA_SASL_PASSWORD", "pw-of-the-api")
    monkeypatch.setenv("JOBSCOPE_CLICKHOUSE_API_PASSWORD", "x")
    for settings in (ApiSettings(), ProducerSettings()):
        assert settings.kafka_client()["sasl.username"] == "api"
        assert settings.kafka_client()["sasl.password"] == "pw-of-the-api"


def test_mirrormaker_names_each_clusters_password_in_a_private_file(tmp_path: Path) -> None:
    mirror = MirrorMaker(
        MirrorSettings(
            sites={"nancy": "kafka.nancy:9093"},
            state_dir=tmp_path,
            credentials={
                "nancy": KafkaClientSettings(**SASL),
                "central": KafkaClientSettings(
                    kafka_security_protocol="SASL_PLAINTEXT",
                    kafka_sasl_username="mm2",
                    kafka_sasl_password="central-pass",
                ),
            },
        )
    )
    properties = mirror.render_config().read_text()
    assert "nancy.security.protocol=SASL_SSL" in properties
    assert "central.sasl.jaas.config=" in properties
    assert "s3cret-pass" not in properties and "central-pass" not in properties
    secrets_file = mirror.settings.secrets_file
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    assert "nancy.password=s3cret-pass" in secrets_file.read_text()
    assert mirror.settings.central_client()["sasl.username"] == "mm2"
