"""Helpers for the scheduler hook tests: the hooks run as real processes, as the scheduler runs
them, against the real API of the test stack; what they stored is read back with GET."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stack import secrets
from stack.config import StackSettings

HOOK_TIMEOUT = 30.0  # a hook taking longer than this is a failure in itself


@pytest.fixture(scope="session")
def tokens(api_url: str, stack_settings: StackSettings) -> dict[str, str]:
    """The test stack's secrets: JOBSCOPE_SCHEDULER_TOKEN, JOBSCOPE_ADMIN_TOKEN, ..."""
    return secrets.load_or_create(stack_settings.state_dir)


class ConfigWriter:
    """Writes a hook config file as a site does (syslog off: failures are tested on purpose)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, api_url: str, token: str, name: str = "hook.env", **extra: str) -> Path:
        lines = [
            "# jobscope hook config written by the test",
            f"JOBSCOPE_API_URL={api_url}",
            f'JOBSCOPE_TOKEN="{token}"',
            "JOBSCOPE_SYSLOG=no",
            *(f"{key}={value}" for key, value in extra.items()),
        ]
        path = self.directory / name
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
        return path


@pytest.fixture
def write_config(tmp_path: Path) -> ConfigWriter:
    """`write_config(api_url, token, name=..., **more_keys)` -> the config file's path."""
    return ConfigWriter(tmp_path)


@pytest.fixture
def hook_config(write_config: ConfigWriter, api_url: str, tokens: dict[str, str]) -> Path:
    """A config holding the API's URL and a token with the scheduler role."""
    return write_config(api_url, tokens["JOBSCOPE_SCHEDULER_TOKEN"])


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A URL where nothing listens: its port is bound (no one else takes it), never listened on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


class HookRunner:
    """Runs a hook as its scheduler does: the program itself, only the given environment."""

    def __call__(
        self, script: Path, env: dict[str, str], *args: str
    ) -> tuple[subprocess.CompletedProcess[str], float]:
        started = time.monotonic()
        done = subprocess.run(
            [str(script), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=HOOK_TIMEOUT,
            check=False,
        )
        return done, time.monotonic() - started


@pytest.fixture
def run_hook() -> HookRunner:
    """`run_hook(script, env, *args)` -> (completed process, seconds it took)."""
    return HookRunner()


class JobsReader:
    """Reads jobs back through the API, as any client does."""

    def __init__(self, api_url: str, token: str) -> None:
        self.api_url = api_url
        self.headers = {"Authorization": f"Bearer {token}"}

    def get(self, job_id: str) -> httpx.Response:
        return httpx.get(f"{self.api_url}/api/jobs/{job_id}", headers=self.headers, timeout=10)

    def wait(
        self,
        job_id: str,
        until: Callable[[dict[str, Any]], bool] = lambda job: True,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """GET the job until it exists and `until(job)` holds; fail with the last answer."""
        deadline = time.monotonic() + timeout
        while True:
            last = self.get(job_id)
            if last.status_code == 200 and until(last.json()):
                return last.json()
            if time.monotonic() > deadline:
                pytest.fail(
                    f"job {job_id} not as expected after {timeout:.0f} s: "
                    f"last answer {last.status_code} {last.text[:500]}"
                )
            time.sleep(0.2)


@pytest.fixture
def jobs(api_url: str, tokens: dict[str, str]) -> JobsReader:
    return JobsReader(api_url, tokens["JOBSCOPE_ADMIN_TOKEN"])
