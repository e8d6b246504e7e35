"""`jobscope login` where the API names no identity provider (JOBSCOPE_OIDC_ISSUER unset,
the test stack's default): the route says so and the command fails with that line.
The login through a real provider: tests/identity/test_login.py."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from api.routes.auth import ONLY_OWN_TOKENS
from tests.client.test_cli import run


def test_the_api_names_no_provider(api_url: str) -> None:
    response = httpx.get(f"{api_url}/api/auth/oidc", timeout=10)
    assert response.status_code == 404
    assert response.json()["error"] == ONLY_OWN_TOKENS


def test_login_says_the_api_takes_only_its_own_tokens(api_url: str, tmp_path: Path) -> None:
    done = run(api_url, "login", XDG_CONFIG_HOME=str(tmp_path))
    assert done.returncode == 1
    assert ONLY_OWN_TOKENS in done.stderr.decode()
    assert done.stderr.decode().count("\n") == 1
    assert not os.listdir(tmp_path)


def test_logout_without_a_login(api_url: str, tmp_path: Path) -> None:
    done = run(api_url, "logout", XDG_CONFIG_HOME=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stderr.decode() == f"not logged in to {api_url}\n"
