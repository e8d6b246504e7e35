"""Where the chart tests find their tools: the versioned cache helm/install-tools.sh fills."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from stack.config import REPO_ROOT

CHART = REPO_ROOT / "helm" / "jobscope"
IMAGES = REPO_ROOT / "helm" / "images"
HELM_VENV = REPO_ROOT / ".venv-helm"
HELM_HOME = REPO_ROOT / "state" / "helm-test"
"""helm's cache, config and data folders in the tests (never the user's)."""
KUBE_SCHEMA_VERSION = "1.36.0"
"""Kubernetes version whose JSON schemas validate the rendered manifests (kube-apiserver's)."""


def _versions() -> dict[str, str]:
    lines = (REPO_ROOT / "helm" / "tools" / "versions.env").read_text().splitlines()
    pairs = (line.split("=", 1) for line in lines if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def _cached(name: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    path = Path(os.environ.get("JOBSCOPE_TOOLS_BIN", cache / "jobscope" / "bin")) / name
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"{path} is missing: run `bash helm/install-tools.sh`")
    return path


def tool(name: str) -> Path:
    """helm, etcd or kube-apiserver of the pinned version; FileNotFoundError if not built."""
    versions = _versions()
    version = {"helm": "HELM_VERSION", "etcd": "ETCD_VERSION", "kube-apiserver": "KUBE_VERSION"}
    return _cached(f"{name}-{versions[version[name]]}")


def venv_tool(name: str) -> Path:
    """kubernetes-validate or hadolint from .venv-helm."""
    path = HELM_VENV / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `bash helm/install-tools.sh`")
    return path


@dataclass(frozen=True)
class Cluster:
    url: str
    token: str
    kubeconfig: Path

    def client(self) -> httpx.Client:
        """REST client of the API server (its certificate is self-signed: not verified)."""
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.Client(base_url=self.url, headers=headers, verify=False, timeout=10)


def helm_env(cluster: Cluster | None) -> dict[str, str]:
    """helm's environment: its own folders under state/, and `cluster`'s kubeconfig if given."""
    homes = {f"HELM_{k.upper()}_HOME": str(HELM_HOME / k) for k in ("cache", "config", "data")}
    env = {**os.environ, **homes}
    if cluster is not None:
        env["KUBECONFIG"] = str(cluster.kubeconfig)
    return env


def run_helm(cluster: Cluster | None, *args: str, check: bool = True) -> str:
    """`helm ARGS` (against `cluster` if given); its output, or a failure with its stderr."""
    done = subprocess.run(
        [str(tool("helm")), *args], capture_output=True, text=True, env=helm_env(cluster)
    )
    if check and done.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout + done.stderr
