"""The chart lints, renders every scenario into manifests the Kubernetes schemas accept, and
wires the values into the processes' real settings (offline: helm and kubernetes-validate)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helm.helm_tools import CHART, KUBE_SCHEMA_VERSION, run_helm, venv_tool

SCENARIOS = sorted(p.name.removesuffix(".yaml") for p in (CHART / "ci").glob("*.yaml"))


def render(*args: str) -> list[dict]:
    """The manifests `helm template` renders (hooks and tests included)."""
    out = run_helm(None, "template", "t", str(CHART), "--kube-version", KUBE_SCHEMA_VERSION, *args)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def scenario(name: str) -> list[dict]:
    return render("-f", str(CHART / "ci" / f"{name}.yaml"))


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def env_of(container: dict) -> dict[str, dict | str]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv_tool("kubernetes-validate")), "--strict", "-k", KUBE_SCHEMA_VERSION, str(path)],
        capture_output=True,
        text=True,
    )


def test_scenarios_exist() -> None:
    assert set(SCENARIOS) >= {"small-site", "large-site", "external-secrets"}


@pytest.mark.parametrize("name", SCENARIOS)
def test_lint_strict(name: str) -> None:
    out = run_helm(None, "lint", "--strict", str(CHART), "-f", str(CHART / "ci" / f"{name}.yaml"))
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_validates_against_kubernetes_schemas(name: str, tmp_path: Path) -> None:
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump_all(scenario(name)))
    done = validate(manifest)
    assert done.returncode == 0, done.stdout + done.stderr


def test_validation_can_fail(tmp_path: Path) -> None:
    """The schema check rejects a manifest with an unknown field (strict mode works)."""
    docs = scenario("small-site")
    api = by_kind(docs, "Deployment")["t-jobscope-api"]
    api["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    manifest = tmp_path / "broken.yaml"
    manifest.write_text(yaml.safe_dump(api))
    assert validate(manifest).returncode != 0


def test_every_container_runs_unprivileged_on_a_read_only_root() -> None:
    for name in SCENARIOS:
        for doc in scenario(name):
            spec = doc.get("spec", {})
            pod = spec["template"]["spec"] if "template" in spec else spec
            for container in pod.get("containers", []) + pod.get("initContainers", []):
                where = f"{name}: {doc['kind']}/{doc['metadata']['name']}/{container['name']}"
                assert pod["securityContext"]["runAsNonRoot"] is True, where
                context = container["securityContext"]
                assert context["readOnlyRootFilesystem"] is True, where
                assert context["allowPrivilegeEscalation"] is False, where
                assert "resources" in container, where


def test_every_pod_pulls_with_the_image_pull_secrets() -> None:
    """The helm test pod too: it pulls the API's image."""
    pull_secret = ["--set", "imagePullSecrets[0].name=r"]
    for doc in render("-f", str(CHART / "ci" / "large-site.yaml"), *pull_secret):
        spec = doc.get("spec", {})
        pod = spec["template"]["spec"] if "template" in spec else spec
        if "containers" in pod:
            assert pod["imagePullSecrets"] == [{"name": "r"}], doc["metadata"]["name"]


def large_site_values() -> dict:
    """The large-site values (their shard and partition counts come from the sizing,
    bench/publish.py)."""
    return yaml.safe_load((CHART / "ci" / "large-site.yaml").read_text())


def test_large_site_has_its_producer_shards_each_with_its_own_slice() -> None:
    docs = scenario("large-site")
    n = large_site_values()["producers"]["shards"]
    assert n > 1
    producers = {
        name: d for name, d in by_kind(docs, "Deployment").items() if "-producers-" in name
    }
    assert len(producers) == n
    shards, ports = set(), set()
    for deployment in producers.values():
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["strategy"]["type"] == "Recreate"
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        shards.add(container["args"][container["args"].index("--shard") + 1])
        ports.add(container["ports"][0]["containerPort"])
        volume = deployment["spec"]["template"]["spec"]["volumes"][0]
        assert volume["configMap"]["name"] == "site-devices"
    assert shards == {f"{i}/{n}" for i in range(n)}
    assert ports == {9464 + i for i in range(n)}  # the settings add the shard index


def test_cluster_values_reach_the_schema_job() -> None:
    job = by_kind(scenario("large-site"), "Job")["t-jobscope-schema"]
    assert "post-install" in job["metadata"]["annotations"]["helm.sh/hook"]
    pod = job["spec"]["template"]["spec"]
    migrate = env_of(pod["containers"][0])
    assert pod["containers"][0]["command"] == ["python", "-m", "clickhouse.migrate"]
    assert migrate["JOBSCOPE_CLICKHOUSE_CLUSTER"] == "jobscope"
    assert migrate["JOBSCOPE_CLICKHOUSE_REPLICATED"] == "true"
    assert migrate["JOBSCOPE_KAFKA_CONSUMERS"] == "6"
    assert migrate["JOBSCOPE_CLICKHOUSE_ADMIN_PASSWORD"] == {
        "secretKeyRef": {"name": "clickhouse-admin", "key": "password"}
    }
    topics = env_of(pod["initContainers"][0])
    assert pod["initContainers"][0]["command"] == ["python", "-m", "stack.create_topics"]
    partitions = large_site_values()["kafka"]["readingsPartitions"]
    assert topics["JOBSCOPE_READINGS_PARTITIONS"] == str(partitions)
    assert topics["JOBSCOPE_KAFKA_REPLICATION_FACTOR"] == "3"


def schema_job_env(docs: list[dict]) -> dict[str, dict | str]:
    return env_of(
        by_kind(docs, "Job")["t-jobscope-schema"]["spec"]["template"]["spec"]["containers"][0]
    )


def test_sql_access_values_reach_the_schema_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """The schema Job creates the SQL users' access control as the values say: the large
    site's readers under `jobs`, Superset's user as a service; off when disabled."""
    from clickhouse.migrate import MigrationSettings

    for name, value in schema_job_env(scenario("large-site")).items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    access = MigrationSettings(clickhouse_admin_password="unused").access_control()
    assert (access.read_policy, access.readers, access.services) == (
        "jobs",
        ("alice", "bob"),
        ("superset",),
    )
    assert access.layout.cluster == "jobscope"
    deployments = by_kind(scenario("large-site"), "Deployment")
    api = env_of(deployments["t-jobscope-api"]["spec"]["template"]["spec"]["containers"][0])
    assert (api["JOBSCOPE_READ_POLICY"], api["JOBSCOPE_OIDC_ISSUER"]) == (
        "jobs",
        "https://sso.example.org/realms/hpc",
    )
    small = CHART / "ci" / "small-site.yaml"
    default = schema_job_env(render("-f", str(small)))
    assert default["JOBSCOPE_CLICKHOUSE_ACCESS_CONTROL"] == "true"
    assert default["JOBSCOPE_READ_POLICY"] == "open"
    assert default["JOBSCOPE_CLICKHOUSE_SQL_READERS"] == ""
    assert default["JOBSCOPE_CLICKHOUSE_SQL_SERVICES"] == ""
    job_env = schema_job_env(
        render("-f", str(small), "--set", "clickhouse.sqlAccess.enabled=false")
    )
    assert job_env["JOBSCOPE_CLICKHOUSE_ACCESS_CONTROL"] == "false"


def test_env_names_are_settings_the_processes_read() -> None:
    """Every JOBSCOPE_* variable the chart sets is a field of the process's settings model."""
    from api.infra.config import ApiSettings
    from clickhouse.migrate import MigrationSettings
    from producers.config import ProducerSettings
    from stack.create_topics import TopicSettings

    fields = {
        "api": set(ApiSettings.model_fields),
        "producers": set(ProducerSettings.model_fields),
        "migrate": set(MigrationSettings.model_fields),
        "topics": set(TopicSettings.model_fields),
    }
    docs = scenario("large-site")
    deployments = by_kind(docs, "Deployment")
    job = by_kind(docs, "Job")["t-jobscope-schema"]["spec"]["template"]["spec"]
    containers = {
        "api": deployments["t-jobscope-api"]["spec"]["template"]["spec"]["containers"][0],
        "producers": deployments["t-jobscope-producers-0"]["spec"]["template"]["spec"][
            "containers"
        ][0],
        "migrate": job["containers"][0],
        "topics": job["initContainers"][0],
    }
    for process, container in containers.items():
        for name in env_of(container):
            if name.startswith("JOBSCOPE_") and name != "JOBSCOPE_IPMI_SDR_CACHE_DIR":
                field = name.removeprefix("JOBSCOPE_").lower()
                assert field in fields[process], f"{process}: {name} is no setting"


def test_external_secrets_scenario_renders_no_secret() -> None:
    docs = scenario("external-secrets")
    assert by_kind(docs, "Secret") == {}
    assert by_kind(docs, "ConfigMap") == {}
    producer = by_kind(docs, "Deployment")["t-jobscope-producers-1"]
    assert producer["spec"]["template"]["spec"]["volumes"][0]["secret"] == {
        "secretName": "jobscope-devices"
    }
    api = by_kind(docs, "Deployment")["t-jobscope-api"]["spec"]["template"]["spec"]
    env = env_of(api["containers"][0])
    assert env["JOBSCOPE_CLICKHOUSE_API_PASSWORD"] == {
        "secretKeyRef": {"name": "jobscope-clickhouse", "key": "api-password"}
    }
    assert env["JOBSCOPE_ADMIN_TOKEN"]["secretKeyRef"]["name"] == "jobscope-tokens"


def test_large_site_optional_parts() -> None:
    docs = scenario("large-site")
    assert set(by_kind(docs, "HorizontalPodAutoscaler")) == {"t-jobscope-api"}
    assert "replicas" not in by_kind(docs, "Deployment")["t-jobscope-api"]["spec"]
    assert set(by_kind(docs, "Ingress")) == {"t-jobscope-api"}
    assert {"t-jobscope-superset", "t-jobscope-connect"} <= set(by_kind(docs, "Deployment"))
    assert set(by_kind(docs, "PodDisruptionBudget")) == {
        "t-jobscope-api",
        "t-jobscope-producers",
    }
    assert len(by_kind(docs, "NetworkPolicy")) == 5


def test_helm_test_hook_asks_the_api_health() -> None:
    pod = by_kind(scenario("small-site"), "Pod")["t-jobscope-test-api-health"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["command"][-1]
    assert "http://t-jobscope-api:8000/health" in script


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "producers.shards=0"], "/producers/shards"),
        (["--set", "kafka.bootstrapServers=no-port"], "/kafka/bootstrapServers"),
        (["--set", "api.service.type=Nowhere"], "/api/service/type"),
        (["--set", "typo=1"], "typo"),
        ([], "clickhouse.admin.password or clickhouse.admin.existingSecret is required"),
        # static tokens of 16 characters at least, the signing key 32 (api/infra/config.py)
        (["--set", "api.tokens.adminToken=short"], "/api/tokens/adminToken"),
        (["--set", "api.tokens.schedulerToken=" + "x" * 15], "/api/tokens/schedulerToken"),
        (["--set", "api.tokens.tokenSecret=" + "s" * 31], "/api/tokens/tokenSecret"),
        (["--set", "api.tokens.maxTtlDays=0"], "/api/tokens/maxTtlDays"),
        (["--set", "clickhouse.sqlAccess.readPolicy=all"], "/clickhouse/sqlAccess/readPolicy"),
        # SASL needs the Secret of the passwords; a CA only with TLS
        (["--set", "kafka.security.protocol=SASL_SSL"], "/kafka/security/existingSecret"),
        (["--set", "kafka.security.caSecret=ca"], "/kafka/security/protocol"),
        (["--set", "kafka.security.protocol=SSL"], "/kafka/security/protocol"),
    ],
)
def test_bad_values_are_refused(values: list[str], message: str) -> None:
    out = run_helm(
        None, "template", "t", str(CHART), "--kube-version", KUBE_SCHEMA_VERSION, *values,
        check=False,
    )  # fmt: skip
    assert message in out


def test_token_and_body_settings_reach_the_api() -> None:
    """Tokens of the least lengths render; the lifetime, body and throttle settings are the
    API's environment."""
    docs = render(
        "-f", str(CHART / "ci" / "small-site.yaml"),
        "--set", "api.tokens.adminToken=" + "a" * 16,
        "--set", "api.tokens.tokenSecret=" + "s" * 32,
        "--set", "api.tokens.maxTtlDays=30",
        "--set", "api.authThrottle.maxFailures=5",
        "--set", "api.forwardedAllowIps=10.0.0.0/8",
    )  # fmt: skip
    api = by_kind(docs, "Deployment")["t-jobscope-api"]["spec"]["template"]["spec"]
    env = env_of(api["containers"][0])
    assert env["JOBSCOPE_TOKEN_MAX_TTL_DAYS"] == "30"
    assert env["JOBSCOPE_MAX_BODY_BYTES"] == "1048576"
    assert env["JOBSCOPE_AUTH_MAX_FAILURES"] == "5"
    assert env["JOBSCOPE_AUTH_FAILURE_WINDOW_S"] == "60"
    assert env["JOBSCOPE_FORWARDED_ALLOW_IPS"] == "10.0.0.0/8"


def test_kafka_credentials_reach_every_component_that_talks_to_kafka() -> None:
    """large-site: SASL_SSL; each component is its own user, its password from the Secret
    (never in a value), the CA mounted where JOBSCOPE_KAFKA_SSL_CA_FILE says."""
    docs = scenario("large-site")
    deployments = by_kind(docs, "Deployment")
    job = by_kind(docs, "Job")["t-jobscope-schema"]["spec"]["template"]["spec"]
    pods = {
        "api": deployments["t-jobscope-api"]["spec"]["template"]["spec"],
        "producers": deployments["t-jobscope-producers-3"]["spec"]["template"]["spec"],
        "schema": {**job, "containers": job["initContainers"]},
        "connect": deployments["t-jobscope-connect"]["spec"]["template"]["spec"],
    }
    for user, pod in pods.items():
        container = pod["containers"][0]
        env = env_of(container)
        assert env["JOBSCOPE_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL", user
        assert env["JOBSCOPE_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
        assert env["JOBSCOPE_KAFKA_SASL_USERNAME"] == f"jobscope-{user}"
        assert env["JOBSCOPE_KAFKA_SASL_PASSWORD"] == {
            "secretKeyRef": {"name": "kafka-users", "key": user}
        }
        assert env["JOBSCOPE_KAFKA_SSL_CA_FILE"] == "/etc/jobscope/kafka-ca/ca.crt"
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["kafka-ca"] == "/etc/jobscope/kafka-ca"
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["kafka-ca"]["secret"] == {"secretName": "kafka-ca"}
    migrate = env_of(job["containers"][0])  # the schema runner talks to ClickHouse only
    assert "JOBSCOPE_KAFKA_SASL_PASSWORD" not in migrate
    small = scenario("small-site")  # PLAINTEXT: nothing added
    api = by_kind(small, "Deployment")["t-jobscope-api"]["spec"]["template"]["spec"]
    assert not any(n.startswith("JOBSCOPE_KAFKA_SASL") for n in env_of(api["containers"][0]))


def test_retention_and_records_values_reach_the_api_and_the_schema_job() -> None:
    """The API knows the raw retention of the schema (an ended job past it answers from its
    record) and its records' settings; the 1-minute rollups' retention reaches the migrations
    when set, and is left to their default (as raw) when not."""
    docs = scenario("large-site")
    api = by_kind(docs, "Deployment")["t-jobscope-api"]["spec"]["template"]["spec"]
    env = env_of(api["containers"][0])
    assert env["JOBSCOPE_RETENTION_DAYS"] == schema_job_env(docs)["JOBSCOPE_RETENTION_DAYS"]
    assert (env["JOBSCOPE_RECORDS_INTERVAL_S"], env["JOBSCOPE_RECORDS_MAX_BYTES"]) == (
        "60",
        "16777216",
    )
    assert schema_job_env(docs)["JOBSCOPE_ROLLUP_1M_RETENTION_DAYS"] == "400"
    assert "JOBSCOPE_METRIC_REGISTRY" not in env and "JOBSCOPE_NOTE_RULES" not in env
    small = schema_job_env(render("-f", str(CHART / "ci" / "small-site.yaml")))
    assert "JOBSCOPE_ROLLUP_1M_RETENTION_DAYS" not in small


def test_the_sites_registry_and_note_rules_reach_the_api_whole(tmp_path: Path) -> None:
    """A site's registry and rules files (--set-file) become a ConfigMap mounted where the
    API's settings point, and load as the API loads them (indentation kept)."""
    from api import notes, registry
    from api.infra.config import ApiSettings

    repo = CHART.parents[1]
    docs = render(
        "-f", str(CHART / "ci" / "small-site.yaml"),
        "--set-file", f"api.metricRegistry={repo / 'api' / 'registry.yaml'}",
        "--set-file", f"api.noteRules={repo / 'api' / 'notes.yaml'}",
    )  # fmt: skip
    site = by_kind(docs, "ConfigMap")["t-jobscope-api-site"]["data"]
    pod = by_kind(docs, "Deployment")["t-jobscope-api"]["spec"]["template"]["spec"]
    env = env_of(pod["containers"][0])
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "site-files"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "site-files"]
    assert volume["configMap"]["name"] == "t-jobscope-api-site"
    for name, key, load in (
        ("JOBSCOPE_METRIC_REGISTRY", "registry.yaml", registry.load),
        ("JOBSCOPE_NOTE_RULES", "notes.yaml", notes.load),
    ):
        assert env[name] == f"{mount['mountPath']}/{key}"
        assert name.removeprefix("JOBSCOPE_").lower() in ApiSettings.model_fields
        written = tmp_path / key
        written.write_text(site[key])
        assert load(written) == load(repo / "api" / key)
    assert (
        "checksum/site-files"
        in by_kind(docs, "Deployment")["t-jobscope-api"]["spec"]["template"]["metadata"][
            "annotations"
        ]
    )
