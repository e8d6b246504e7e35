"""The manual's settings tables (docs/configuration.md), made from each component's typed
settings, so the manual cannot drift from the code: `python -m stack.settings_docs` writes
it, and tests/stack/test_settings_docs.py checks that it is current."""

from __future__ import annotations

import importlib
import sys
from enum import Enum
from pathlib import Path

from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from stack.config import REPO_ROOT

DOC = REPO_ROOT / "docs" / "configuration.md"
# (title, module, class): each component's settings, in the order a reader meets them.
COMPONENTS = (
    ("Local stack (`make up`, `make test`)", "stack.config", "StackSettings"),
    ("Kafka clients (producers, API, topics)", "kafka.security", "KafkaClientSettings"),
    ("Producers (`python -m producers`)", "producers.config", "ProducerSettings"),
    (
        "Local ClickHouse server (`python -m stack.clickhouse_server`)",
        "stack.clickhouse_server.config",
        "ServerSettings",
    ),
    ("Schema migrations", "clickhouse.migrate", "MigrationSettings"),
    ("REST API (`python -m api`)", "api.infra.config", "ApiSettings"),
    ("Superset (`make superset`)", "stack.superset", "SupersetSettings"),
    ("Kafka Connect (`make connect`)", "connectors.config", "ConnectSettings"),
    ("MirrorMaker (several sites)", "connectors.mirror", "MirrorSettings"),
)


def _variables(cls: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice).upper() for choice in alias.choices]
    if isinstance(alias, str):
        return [alias.upper()]
    return [(str(cls.model_config.get("env_prefix", "")) + (field.alias or name)).upper()]


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "computed"
    value = field.default
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Path):
        value = value.relative_to(REPO_ROOT) if value.is_relative_to(REPO_ROOT) else value
    return f"`{value}`" if value != "" else "empty"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def component_table(cls: type[BaseSettings], inherited: set[str]) -> str:
    """A component's settings (those it does not inherit from another listed class)."""
    rows = ["| variable | default | what |", "|---|---|---|"]
    for name, field in cls.model_fields.items():
        if name in inherited or field.exclude:
            continue
        variables = ", ".join(f"`{v}`" for v in _variables(cls, name, field))
        rows.append(f"| {variables} | {_default(field)} | {_cell(field.description or '')} |")
    return "\n".join(rows)


def render() -> str:
    parts = [
        "# Configuration",
        "",
        "Every setting of every component, from its typed settings class (made by",
        "`python -m stack.settings_docs`; do not edit by hand). Each is read from the",
        "environment; `make up` passes each process its own.",
    ]
    listed: list[type[BaseSettings]] = []
    for title, module, name in COMPONENTS:
        cls = getattr(importlib.import_module(module), name)
        inherited = {
            field for base in listed if issubclass(cls, base) for field in base.model_fields
        }
        listed.append(cls)
        parts += ["", f"## {title}", "", f"`{module}.{name}`", "", component_table(cls, inherited)]
    return "\n".join(parts) + "\n"


def main() -> int:
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(render())
    print(f"wrote {DOC.relative_to(REPO_ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
