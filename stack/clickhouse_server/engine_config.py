"""The embedded engine's own configuration (what clickhouse-server reads from config.xml):
where and how much the engine logs, and the librdkafka settings of every Kafka table.

chdb takes start-up arguments in the connection string: `<data_dir>?config-file=<path>&...`.
"""

from __future__ import annotations

import os
from pathlib import Path
from xml.sax.saxutils import escape

from stack.clickhouse_server.config import ServerSettings


def kafka_client_settings(settings: ServerSettings, secret: bool = True) -> dict[str, str]:
    """librdkafka properties (dots as underscores, as ClickHouse's <kafka> section wants);
    without the password unless `secret`.

    A short session timeout lets a group forget the consumers of a killed server within
    seconds (librdkafka's default keeps them, and stalls the new ones, for 45 s); frequent
    heartbeats let a busy consumer learn of a rebalance promptly, so a second consumer
    joining does not hold the group for several heartbeats.
    """
    return {
        "session_timeout_ms": str(settings.kafka_session_timeout_ms),
        "heartbeat_interval_ms": str(settings.kafka_heartbeat_interval_ms),
        **{
            name: value
            for name, value in settings.kafka.clickhouse_kafka_settings().items()
            if secret or name != "sasl_password"
        },
    }


# Query settings of the engine's default profile, which every query and the engine's own
# background work use (the Kafka tables' inserts among it). ReplacingMergeTree's dedup of
# each inserted block costs ~30% of the insert; duplicates are removed by merges anyway, and
# readers use FINAL. Reads go through the uncompressed cache: a dashboard or job query read
# again skips decompression (10 devices x 1 min: 10.5 -> 7.4 ms in the engine).
PROFILE_SETTINGS = {"optimize_on_insert": "0", "use_uncompressed_cache": "1"}


def _elements(values: dict[str, str], indent: str) -> list[str]:
    return [f"{indent}<{name}>{escape(value)}</{name}>" for name, value in values.items()]


def render(settings: ServerSettings, path: Path, secret: bool = True) -> str:
    """The configuration, which is also its own users configuration: the engine reads
    profiles only from the latter, and the engine's one user (`default`; the server's users
    are enforced by the HTTP layer) must be declared with them."""
    server = {
        "users_config": str(path),
        "uncompressed_cache_size": str(settings.uncompressed_cache_bytes),
    }
    lines = [
        "<clickhouse>",
        *_elements(server, "  "),
        "  <logger>",
        *_elements({"log": str(settings.engine_log), "console": "0"}, "    "),
        "  </logger>",
        "  <backups>",
        *_elements({"allowed_path": str(settings.backup_path)}, "    "),
        "  </backups>",
        "  <kafka>",
        *_elements(kafka_client_settings(settings, secret), "    "),
        "  </kafka>",
        "  <profiles>",
        "    <default>",
        *_elements(PROFILE_SETTINGS, "      "),
        "    </default>",
        "  </profiles>",
        "  <users>",
        "    <default>",
        *_elements({"profile": "default", "quota": "default", "password": ""}, "      "),
        "      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>",
        *_elements({"access_management": "1"}, "      "),
        "    </default>",
        "  </users>",
        "  <quotas><default></default></quotas>",
        "</clickhouse>",
    ]
    return "\n".join(lines) + "\n"


def connection_string(settings: ServerSettings) -> str:
    """Write the configuration beside the data directory; return what chdb connects with.
    The log level goes on the connection string: chdb ignores the file's. The file holds the
    Kafka password when there is one: private to this account from its first byte."""
    path = _path(settings)
    settings.engine_log.parent.mkdir(parents=True, exist_ok=True)
    _write(path, render(settings, path))
    return f"{settings.data_dir}?config-file={path}&log-level={settings.engine_log_level}"


def redact(settings: ServerSettings) -> None:
    """Write the configuration again without the Kafka password, once the engine has read
    it (the engine reads its configuration once per process, at its first connection): a
    file the engine can be made to read (`file()`) then holds no secret."""
    path = _path(settings)
    _write(path, render(settings, path, secret=False))


def _path(settings: ServerSettings) -> Path:
    return settings.data_dir.with_name(settings.data_dir.name + "-engine.xml")


def _write(path: Path, text: str) -> None:
    """In place (the server may own the file, not its folder), private from the first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)  # one an older release wrote may be wider
    with os.fdopen(fd, "w") as file:
        file.write(text)
