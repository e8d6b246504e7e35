"""A real kube-apiserver with its etcd, on loopback, once per session (no controllers, no
kubelet: objects are stored and validated, no pod runs), and helm pointed at it."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from stack.processes import ManagedProcess, wait_until
from stack.transient import STARTING
from tests import ports
from tests.helm.helm_tools import Cluster, tool

HOST = "127.0.0.1"


def _healthy(url: str, token: str) -> bool:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.get(f"{url}/readyz", headers=headers, verify=False, timeout=2).status_code == 200


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    etcd_port, etcd_peer_port, api_port = ports.ports("kubernetes")
    work = tmp_path_factory.mktemp("kube")
    token = secrets.token_hex(16)
    (work / "tokens.csv").write_text(f"{token},admin,admin,system:masters\n")
    key = work / "sa.key"
    subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
    etcd = ManagedProcess("etcd", work, work)
    etcd.start(
        [
            str(tool("etcd")),
            "--data-dir", str(work / "etcd"),
            "--listen-client-urls", f"http://{HOST}:{etcd_port}",
            "--advertise-client-urls", f"http://{HOST}:{etcd_port}",
            "--listen-peer-urls", f"http://{HOST}:{etcd_peer_port}",
            "--initial-advertise-peer-urls", f"http://{HOST}:{etcd_peer_port}",
            "--initial-cluster", f"default=http://{HOST}:{etcd_peer_port}",
        ]
    )  # fmt: skip
    apiserver = ManagedProcess("kube-apiserver", work, work)
    apiserver.start(
        [
            str(tool("kube-apiserver")),
            "--etcd-servers", f"http://{HOST}:{etcd_port}",
            "--bind-address", HOST,
            "--advertise-address", HOST,
            "--secure-port", str(api_port),
            "--cert-dir", str(work / "certs"),
            "--token-auth-file", str(work / "tokens.csv"),
            "--authorization-mode", "RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(key),
            "--service-account-signing-key-file", str(key),
            "--service-cluster-ip-range", "10.96.0.0/16",
        ]
    )  # fmt: skip
    url = f"https://{HOST}:{api_port}"
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
        f"clusters:\n- name: test\n  cluster:\n    server: {url}\n"
        "    insecure-skip-tls-verify: true\n"
        f"users:\n- name: admin\n  user:\n    token: {token}\n"
        "contexts:\n- name: test\n  context:\n    cluster: test\n    user: admin\n"
    )
    try:
        try:
            wait_until(
                lambda: _healthy(url, token), 90, "kube-apiserver /readyz", transient=STARTING
            )
        except TimeoutError:
            log = apiserver.log_file.read_text()[-3000:]
            pytest.fail(f"kube-apiserver did not become ready; its log ends with:\n{log}")
        yield Cluster(url, token, kubeconfig)
    finally:
        apiserver.stop()
        etcd.stop()
