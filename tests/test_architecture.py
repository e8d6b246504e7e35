"""The rooms of the repository and what each may import (docs/architecture.md), read from the
imports of every tracked Python file: the arrows run one way, down to the Kafka contract."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

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
    "stack": {"kafka", "clickhouse", "producers"},  # the embedded default: on top
    "connectors": {"kafka", "clickhouse", "stack"},
}
"""Room -> the other rooms it may import (bench/ and tests/ may import any)."""
TOPIC_MAKERS = {"NewTopic", "TopicSpec"}


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
