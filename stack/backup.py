"""`python -m stack backup DIR [--incremental-from PREV]` and `python -m stack restore DIR`.

A backup is consistent at a known Kafka offset: while it is taken the Kafka-engine tables are
detached (their consumers commit what they stored and stop; what producers and the API
publish meanwhile waits in Kafka) and the refreshable rollups are stopped, so the database
holds exactly what each consumer group committed, and the offsets recorded beside it say where
ingestion resumes. Nothing stops publishing: the producers and the API keep running.

DIR holds `manifest.json` (the schema version, the Kafka tables, the SQL functions, each
group's committed offsets per partition with the topic's id), `clickhouse/` (ClickHouse's own
`BACKUP DATABASE ... TO File`, incremental over PREV's with `base_backup`), `secrets.env`
(mode 600), the devices file (or folder: `devices/`), and the token revocations (a Kafka-only
topic).

A restore needs a state directory without a ClickHouse database (a fresh machine, or a lost
disk) and the stack stopped. It puts back the secrets and the devices file, starts Kafka and
ClickHouse, restores the database, points each consumer group at its backed-up offsets and
only then creates the Kafka tables, so ingestion resumes right after what the backup held: no
gap while the broker still holds those messages, no duplicate. A broker that is not the one
backed up (its topics have other ids) starts each group at its topics' start and gets the
revocations published again; what the lost broker held past the backup is lost with it.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from clickhouse_connect.driver.client import Client
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from clickhouse.migrate import MIGRATIONS_DIR
from kafka import topics
from stack import kafka_broker, secrets, services
from stack.config import REPO_ROOT, StackSettings

log = logging.getLogger("jobscope.backup")

FORMAT = 1
MANIFEST = "manifest.json"
DEVICES = "devices"
DATABASE = "default"
# A statement of a large database runs long: the client waits as long as the migrations do.
TIMEOUT_S = 6 * 3600


@dataclass(frozen=True)
class KafkaTable:
    """A Kafka-engine table: how to create it again, and the group and topics it consumes."""

    name: str
    create: str
    group: str
    topics: list[str]

    @classmethod
    def parse(cls, name: str, create: str) -> KafkaTable:
        group = re.search(r"kafka_group_name = '([^']*)'", create)
        listed = re.search(r"kafka_topic_list = '([^']*)'", create)
        if group is None or listed is None:
            raise RuntimeError(f"{name}: no kafka_group_name or kafka_topic_list in its DDL")
        return cls(name, create, group[1], [t.strip() for t in listed[1].split(",") if t.strip()])


def _client(settings: StackSettings) -> Client:
    return services.clickhouse_client(
        settings, "jobscope", database=DATABASE, send_receive_timeout=TIMEOUT_S
    )


def _admin(settings: StackSettings) -> AdminClient:
    security = kafka_broker.client_settings(settings).kafka_security()
    return AdminClient({"bootstrap.servers": settings.kafka_bootstrap, **security})


def _file(path: Path) -> str:
    return "File('" + str(path.resolve()).replace("\\", "\\\\").replace("'", "\\'") + "')"


def kafka_tables(client: Client) -> list[KafkaTable]:
    rows = client.query(
        "SELECT name, create_table_query FROM system.tables "
        "WHERE database = {db:String} AND engine = 'Kafka' ORDER BY name",
        parameters={"db": DATABASE},
    ).result_rows
    return [KafkaTable.parse(name, create) for name, create in rows]


def topic_ids(admin: AdminClient, names: list[str]) -> dict[str, str]:
    """Each existing topic's id: a broker that lost its data gives a new topic another id."""
    existing = set(admin.list_topics(timeout=30).topics)
    wanted = [n for n in names if n in existing]
    if not wanted:
        return {}
    found = admin.describe_topics(TopicCollection(wanted), request_timeout=30)
    return {name: str(future.result().topic_id) for name, future in found.items()}


def committed(admin: AdminClient, group: str) -> dict[str, dict[str, int]]:
    """The offsets `group` committed, by topic and partition."""
    request = [ConsumerGroupTopicPartitions(group)]
    result = admin.list_consumer_group_offsets(request, request_timeout=30)[group].result()
    offsets: dict[str, dict[str, int]] = {}
    for tp in result.topic_partitions:
        if tp.offset >= 0:
            offsets.setdefault(tp.topic, {})[str(tp.partition)] = tp.offset
    return offsets


def _read_topic(settings: StackSettings, topic: str) -> list[list[str | None]]:
    """Every message of a (small, compacted) topic as [key, value] in base64, in order."""
    security = kafka_broker.client_settings(settings).kafka_security()
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            **security,
            "group.id": "jobscope-backup",  # assigned, never joined nor committed
            "enable.auto.commit": False,
        }
    )
    messages: list[list[str | None]] = []
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        for partition in sorted(metadata.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 30)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, low)])
            while True:
                msg = consumer.poll(30)
                if msg is None:
                    raise RuntimeError(f"{topic}[{partition}]: no message before offset {high}")
                if msg.error():
                    raise RuntimeError(f"{topic}[{partition}]: {msg.error()}")
                messages.append([_b64(msg.key()), _b64(msg.value())])
                if msg.offset() >= high - 1:
                    break
    finally:
        consumer.close()
    return messages


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _release() -> str:
    """The commit of the code that took the backup ('' outside a git checkout)."""
    done = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "describe", "--always", "--tags", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()


def _prepare_dir(settings: StackSettings, folder: Path) -> None:
    """`folder` private to this account; its clickhouse/ the ClickHouse account's, when the
    server runs as one (it writes the backup there itself)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.chmod(0o700)
    account = services.clickhouse_account(settings)
    if account:
        services.give_to(account, folder / "clickhouse", directory=True)
        services.let_account_reach(folder / "clickhouse", *account, listed=True)


def backup(settings: StackSettings, folder: Path, base: Path | None = None) -> dict[str, object]:
    """Take a backup of the running stack into `folder` (new or empty); incremental over the
    backup in `base`. Returns the manifest written."""
    if (folder / MANIFEST).exists() or (folder / "clickhouse" / ".backup").exists():
        raise RuntimeError(f"{folder} already holds a backup: give a new folder")
    if base is not None and not (base / MANIFEST).exists():
        raise RuntimeError(f"{base} holds no backup ({MANIFEST} missing)")
    _prepare_dir(settings, folder)
    client, admin = _client(settings), _admin(settings)
    tables = kafka_tables(client)
    functions = client.query(
        "SELECT create_query FROM system.functions WHERE origin = 'SQLUserDefined' ORDER BY name"
    ).result_rows
    migrations = [
        row[0]
        for row in client.query("SELECT name FROM schema_migrations ORDER BY name").result_rows
    ]
    client.command("SYSTEM STOP VIEWS")
    detached: list[KafkaTable] = []
    try:
        for table in tables:
            client.command(f"DETACH TABLE {table.name}")
            detached.append(table)
        offsets = {t.group: committed(admin, t.group) for t in tables}
        every_topic = sorted({name for t in tables for name in t.topics})
        ids = topic_ids(admin, every_topic)
        settings_clause = f" SETTINGS base_backup = {_file(base / 'clickhouse')}" if base else ""
        client.command(
            f"BACKUP DATABASE {DATABASE} TO {_file(folder / 'clickhouse')}{settings_clause}"
        )
    finally:
        for table in detached:
            client.command(f"ATTACH TABLE {table.name}")
        client.command("SYSTEM START VIEWS")
    secrets.write_private(folder / "secrets.env", (settings.state_dir / "secrets.env").read_text())
    _copy(settings.devices_file, folder / DEVICES)
    manifest: dict[str, object] = {
        "format": FORMAT,
        "taken_at": datetime.now(UTC).isoformat(),
        "release": _release(),
        "schema_migrations": migrations,
        "base": str(base.resolve()) if base else None,
        "devices_file": str(settings.devices_file),
        "functions": [row[0] for row in functions],
        "kafka_tables": [t.__dict__ for t in tables],
        "offsets": offsets,
        "topic_ids": ids,
        "revocations": _read_topic(settings, topics.TOKEN_REVOCATIONS.name),
    }
    secrets.write_private(folder / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return manifest


def load_manifest(folder: Path) -> dict[str, object]:
    path = folder / MANIFEST
    if not path.exists():
        raise RuntimeError(f"{folder} holds no backup ({MANIFEST} missing)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise RuntimeError(f"{path}: format {manifest.get('format')}, this release reads {FORMAT}")
    unknown = set(manifest["schema_migrations"]) - {p.name for p in MIGRATIONS_DIR.glob("*.sql")}
    if unknown:
        raise RuntimeError(
            f"the backup's schema is newer than this release (it has {', '.join(sorted(unknown))}"
            "): restore it with the release that took it, or a later one"
        )
    return manifest


def _chain(folder: Path) -> list[Path]:
    """`folder` and the backups it is incremental over, each checked to be there."""
    chain = [folder]
    while (base := load_manifest(chain[-1])["base"]) is not None:
        base_path = Path(str(base))
        if not (base_path / "clickhouse" / ".backup").exists():
            raise RuntimeError(f"{chain[-1]} is incremental over {base_path}, which is missing")
        chain.append(base_path)
    return chain


def restore(settings: StackSettings, folder: Path) -> list[str]:
    """Restore the backup in `folder` into a state directory that holds no ClickHouse
    database, the stack stopped; leaves it stopped. Returns what it says it did."""
    manifest = load_manifest(folder)
    chain = _chain(folder)
    data_dir = settings.state_dir / "clickhouse"
    if data_dir.exists() and any(data_dir.iterdir()):
        raise RuntimeError(
            f"{data_dir} holds a database: restore into a fresh state directory "
            "(move this one aside, or JOBSCOPE_STATE_DIR)"
        )
    if any(services.process(settings, n).is_running() for n in services.STOP_ORDER):
        raise RuntimeError("the stack is running: stop it first (make down)")
    secrets.private_dir(settings.state_dir)
    secrets.write_private(settings.state_dir / "secrets.env", (folder / "secrets.env").read_text())
    said = [_restore_devices(settings, folder / DEVICES)]
    account = services.clickhouse_account(settings)
    if account:
        for link in chain:
            services.give_to(account, link / "clickhouse", directory=True)
            services.let_account_reach(link / "clickhouse", *account, listed=True)
    try:
        services.start_kafka(settings)
        services.start_clickhouse(settings, schema=False)
        client = _client(settings)
        for create in manifest["functions"]:
            client.command(re.sub(r"^CREATE FUNCTION", "CREATE FUNCTION IF NOT EXISTS", create))
        client.command(f"RESTORE DATABASE {DATABASE} FROM {_file(folder / 'clickhouse')}")
        said.append(_restore_offsets(settings, manifest))
        said.extend(_republish_revocations(settings, manifest))
        for table in manifest["kafka_tables"]:
            client.command(table["create"])
        services.apply_schema(settings)  # this release's migrations past the backup's
    finally:
        services.stop_all(settings)
    return said


def _copy(source: Path, target: Path) -> None:
    """A devices file, or a folder of them (`DEVICES=sample`)."""
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copyfile(source, target)


def _same(one: Path, other: Path) -> bool:
    if one.is_dir() and other.is_dir():
        names = sorted(p.relative_to(one) for p in one.rglob("*"))
        if names != sorted(p.relative_to(other) for p in other.rglob("*")):
            return False
        return all(_same(one / name, other / name) for name in names if (one / name).is_file())
    return one.is_file() and other.is_file() and one.read_bytes() == other.read_bytes()


def _restore_devices(settings: StackSettings, saved: Path) -> str:
    """Where the settings say the devices are; a different one there is kept aside."""
    target = settings.devices_file
    if target.exists() and _same(saved, target):
        return f"devices: {target} as backed up"
    if target.exists():
        target.replace(target.with_name(target.name + ".before-restore"))
    target.parent.mkdir(parents=True, exist_ok=True)
    _copy(saved, target)
    return f"devices: {target} restored"


def _restore_offsets(settings: StackSettings, manifest: dict[str, object]) -> str:
    """Point each consumer group at its backed-up offsets on the topics the broker still
    holds (the same ids); at the start of a topic the broker holds anew."""
    admin = _admin(settings)
    saved_ids: dict[str, str] = manifest["topic_ids"]  # type: ignore[assignment]
    offsets: dict[str, dict[str, dict[str, int]]] = manifest["offsets"]  # type: ignore[assignment]
    consumed = {t["group"]: t["topics"] for t in manifest["kafka_tables"]}  # type: ignore[attr-defined]
    names = sorted({name for listed in consumed.values() for name in listed})
    ids = topic_ids(admin, names)
    kept = [n for n in names if ids.get(n) and ids[n] == saved_ids.get(n)]
    for group, listed in consumed.items():
        partitions = []
        for topic in listed:
            for partition in _partitions(admin, topic):
                low, high = _watermarks(settings, topic, partition)
                saved = offsets.get(group, {}).get(topic, {}).get(str(partition))
                wanted = low if topic not in kept or saved is None else min(max(saved, low), high)
                if topic in kept and saved is not None and saved < low:
                    log.warning(
                        "%s[%d]: offsets %d..%d expired: lost", topic, partition, saved, low
                    )
                partitions.append(TopicPartition(topic, partition, wanted))
        if partitions:
            request = [ConsumerGroupTopicPartitions(group, partitions)]
            admin.alter_consumer_group_offsets(request, request_timeout=30)[group].result()
    lost = sorted(set(names) - set(kept))
    if not lost:
        return "Kafka: every consumer group resumes right after the backup"
    return (
        f"Kafka: the broker is not the one backed up for {', '.join(lost)}: consumed from "
        "their start; what the lost broker held past the backup is lost"
    )


def _partitions(admin: AdminClient, topic: str) -> list[int]:
    metadata = admin.list_topics(topic, timeout=30).topics.get(topic)
    return sorted(metadata.partitions) if metadata and not metadata.error else []


def _watermarks(settings: StackSettings, topic: str, partition: int) -> tuple[int, int]:
    security = kafka_broker.client_settings(settings).kafka_security()
    consumer = Consumer(
        {"bootstrap.servers": settings.kafka_bootstrap, **security, "group.id": "jobscope-backup"}
    )
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
    finally:
        consumer.close()


def _republish_revocations(settings: StackSettings, manifest: dict[str, object]) -> list[str]:
    """Token revocations live in Kafka alone: a broker that lost them gets them again."""
    topic = topics.TOKEN_REVOCATIONS.name
    saved: list[list[str | None]] = manifest["revocations"]  # type: ignore[assignment]
    if not saved or _read_topic(settings, topic):
        return []
    security = kafka_broker.client_settings(settings).kafka_security()
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, **security, "acks": "all"})
    for key, value in saved:
        producer.produce(topic, key=_unb64(key), value=_unb64(value))
    if producer.flush(30):
        raise RuntimeError(f"the token revocations could not be published again to {topic}")
    return [f"token revocations: {len(saved)} published again to {topic}"]
