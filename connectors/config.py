"""Settings of the Kafka Connect worker and its connectors (`make connect`)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConnectSettings(BaseSettings):
    """Every value can be set by an environment variable `JOBSCOPE_CONNECT_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_CONNECT_", extra="ignore")

    rest_port: int = Field(8083, description="the worker's REST API on the stack's host")
    heap: str = Field("512m", description="JVM heap of the worker")
    connectors: list[str] = Field(
        ["oar-jobs"], description="the connector files (connectors/<name>.json) to register"
    )
    local_oar_db: bool = Field(
        True,
        description="start a local PostgreSQL with OAR's tables (a demo) on oar_db_port; "
        "false: the connector reads the site's OAR database at oar_db_host",
    )
    oar_db_host: str = Field(
        "127.0.0.1", description="OAR's PostgreSQL server, the Debezium source"
    )
    oar_db_port: int = Field(5433, description="its port (5433: the local demo database)")
    oar_db_name: str = Field("oar", description="OAR's database")
    oar_db_user: str = Field("postgres", description="a role with REPLICATION")
    oar_db_password: SecretStr = Field(
        SecretStr(""),
        description="password of oar_db_user; empty: the demo database's generated one",
    )

    oar_gpu_property: str = Field(
        "gpudevice",
        pattern=r"^[a-z_][a-z0-9_]{0,63}$",
        description="the column of OAR's resources holding a GPU's index on its node (a site "
        "property: gpudevice on Grid'5000, where gpu is a cluster-wide GPU id); a job's "
        "allocations hold its resources' values (clickhouse/migrations/0026)",
    )

    def secrets(self) -> dict[str, str]:
        """What the connector files need that may not be in a connector's configuration:
        stored in the worker's secrets file (connectors/worker.py), by key."""
        return {"oar_db_password": self.oar_db_password.get_secret_value()}

    def placeholders(self, references: Mapping[str, str]) -> dict[str, str]:
        """The values of the `${...}` placeholders of the connector files; a secret's is its
        reference in `references` (Worker.store_secrets), never the secret."""
        return {
            "OAR_DB_HOST": self.oar_db_host,
            "OAR_DB_PORT": str(self.oar_db_port),
            "OAR_DB_NAME": self.oar_db_name,
            "OAR_DB_USER": self.oar_db_user,
            "OAR_DB_PASSWORD": references["oar_db_password"],
            "OAR_GPU_PROPERTY": self.oar_gpu_property,
        }
