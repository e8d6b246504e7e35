"""The embedded engine's own configuration (what clickhouse-server reads from config.xml):
where and how much the engine logs, and the librdkafka settings of every Kafka table.

chdb takes start-up arguments in the connection string: `<data_dir>?config-file=<path>&...`.
"""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

from clickhouse.server.config import ServerSettings


def kafka_client_settings(settings: ServerSettings) -> dict[str, str]:
    """librdkafka properties (dots as underscores, as ClickHouse's <kafka> section wants).

    A short session timeout lets a group forget the consumers of a killed server within
    seconds (librdkafka's default keeps them, and stalls the new ones, for 45 s); frequent
    heartbeats let a busy consumer learn of a rebalance promptly, so a second consumer
    joining does not hold the group for several heartbeats.
    """
    return {
        "session_timeout_ms": str(settings.kafka_session_timeout_ms),
        "heartbeat_interval_ms": str(settings.kafka_heartbeat_interval_ms),
    }


# Query settings of the engine's default profile, which its own background work uses (the
# Kafka tables' inserts among it). ReplacingMergeTree's dedup of each inserted block costs
# ~30% of the insert; duplicates are removed by merges anyway, and readers use FINAL.
PROFILE_SETTINGS = {"optimize_on_insert": "0"}


def _elements(values: dict[str, str], indent: str) -> str:
    return "".join(f"{indent}<{name}>{escape(value)}</{name}>\n" for name, value in values.items())


def render(settings: ServerSettings, path: Path) -> str:
    """The configuration, which is also its own users configuration: the engine reads
    profiles only from the latter, and the engine's one user (`default`; the server's users
    are enforced by the HTTP layer) must be declared with them."""
    return (
        "<clickhouse>\n"
        f"  <users_config>{escape(str(path))}</users_config>\n"
        "  <logger>\n"
        f"    <log>{escape(str(settings.engine_log))}</log>\n"
        "    <console>0</console>\n"
        "  </logger>\n"
        "  <kafka>\n"
        f"{_elements(kafka_client_settings(settings), '    ')}"
        "  </kafka>\n"
        "  <profiles>\n"
        "    <default>\n"
        f"{_elements(PROFILE_SETTINGS, '      ')}"
        "    </default>\n"
        "  </profiles>\n"
        "  <users>\n"
        "    <default>\n"
        "      <profile>default</profile>\n"
        "      <quota>default</quota>\n"
        "      <password></password>\n"
        "      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>\n"
        "      <access_management>1</access_management>\n"
        "    </default>\n"
        "  </users>\n"
        "  <quotas><default></default></quotas>\n"
        "</clickhouse>\n"
    )


def connection_string(settings: ServerSettings) -> str:
    """Write the configuration beside the data directory; return what chdb connects with.
    The log level goes on the connection string: chdb ignores the file's."""
    path = settings.data_dir.with_name(settings.data_dir.name + "-engine.xml")
    settings.engine_log.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(settings, path))
    return f"{settings.data_dir}?config-file={path}&log-level={settings.engine_log_level}"
