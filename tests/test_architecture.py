"""The rooms of the repository and what each may import (docs/architecture.md), read from the
imports of every tracked Python file: the arrows run one way, down to the Kafka contract."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from clickhouse_connect.driver.client import Client

from stack.config import REPO_ROOT
from tests.conftest import tracked_files

MAY_IMPORT: dict[str, set[str]] = {
    "kafka": set(),  # the contract: at the bottom
    "producers": {"kafka"},
    "api": {"kafka"},
    "clickhouse": {"kafka"},  # the deployable schema: nothing of the embedded default
    "jobscope": set(),  # the client users install: nothing of the server
    "schedulers": set(),  # hooks copied onto scheduler hosts
    "superset": set(),  # runs in Superset's own venv
    "examples": set(),
    # the embedded default, on top (api: the registry's units in Superset's bundle)
    "stack": {"kafka", "clickhouse", "producers", "api"},
    "connectors": {"kafka", "clickhouse", "stack"},
}
"""Room -> the other rooms it may import (bench/ and tests/ may import any)."""
TOPIC_MAKERS = {"NewTopic", "TopicSpec"}
RUNS_SQL = {
    name
    for name in dir(Client)
    if name == "command" or name.startswith(("query", "raw_", "insert"))
}
"""The ClickHouse client's methods that run SQL (query, command, raw_stream, insert, ...)."""
SQL_RUNNERS = ("api/queries/", "api/infra/clickhouse.py")
"""Where api/ may run SQL: the queries layer, and the client itself."""


def imported(path: Path) -> Iterator[str]:
    """The absolute modules a file imports, wherever the import stands."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def room(path: Path, root: Path = REPO_ROOT) -> str:
    return path.relative_to(root).parts[0]


def arrows_against_the_rooms(files: list[Path], root: Path = REPO_ROOT) -> list[str]:
    wrong = []
    for path in files:
        here = room(path, root)
        if here not in MAY_IMPORT:
            continue
        for module in imported(path):
            there = module.split(".")[0]
            if there in MAY_IMPORT and there != here and there not in MAY_IMPORT[here]:
                wrong.append(f"{path.relative_to(root)} imports {module}")
    return sorted(set(wrong))


def test_every_import_follows_the_rooms() -> None:
    files = tracked_files("*.py")
    assert len(files) > 100, files
    wrong = arrows_against_the_rooms(files)
    assert not wrong, wrong


def test_a_wrong_arrow_is_found(tmp_path: Path) -> None:
    """The check itself can fail: the contract importing the producers is reported."""
    (tmp_path / "kafka").mkdir()
    bad = tmp_path / "kafka" / "codec.py"
    bad.write_text("def f():\n    from producers.runtime import run\n")
    assert arrows_against_the_rooms([bad], tmp_path) == [
        "kafka/codec.py imports producers.runtime",
        "kafka/codec.py imports producers.runtime.run",
    ]


def test_no_router_imports_another() -> None:
    """Shared readings helpers live in api/readings.py, shared dependencies in api/deps.py."""
    routes = REPO_ROOT / "api" / "routes"
    wrong = [
        f"{path.name} imports {module}"
        for path in routes.glob("*.py")
        for module in imported(path)
        if module.startswith("api.routes")
    ]
    assert not wrong, wrong


def test_topics_are_made_in_the_contract_only() -> None:
    """Only kafka/ declares topics (tests and the bench make their own scratch ones)."""
    wrong = []
    for path in tracked_files("*.py"):
        if room(path) in ("kafka", "tests", "bench"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                if name in TOPIC_MAKERS:
                    wrong.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {name}")
    assert not wrong, wrong


MESSAGE_SHAPES = {
    "jobs": {"job_id", "nodes", "state", "updated_at"},
    "on-demand": {"devices", "until"},
}
"""Keys that make a dict a jobs or on-demand message (kafka/jobs.py, kafka/ondemand.py)."""


def messages_built_by_hand(files: list[Path], root: Path = REPO_ROOT) -> list[str]:
    """Where a module outside kafka/ (tests and the bench aside) writes a dict, literal or
    `dict(...)`, holding a jobs or on-demand message's keys, rather than the contract's
    model. A tripwire: a message assembled key by key elsewhere escapes it."""
    wrong = []
    for path in files:
        if room(path, root) in ("kafka", "tests", "bench"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "dict":
                keys = {k.arg for k in node.keywords}
            else:
                continue
            wrong += [
                f"{path.relative_to(root)}:{node.lineno} {topic} message"
                for topic, shape in MESSAGE_SHAPES.items()
                if shape <= keys
            ]
    return sorted(wrong)


def test_messages_are_built_by_the_contract_only() -> None:
    wrong = messages_built_by_hand(tracked_files("*.py"))
    assert not wrong, wrong


def test_a_message_built_by_hand_is_found(tmp_path: Path) -> None:
    """The check itself can fail: the API's jobs message as it was built before kafka/jobs.py,
    and an on-demand one made with dict()."""
    (tmp_path / "api").mkdir()
    bad = tmp_path / "api" / "jobs.py"
    bad.write_text(
        'document = {"job_id": j, "nodes": [], "state": "running", "updated_at": t}\n'
        'activation = dict(id=k, devices=["n1"], until=None)\n'
    )
    assert messages_built_by_hand([bad], tmp_path) == [
        "api/jobs.py:1 jobs message",
        "api/jobs.py:2 on-demand message",
    ]


def sql_run_outside_queries(files: list[Path], root: Path = REPO_ROOT) -> list[str]:
    """Where a module of api/ outside SQL_RUNNERS names a method of the client that runs SQL
    (called, or handed on, as to a thread)."""
    wrong = []
    for path in files:
        name = path.relative_to(root).as_posix()
        if not name.startswith("api/") or name.startswith(SQL_RUNNERS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in RUNS_SQL:
                wrong.append(f"{name}:{node.lineno} .{node.attr}")
    return sorted(wrong)


def test_sql_runs_only_through_the_queries() -> None:
    assert {"query", "command", "raw_stream"} <= RUNS_SQL
    wrong = sql_run_outside_queries(tracked_files("api/*.py"))
    assert not wrong, wrong


def test_sql_run_by_a_router_is_found(tmp_path: Path) -> None:
    """The check itself can fail: a router running its SQL, or handing the stream to a thread."""
    (tmp_path / "api" / "routes").mkdir(parents=True)
    (tmp_path / "api" / "queries").mkdir()
    bad = tmp_path / "api" / "routes" / "devices.py"
    bad.write_text(
        "def f(client, sql):\n"
        "    client.query(sql).named_results()\n"
        "    return to_thread(client.raw_stream, sql)\n"
    )
    fine = tmp_path / "api" / "queries" / "devices.py"
    fine.write_text("def f(client, sql):\n    return client.command(sql)\n")
    assert sql_run_outside_queries([bad, fine], tmp_path) == [
        "api/routes/devices.py:2 .query",
        "api/routes/devices.py:3 .raw_stream",
    ]


def infra_imports_of_the_domain(files: list[Path], root: Path = REPO_ROOT) -> list[str]:
    """Imports of api/infra/ modules that reach into api/ outside api/infra/."""
    wrong = []
    for path in files:
        name = path.relative_to(root).as_posix()
        if not name.startswith("api/infra/"):
            continue
        for module in imported(path):
            if module.startswith("api.") and not module.startswith("api.infra"):
                wrong.append(f"{name} imports {module}")
    return sorted(set(wrong))


def test_the_api_infrastructure_knows_no_domain() -> None:
    """api/infra/ (settings, clients, auth, errors, limits, serving) imports nothing of
    routes, queries, live streams, jobs, readings, schemas or the read policy."""
    files = tracked_files("api/infra/*.py")
    assert len(files) > 10, files
    wrong = infra_imports_of_the_domain(files)
    assert not wrong, wrong


def test_an_infrastructure_import_of_the_domain_is_found(tmp_path: Path) -> None:
    (tmp_path / "api" / "infra").mkdir(parents=True)
    bad = tmp_path / "api" / "infra" / "probes.py"
    bad.write_text("from api.infra.config import ApiSettings\nfrom api import schemas\n")
    assert infra_imports_of_the_domain([bad], tmp_path) == [
        "api/infra/probes.py imports api.schemas"
    ]
