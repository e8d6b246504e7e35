"""`jobscope login` and `logout` through the real provider's device authorization grant: the
command runs as a subprocess, the user's browser step follows Keycloak's own pages
(tests/identity/browser.py); the stored token is private, used by the next commands (as
alice: her job, not bob's), refreshed once expired, sent to no other API, and revoked at
logout."""

from __future__ import annotations

import http.server
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from stack import oidc_provider as oidc_stack
from tests import ports
from tests.identity.browser import Browser
from tests.oidc_provider import Provider

JOBSCOPE = Path(sys.executable).with_name("jobscope")
ACCESS_LIFESPAN_S = 6
"""The CLI client's access tokens live this long during the refresh test (Keycloak's default
is 300 s): under the client's 30 s margin, and soon past."""


def jobscope(api_url: str, config: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """The command with `config` as XDG_CONFIG_HOME, no token or API from the environment."""
    base = {k: v for k, v in os.environ.items() if k not in ("JOBSCOPE_TOKEN", "JOBSCOPE_API")}
    return subprocess.run(
        [str(JOBSCOPE), "--api", api_url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, "COLUMNS": "250", "XDG_CONFIG_HOME": str(config), **env},
        check=False,
    )


def login(
    provider: Provider, config: Path, user: str, button: str = "accept"
) -> subprocess.CompletedProcess:
    """`jobscope login`, with `user` opening the printed address, logging in and pressing
    `button` on the consent page."""
    base = {k: v for k, v in os.environ.items() if k not in ("JOBSCOPE_TOKEN", "JOBSCOPE_API")}
    command = subprocess.Popen(
        [str(JOBSCOPE), "--api", provider.api_url, "login"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**base, "XDG_CONFIG_HOME": str(config)},
    )
    try:
        assert command.stderr is not None
        first = command.stderr.readline()
        found = re.fullmatch(r"To log in, open (\S+)\n", first)
        assert found, first + command.stderr.read()
        browser = Browser()
        try:
            page = browser.go("GET", found.group(1))
            page = browser.submit(page, username=user, password=provider.password)
            browser.submit(page, button)
        finally:
            browser.close()
        out, err = command.communicate(timeout=60)
    finally:
        command.kill()
        command.wait()
    return subprocess.CompletedProcess(command.args, command.returncode, out, first + err)


def stored(config: Path) -> dict[str, Any]:
    return json.loads((config / "jobscope" / "credentials.json").read_text())["logins"]


@pytest.fixture
def short_tokens(oidc_provider: Provider) -> Iterator[None]:
    """The CLI client's access tokens made short-lived at the provider, for one test."""
    admin, realm = oidc_provider.admin, oidc_provider.settings.realm
    (client,) = admin.request("GET", f"/{realm}/clients?clientId={oidc_stack.CLI_CLIENT}").json()
    attributes = client["attributes"]
    # Keycloak keeps an attribute a PUT leaves out: an empty one is the realm's lifespan again
    before = {**attributes, "access.token.lifespan": attributes.get("access.token.lifespan", "")}
    short = {**attributes, "access.token.lifespan": str(ACCESS_LIFESPAN_S)}
    admin.request("PUT", f"/{realm}/clients/{client['id']}", json={**client, "attributes": short})
    try:
        yield
    finally:
        admin.request(
            "PUT", f"/{realm}/clients/{client['id']}", json={**client, "attributes": before}
        )


def test_login_use_refresh_logout(
    oidc_provider: Provider, oidc_jobs: dict[str, str], short_tokens: None, tmp_path: Path
) -> None:
    api = oidc_provider.api_url
    done = login(oidc_provider, tmp_path, "alice")
    assert done.returncode == 0, done.stderr
    assert f"logged in to {api} as alice" in done.stderr
    folder, path = tmp_path / "jobscope", tmp_path / "jobscope" / "credentials.json"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = stored(tmp_path)[api]
    assert first["issuer"] == oidc_provider.settings.issuer

    # the next command reads as alice: her job, not bob's
    listed = jobscope(api, tmp_path, "jobs", "--user", "alice", "--limit", "500")
    assert listed.returncode == 0, listed.stderr
    assert oidc_jobs["alice"] in listed.stdout
    assert oidc_jobs["bob"] not in jobscope(api, tmp_path, "jobs", "--limit", "500").stdout
    # an explicit token prevails over the stored one
    refused = jobscope(api, tmp_path, "jobs", JOBSCOPE_TOKEN="not-a-token")
    assert refused.returncode == 1 and "401" in refused.stderr

    # once the stored access token has expired (and the API refuses it), it is refreshed
    current = stored(tmp_path)[api]
    time.sleep(max(0.0, current["expires_at"] - time.time()) + 1.5)  # its fixed lifespan
    headers = {"Authorization": f"Bearer {current['access_token']}"}
    expired = httpx.get(f"{api}/api/jobs/{oidc_jobs['alice']}", headers=headers, timeout=30)
    assert expired.status_code == 401, expired.text
    again = jobscope(api, tmp_path, "jobs", "--user", "alice", "--limit", "500")
    assert again.returncode == 0, again.stderr
    assert oidc_jobs["alice"] in again.stdout
    refreshed = stored(tmp_path)[api]
    assert refreshed["access_token"] != current["access_token"]
    assert refreshed["expires_at"] > current["expires_at"]  # a new lifespan (it may be short)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    done = jobscope(api, tmp_path, "logout")
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"logged out of {api}\n"
    assert api not in stored(tmp_path)
    after = jobscope(api, tmp_path, "jobs")
    assert after.returncode == 1 and "401" in after.stderr, after.stderr
    # the provider revoked the login: a copy of the file taken before is of no use
    form = {
        "grant_type": "refresh_token",
        "refresh_token": refreshed["refresh_token"],
        "client_id": oidc_stack.CLI_CLIENT,
    }
    answer = httpx.post(oidc_provider.token_endpoint, data=form, timeout=30)
    assert (answer.status_code, answer.json().get("error")) == (400, "invalid_grant")


def test_a_denied_login_stores_nothing(oidc_provider: Provider, tmp_path: Path) -> None:
    done = login(oidc_provider, tmp_path, "alice", button="cancel")
    assert done.returncode == 1
    assert done.stderr.endswith("jobscope: the login was denied at the provider\n")
    assert not (tmp_path / "jobscope" / "credentials.json").exists()


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"[]")

    def log_message(self, *_args: object) -> None:
        pass


def test_the_token_goes_to_its_api_only(oidc_provider: Provider, tmp_path: Path) -> None:
    """A login stored for the site's API is not sent to another address the user (or a
    script, or a typo) names: that server would hold the user's token."""
    done = login(oidc_provider, tmp_path, "alice")
    assert done.returncode == 0, done.stderr
    # a token the client sends as it is (no refresh due), as most are
    assert stored(tmp_path)[oidc_provider.api_url]["expires_at"] > time.time() + 60
    server = http.server.HTTPServer(("127.0.0.1", ports.port("login-other-api")), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        other = f"http://127.0.0.1:{server.server_port}"
        listed = jobscope(other, tmp_path, "jobs")
        assert listed.returncode == 0, listed.stderr
    finally:
        server.shutdown()
        server.server_close()
    assert _Recorder.seen == [None]
    assert jobscope(oidc_provider.api_url, tmp_path, "logout").returncode == 0
