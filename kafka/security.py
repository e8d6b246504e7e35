"""How a jobscope client reaches Kafka: the bootstrap servers and, where the cluster asks for
it, SASL/SCRAM authentication (over TLS with SASL_SSL). The one place that turns these
settings into client properties: librdkafka's (producers, API, stack tools, the bench), the
ClickHouse Kafka engine's (the same names, `_` for `.`) and the Java clients' (Connect,
MirrorMaker).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SecurityProtocol = Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]
"""PLAIN only where SCRAM is not built in: the embedded engine's librdkafka (chdb) has no
OpenSSL, hence neither SCRAM nor TLS; a ClickHouse server has both."""


class KafkaClientSettings(BaseSettings):
    """A Kafka client's settings, env vars `JOBSCOPE_KAFKA_<NAME>`; the settings of the
    producers, the API, the schema runner and the local ClickHouse server include them."""

    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_", extra="ignore")

    kafka_bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers")
    kafka_security_protocol: SecurityProtocol = Field(
        "PLAINTEXT",
        description="PLAINTEXT: no authentication (a broker only its own host reaches); "
        "SASL_PLAINTEXT: SCRAM authentication; SASL_SSL: SCRAM over TLS",
    )
    kafka_sasl_mechanism: SaslMechanism = Field(
        "SCRAM-SHA-512",
        description="with a SASL_* protocol: SCRAM-SHA-512 (the local brokers') or PLAIN",
    )
    kafka_sasl_username: str = Field("", description="this client's SCRAM user")
    kafka_sasl_password: SecretStr = Field(SecretStr(""), description="its password")
    kafka_ssl_ca_file: Path | None = Field(
        None, description="SASL_SSL: PEM file of the CA that signed the brokers' certificates"
    )

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.sasl and not (
            self.kafka_sasl_username and self.kafka_sasl_password.get_secret_value()
        ):
            raise ValueError(
                f"kafka_security_protocol {self.kafka_security_protocol} needs "
                "kafka_sasl_username and kafka_sasl_password (JOBSCOPE_KAFKA_SASL_USERNAME, "
                "JOBSCOPE_KAFKA_SASL_PASSWORD)"
            )
        if self.kafka_ssl_ca_file is not None and self.kafka_security_protocol != "SASL_SSL":
            raise ValueError("kafka_ssl_ca_file is used with kafka_security_protocol SASL_SSL")
        return self

    @property
    def sasl(self) -> bool:
        return self.kafka_security_protocol != "PLAINTEXT"

    def kafka_security(self) -> dict[str, str]:
        """librdkafka's security properties (empty for PLAINTEXT)."""
        if not self.sasl:
            return {}
        values = {
            "security.protocol": self.kafka_security_protocol.lower(),
            "sasl.mechanism": self.kafka_sasl_mechanism,
            "sasl.username": self.kafka_sasl_username,
            "sasl.password": self.kafka_sasl_password.get_secret_value(),
        }
        if self.kafka_ssl_ca_file is not None:
            values["ssl.ca.location"] = str(self.kafka_ssl_ca_file)
        return values

    def kafka_client(self) -> dict[str, Any]:
        """A confluent-kafka client's base configuration: bootstrap servers and security."""
        return {"bootstrap.servers": self.kafka_bootstrap, **self.kafka_security()}

    def clickhouse_kafka_settings(self) -> dict[str, str]:
        """The security properties as ClickHouse's `<kafka>` configuration section names
        them (`sasl_password`): in the server's configuration file, never in a table's DDL."""
        return {name.replace(".", "_"): value for name, value in self.kafka_security().items()}

    def java_properties(self, password: str | None = None) -> dict[str, str]:
        """A Java client's security properties (Connect, MirrorMaker). `password`: what goes
        in the JAAS line instead of the password itself, e.g. a config provider's
        `${file:/path:key}` reference, so that the file holding them holds no secret."""
        if not self.sasl:
            return {}
        secret = password if password is not None else self.kafka_sasl_password.get_secret_value()
        values = {
            "security.protocol": self.kafka_security_protocol,
            "sasl.mechanism": self.kafka_sasl_mechanism,
            "sasl.jaas.config": scram_jaas(self.kafka_sasl_username, secret),
        }
        if self.kafka_ssl_ca_file is not None:
            values["ssl.truststore.type"] = "PEM"
            values["ssl.truststore.location"] = str(self.kafka_ssl_ca_file)
        return values


def scram_jaas(username: str, password: str) -> str:
    """The JAAS line of a Java SCRAM client."""
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{_jaas_quoted(username)}" password="{_jaas_quoted(password)}";'
    )


def _jaas_quoted(value: str) -> str:
    if '"' in value or "\\" in value or "\n" in value:
        raise ValueError("a Kafka user name or password may not hold quotes, \\ or newlines")
    return value
