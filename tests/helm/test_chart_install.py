"""`helm install`, `upgrade` and `uninstall` against a real kube-apiserver (conftest.py):
the objects it stored, read back over its REST API. No controller runs there, so the schema
Job (a hook helm waits for) is marked complete by the test, as the Job controller would once
its pod succeeded."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime

import httpx
import pytest

from stack.processes import wait_until
from tests.helm.helm_tools import CHART, Cluster, helm_env, run_helm, tool

NAMESPACE = "jobscope-test"
RELEASE = "site"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
SMALL_SITE = str(CHART / "ci" / "small-site.yaml")


def complete_job(api: httpx.Client, name: str, timeout: float = 60) -> None:
    """Wait for Job `name`, then give it the status a succeeded pod would have given it."""
    path = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{name}"
    wait_until(lambda: api.get(path).status_code == 200, timeout, f"hook Job {name}")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [
        {"type": kind, "status": "True", "lastTransitionTime": now}
        for kind in ("SuccessCriteriaMet", "Complete")
    ]
    answer = api.patch(
        f"{path}/status",
        json={
            "status": {
                "startTime": now,
                "completionTime": now,
                "succeeded": 1,
                "conditions": conditions,
            }
        },
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert answer.status_code == 200, answer.text


def helm_with_hook(cluster: Cluster, *args: str) -> None:
    """`helm ARGS` that waits for the schema Job hook, which the test completes meanwhile."""
    helm = subprocess.Popen(
        [str(tool("helm")), *args, "--namespace", NAMESPACE, "--timeout", "90s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=helm_env(cluster),
    )
    try:
        with cluster.client() as api:
            complete_job(api, f"{RELEASE}-jobscope-schema")
        out, _ = helm.communicate(timeout=90)
    finally:
        if helm.poll() is None:
            helm.kill()
            helm.communicate()
    assert helm.returncode == 0, f"helm {' '.join(args)}:\n{out}"


def items(api: httpx.Client, path: str) -> dict[str, dict]:
    answer = api.get(path, params={"labelSelector": INSTANCE})
    answer.raise_for_status()
    return {item["metadata"]["name"]: item for item in answer.json()["items"]}


def stored(api: httpx.Client) -> dict[str, set[str]]:
    """Names of the release's objects the API server holds, by kind."""
    ns = f"namespaces/{NAMESPACE}"
    paths = {
        "Deployment": f"/apis/apps/v1/{ns}/deployments",
        "Service": f"/api/v1/{ns}/services",
        "Secret": f"/api/v1/{ns}/secrets",
        "ConfigMap": f"/api/v1/{ns}/configmaps",
        "ServiceAccount": f"/api/v1/{ns}/serviceaccounts",
        "PodDisruptionBudget": f"/apis/policy/v1/{ns}/poddisruptionbudgets",
        "NetworkPolicy": f"/apis/networking.k8s.io/v1/{ns}/networkpolicies",
        "Job": f"/apis/batch/v1/{ns}/jobs",
    }
    return {kind: set(items(api, path)) for kind, path in paths.items()}


def deployments(api: httpx.Client) -> dict[str, dict]:
    return items(api, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments")


def shard_args(deployment: dict) -> str:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--shard") + 1]


@pytest.mark.slow
def test_install_upgrade_uninstall(cluster: Cluster) -> None:
    api = cluster.client()
    helm_with_hook(cluster, "install", RELEASE, str(CHART), "-f", SMALL_SITE, "--create-namespace")

    objects = stored(api)
    assert objects["Deployment"] == {f"{RELEASE}-jobscope-api", f"{RELEASE}-jobscope-producers-0"}
    assert objects["Service"] == {f"{RELEASE}-jobscope-api"}
    assert objects["Secret"] == {f"{RELEASE}-jobscope-credentials"}
    assert objects["ConfigMap"] == {f"{RELEASE}-jobscope-devices"}
    assert objects["ServiceAccount"] == {f"{RELEASE}-jobscope"}
    assert len(objects["PodDisruptionBudget"]) == 2
    assert len(objects["NetworkPolicy"]) == 3
    assert objects["Job"] == set()  # hook-succeeded: deleted once complete
    api_deployment = deployments(api)[f"{RELEASE}-jobscope-api"]
    assert api_deployment["spec"]["replicas"] == 2
    assert shard_args(deployments(api)[f"{RELEASE}-jobscope-producers-0"]) == "0/1"
    (release,) = json.loads(run_helm(cluster, "list", "-n", NAMESPACE, "-o", "json"))
    assert (release["name"], release["revision"], release["status"]) == (RELEASE, "1", "deployed")

    helm_with_hook(
        cluster, "upgrade", RELEASE, str(CHART), "-f", SMALL_SITE,
        "--set", "producers.shards=3", "--set", "api.replicaCount=4",
    )  # fmt: skip
    stored_deployments = deployments(api)
    producers = {n: d for n, d in stored_deployments.items() if "-producers-" in n}
    assert {shard_args(d) for d in producers.values()} == {"0/3", "1/3", "2/3"}
    assert stored_deployments[f"{RELEASE}-jobscope-api"]["spec"]["replicas"] == 4
    status = run_helm(cluster, "status", RELEASE, "-n", NAMESPACE)
    assert "REVISION: 2" in status and "STATUS: deployed" in status

    run_helm(cluster, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "60s")
    wait_until(lambda: not any(stored(api).values()), 30, "the release's objects to be deleted")
    releases = api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets").json()["items"]
    assert not [s for s in releases if s["metadata"]["name"].startswith("sh.helm.release")]
