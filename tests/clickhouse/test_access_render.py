"""The SQL users' access control of a real ClickHouse server (clickhouse/access.py): every
statement, for one server and for a cluster, under each read policy, is parsed by ClickHouse's
own parser (formatQuery of the local engine, the same 26.1 as the server's). The engine cannot
run them: chdb keeps its users in read-only XML (system.user_directories holds `users_xml`
only; CREATE ROLE fails with code 514), so here they are parsed, not executed, and the step
is shown to skip the embedded server."""

from __future__ import annotations

import re
import uuid

import chdb
import pytest
from clickhouse_connect.driver.client import Client

from clickhouse.access import (
    OTHERS_POLICY,
    PROFILE,
    QUOTA_LIMITS,
    READER_ROLE,
    READINGS,
    SERVICE_ROLE,
    USER_POLICY,
    AccessControl,
    apply_access_control,
    has_access_storage,
)
from clickhouse.cluster import ClusterLayout
from tests.clickhouse.test_cluster_render import parsed

LAYOUTS = {"one-server": ClusterLayout(), "cluster": ClusterLayout(cluster="jobscope")}
# Tables no SQL role may read: Kafka-engine queues, raw rejected messages, the audit log,
# the rollups' bookkeeping, the OAR connector's, the migrations' record.
NEVER = (
    "readings_queue",
    "jobs_queue",
    "oar_changes_queue",
    "ingest_errors",
    "audit",
    "rollup_pending",
    "rollup_marks",
    "oar_resources",
    "schema_migrations",
)


def rendered(policy: str, layout: str) -> list[str]:
    access = AccessControl(
        database="default",
        read_policy=policy,  # type: ignore[arg-type]
        layout=LAYOUTS[layout],
        readers=("alice", "o`dd"),
        services=("superset",),
    )
    return [parsed(statement) for statement in access.statements()]


def granted(texts: list[str], role: str) -> set[str]:
    pattern = rf"^GRANT (?:ON CLUSTER \w+ )?SELECT ON default\.(\w+) TO {role}$"
    return {m[1] for t in texts if (m := re.match(pattern, t))}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", ["open", "authenticated", "jobs"])
def test_every_statement_parses(policy: str, layout: str) -> None:
    texts = rendered(policy, layout)
    assert texts[0].startswith(f"CREATE ROLE IF NOT EXISTS {READER_ROLE}")
    if layout == "cluster":
        assert all(" ON CLUSTER jobscope" in t for t in texts)
    else:
        assert not any("ON CLUSTER" in t for t in texts)
    # the users the deployment names get their role, quoted whatever their name
    assert any(t == "GRANT" + _on(layout) + f" {READER_ROLE} TO `o\\`dd`" for t in texts), texts
    assert any(t.startswith("ALTER USER superset") and SERVICE_ROLE in t for t in texts)


def _on(layout: str) -> str:
    return " ON CLUSTER jobscope" if layout == "cluster" else ""


@pytest.mark.parametrize("layout", LAYOUTS)
def test_under_jobs_people_read_jobs_by_row_policy_and_no_readings(layout: str) -> None:
    texts = rendered("jobs", layout)
    local = layout == "cluster"
    jobs_tables = {"jobs", "jobs_local"} if local else {"jobs"}
    jobs_tables |= {"job_records", "job_records_local"} if local else {"job_records"}
    assert granted(texts, READER_ROLE) == jobs_tables | (
        {"device_aliases", "device_aliases_local"} if local else {"device_aliases"}
    )
    for table in jobs_tables:
        own = [
            t
            for t in texts
            if t.startswith(f"CREATE ROW POLICY OR REPLACE {USER_POLICY} ON default.{table} ")
        ]
        assert len(own) == 1 and own[0].endswith(f"TO {READER_ROLE}"), texts
        assert (
            "(user = currentUser()) OR has(enabledRoles(), concat('jobscope_project_', project))"
            in own[0]
        )
        others = [t for t in texts if f"{OTHERS_POLICY} ON default.{table} " in t]
        assert len(others) == 1 and others[0].endswith(f"USING 1 TO ALL EXCEPT {READER_ROLE}")
    # the policies exist before the role's grants are given back
    first_grant = next(i for i, t in enumerate(texts) if t.startswith("GRANT"))
    assert all(i < first_grant for i, t in enumerate(texts) if "ROW POLICY" in t)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", ["open", "authenticated"])
def test_otherwise_people_read_readings_and_no_row_policy_is_left(policy: str, layout: str) -> None:
    texts = rendered(policy, layout)
    assert set(READINGS) <= granted(texts, READER_ROLE)
    assert not any("CREATE ROW POLICY" in t for t in texts)
    drops = [t for t in texts if t.startswith("DROP ROW POLICY IF EXISTS")]
    assert any(USER_POLICY in t for t in drops) and any(OTHERS_POLICY in t for t in drops)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", ["open", "jobs"])
def test_grants_name_jobscopes_tables_only(policy: str, layout: str) -> None:
    texts = rendered(policy, layout)
    for role in (READER_ROLE, SERVICE_ROLE):
        tables = granted(texts, role)
        assert tables and not tables & {*NEVER, *(f"{t}_local" for t in NEVER)}, tables
    grants = [t for t in texts if t.startswith("GRANT") and " SELECT ON " in t]
    assert all(" ON default." in t for t in grants), grants  # never *.*, never system
    assert set(READINGS) <= granted(texts, SERVICE_ROLE)  # Superset filters rows itself
    # every run takes back what an earlier one granted (readings, when the policy tightens)
    revoke = texts.index(f"REVOKE{_on(layout)} ALL ON *.* FROM {READER_ROLE}, {SERVICE_ROLE}")
    assert revoke < min(i for i, t in enumerate(texts) if t.startswith("GRANT"))


def test_profile_holds_the_local_servers_limits() -> None:
    (profile,) = [t for t in rendered("jobs", "one-server") if "SETTINGS PROFILE" in t]
    for expected in (
        "max_execution_time = 60 MIN 1 MAX 60",
        "max_memory_usage = 4294967296 MIN 1 MAX 4294967296",
        "max_rows_to_read = 10000000000 MIN 1 MAX 10000000000",
        "max_threads = 2 MIN 1 MAX 2",
        "os_thread_priority = 10 MIN 10 MAX 19",
        "max_concurrent_queries_for_user = 4 MIN 1 MAX 4",
        "readonly = 1 CONST",
        "final = 1 CONST",
        "apply_row_policy_after_final = 1 CONST",
    ):
        assert expected in profile, profile
    assert profile.startswith(f"CREATE SETTINGS PROFILE OR REPLACE `{PROFILE}`")
    assert profile.endswith(f"TO {READER_ROLE}, {SERVICE_ROLE}")


def test_profile_settings_and_quota_keys_exist_in_this_clickhouse() -> None:
    """formatQuery does not check names: the engine's own tables do."""
    (profile,) = [t for t in rendered("open", "one-server") if "SETTINGS PROFILE" in t]
    names = re.findall(r"(?:SETTINGS |, )(\w+) = ", profile)
    listed = ", ".join(f"'{name}'" for name in names)
    known = _column(f"SELECT name FROM system.settings WHERE name IN ({listed})")
    assert sorted(known) == sorted(names)
    columns = _column(
        "SELECT name FROM system.columns WHERE database = 'system' AND table = 'quota_limits'"
    )
    assert {f"max_{key}" for key in QUOTA_LIMITS} <= set(columns)


def _column(query: str) -> list[str]:
    return chdb.query(query, "TabSeparatedRaw").bytes().decode().split()


def test_embedded_server_has_no_access_storage_and_is_skipped(admin_client: Client) -> None:
    """The local server's engine cannot hold roles: the step does nothing there, and refuses
    (rather than skip) when told to grant users."""
    assert not has_access_storage(admin_client)
    assert not apply_access_control(admin_client, AccessControl("default", "jobs"))
    with pytest.raises(RuntimeError, match="no writable access storage"):
        apply_access_control(admin_client, AccessControl("default", "jobs", readers=("alice",)))


def test_under_jobs_a_reader_reads_no_record_of_a_job_it_may_not_see(admin_client: Client) -> None:
    """The attack: bob, a SQL user under `jobs`, reads alice's job record (its user, project
    and summary). The engine cannot hold row policies (above), so the one rendered for
    job_records runs here as the WHERE clause the server would add, over the real table,
    currentUser() and enabledRoles() given as the server would: bob reads his record only;
    pia, holding the role of alice's project, reads alice's too."""
    (policy,) = [
        t
        for t in AccessControl("default", "jobs").statements()
        if t.startswith(f"CREATE ROW POLICY OR REPLACE {USER_POLICY} ON `default`.`job_records`")
    ]
    using = re.fullmatch(rf".* USING (.*) TO {READER_ROLE}", policy)
    assert using is not None, policy
    clause = (
        using[1]
        .replace("currentUser()", "{me:String}")
        .replace("enabledRoles()", "{roles:Array(String)}")
    )
    tag = uuid.uuid4().hex[:8]
    rows = [
        ["", f"{tag}-a", f"alice-{tag}", f"p1-{tag}", 1, '{"energy_job": {"joules": 1.0}}'],
        ["", f"{tag}-b", f"bob-{tag}", f"p2-{tag}", 1, '{"energy_job": {"joules": 2.0}}'],
    ]
    admin_client.insert(
        "job_records",
        rows,
        column_names=["site", "job_id", "user", "project", "version", "summary"],
    )

    def read(me: str, roles: list[str]) -> set[str]:
        query = (
            f"SELECT job_id FROM job_records FINAL WHERE job_id LIKE {{tag:String}} AND ({clause})"
        )
        params = {"tag": f"{tag}-%", "me": me, "roles": roles}
        return {r[0] for r in admin_client.query(query, parameters=params).result_rows}

    assert read(f"bob-{tag}", []) == {f"{tag}-b"}
    assert read(f"bob-{tag}", [READER_ROLE]) == {f"{tag}-b"}
    assert read(f"pia-{tag}", [f"jobscope_project_p1-{tag}"]) == {f"{tag}-a"}
    assert read(f"alice-{tag}", []) == {f"{tag}-a"}
