"""Connectors through the Connect REST API: load a connector file, validate, register
idempotently, read its status. Every request sends the worker's credentials (Worker.auth)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from connectors.worker import Worker
from stack.processes import wait_until
from stack.transient import STARTING

PLACEHOLDER = re.compile(r"\$\{([A-Z0-9_]+)\}")


def load(path: Path, values: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """A connector file (`{"name": ..., "config": {...}}`) as (name, config), every `${VAR}`
    replaced by `values[VAR]`; a placeholder without a value is an error."""
    document = json.loads(path.read_text())

    def fill(match: re.Match[str]) -> str:
        if match[1] not in values:
            raise KeyError(f"{path.name}: no value for ${{{match[1]}}}")
        return values[match[1]]

    config = {key: PLACEHOLDER.sub(fill, str(value)) for key, value in document["config"].items()}
    return document["name"], config


def validate(worker: Worker, name: str, config: Mapping[str, str]) -> list[str]:
    """Connect's own validation of connector `name`'s `config`: the error messages, empty
    when valid."""
    plugin = config["connector.class"].rsplit(".", 1)[-1]
    response = httpx.put(
        f"{worker.url}/connector-plugins/{plugin}/config/validate",
        json={**config, "name": name},
        auth=worker.auth,
        timeout=60,
    )
    response.raise_for_status()
    return [
        f"{item['value']['name']}: {error}"
        for item in response.json()["configs"]
        for error in item["value"]["errors"]
    ]


def register(worker: Worker, name: str, config: Mapping[str, str]) -> bool:
    """Create or update connector `name`; True if this changed it. The same configuration
    twice changes nothing (no new configuration record, no task restart)."""
    url, auth = f"{worker.url}/connectors/{name}/config", worker.auth
    current = httpx.get(url, auth=auth, timeout=30)
    if current.status_code == 200 and current.json() == {**config, "name": name}:
        return False
    if current.status_code not in (200, 404):
        current.raise_for_status()
    httpx.put(url, json=dict(config), auth=auth, timeout=60).raise_for_status()
    return True


def status(worker: Worker, name: str) -> dict[str, Any]:
    response = httpx.get(f"{worker.url}/connectors/{name}/status", auth=worker.auth, timeout=30)
    response.raise_for_status()
    return dict(response.json())


def is_running(worker: Worker, name: str) -> bool:
    """The connector and each of its tasks (at least one) are RUNNING."""
    current = status(worker, name)
    states = [current["connector"]["state"], *(task["state"] for task in current["tasks"])]
    return len(states) > 1 and all(state == "RUNNING" for state in states)


def wait_running(worker: Worker, name: str, timeout: float = 60.0) -> None:
    # A connector just created may answer 404 until the worker has assigned it (or 409 during a
    # rebalance): an HTTP error is retried as well as a refused connection.
    wait_until(
        lambda: is_running(worker, name),
        timeout,
        f"connector {name} to run",
        0.5,
        transient=(*STARTING, httpx.HTTPStatusError),
    )
