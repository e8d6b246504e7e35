"""Every migration renders for a ClickHouse cluster into statements ClickHouse's own parser
accepts (the local engine's formatQuery), and renders unchanged for one server."""

from __future__ import annotations

import chdb
import pytest

from clickhouse.cluster import DISTRIBUTED, ClusterLayout
from clickhouse.migrate import MIGRATIONS_DIR, MigrationSettings, render, statements

MIGRATIONS = sorted(MIGRATIONS_DIR.glob("*.sql"))


def migration_statements(settings: MigrationSettings) -> list[str]:
    return [
        statement
        for path in MIGRATIONS
        for statement in statements(render(path.read_text(), settings.placeholders()))
    ]


def parsed(statement: str) -> str:
    """ClickHouse's canonical text of `statement` (a syntax error raises)."""
    # a query parameter's value is read in the escaped (TSV) form
    escaped = statement.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
    result = chdb.query("SELECT formatQuery({q:String})", "TabSeparatedRaw", params={"q": escaped})
    return result.bytes().decode().strip()


@pytest.mark.parametrize("replicated", [True, False], ids=["replicated", "sharded"])
def test_cluster_rendering_parses(replicated: bool) -> None:
    settings = MigrationSettings(
        clickhouse_admin_password="unused",
        clickhouse_cluster="jobscope",
        clickhouse_replicated=replicated,
    )
    layout = settings.layout()
    rendered = [part for s in migration_statements(settings) for part in layout.render(s)]
    texts = [parsed(statement) for statement in rendered]
    ddl = [t for t in texts if not t.startswith("INSERT")]
    assert ddl and all(" ON CLUSTER jobscope" in t for t in ddl)
    engines = " ".join(t for t in texts if "MergeTree" in t)
    assert (
        "ReplicatedReplacingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}'" in engines
    ) is replicated
    assert ("ReplicatedAggregatingMergeTree(" in engines) is replicated
    for table in DISTRIBUTED:
        assert any(
            t.startswith(f"CREATE OR REPLACE TABLE {table} ON CLUSTER jobscope AS {table}_local")
            and f"Distributed(jobscope, currentDatabase(), {table}_local" in t
            for t in texts
        ), table
    # views write to the local tables, one Kafka-engine table per host in one group
    assert not any(
        f"TO {table}\n" in t or t.endswith(f"TO {table}") for t in texts for table in DISTRIBUTED
    )
    kafka = [t for t in texts if "ENGINE = Kafka" in t]
    assert kafka and all(f"kafka_group_name = '{settings.consumer_group}" in t for t in kafka)


def test_one_server_rendering_is_unchanged() -> None:
    settings = MigrationSettings(clickhouse_admin_password="unused")
    layout = settings.layout()
    for statement in migration_statements(settings):
        assert layout.render(statement) == [statement]
    assert ClusterLayout().local("metrics") == "metrics"


def test_unknown_statement_refused() -> None:
    with pytest.raises(ValueError, match="no cluster rendering"):
        ClusterLayout(cluster="c").render("SYSTEM FLUSH LOGS")


def test_retention_change_reaches_every_host() -> None:
    """The TTL change of `ensure_retention` goes to the local tables, ON CLUSTER."""
    alter = "ALTER TABLE metrics MODIFY TTL toDateTime(timestamp) + INTERVAL 30 DAY"
    (rendered,) = ClusterLayout(cluster="jobscope").render(alter)
    assert parsed(rendered).startswith("ALTER TABLE metrics_local ON CLUSTER jobscope")
