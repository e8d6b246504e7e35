"""What read-only users (reader, superset, api) may run, decided from ClickHouse's parse tree.

The engine (clickhouse-local inside chdb) has no access control: its `file()` function, for
one, ignores `readonly`. So every statement of a read-only user is parsed by the engine
(`EXPLAIN AST`, which runs the parser only) and each function and table function named in
the tree must be on an allow-list (sql_policy/*.txt): a function a newer engine adds is
refused until someone adds it. The settings a client gives (URL parameters, `SET`) must be on
the settings allow-list too, or lower a limit of the user's profile; the profile itself is
applied to the engine connection, never pasted into the statement (engine.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from stack.clickhouse_server.errors import ACCESS_DENIED, UNKNOWN_SETTING, ClickHouseError

_LISTS = Path(__file__).with_name("sql_policy")
# Aggregate function combinators (system.aggregate_function_combinators), longest first so
# that `MergeState` is not read as `State`.
_COMBINATORS = (
    "SimpleState",
    "MergeState",
    "OrDefault",
    "Distinct",
    "Resample",
    "ForEach",
    "ArgMax",
    "ArgMin",
    "OrNull",
    "Merge",
    "State",
    "Array",
    "Null",
    "Map",
    "If",
)
# Names the parser writes into the tree for syntax, not as calls of registered functions.
_SYNTAX = frozenset({"lambda"})
# Parents under which a Function node is a table function.
_TABLE_POSITIONS = frozenset({"TableExpression", "InsertQuery"})
# Profile limits a client may lower (never raise, never to 0 = unlimited).
LOWERABLE = frozenset({"max_execution_time", "max_memory_usage", "max_rows_to_read", "max_threads"})


def _names(file: str) -> frozenset[str]:
    lines = (_LISTS / file).read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


@dataclass(frozen=True)
class AllowList:
    names: frozenset[str]
    lowered: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lowered", frozenset(n.lower() for n in self.names))

    def allows(self, name: str) -> bool:
        # Case-insensitive functions (`COUNT`, `Sum`) match their lower-case entry; no name
        # left out of a list is a case variant of one in it (tests/clickhouse/test_sql_policy).
        return name in self.names or name.lower() in self.lowered


@cache
def functions() -> AllowList:
    return AllowList(_names("functions.txt") | _SYNTAX)


@cache
def table_functions() -> AllowList:
    return AllowList(_names("table_functions.txt"))


@cache
def client_settings() -> frozenset[str]:
    return _names("settings.txt")


def _function_allowed(name: str) -> bool:
    allowed = functions()
    while True:
        if allowed.allows(name):
            return True
        base = next((name[: -len(c)] for c in _COMBINATORS if name.endswith(c)), "")
        if not base:
            return False
        name = base


@dataclass(frozen=True)
class Call:
    name: str
    table: bool
    """In a table position (FROM, JOIN, INSERT INTO FUNCTION): a table function."""


@dataclass(frozen=True)
class _Node:
    depth: int
    kind: str
    detail: str
    children: int


def _node(line: str) -> _Node:
    """A dump line `<indent><Kind> <detail> [(alias a)] [(children N)]`, read with string
    operations only: the detail holds the user's literals and aliases, and no regex with
    backtracking may run over them."""
    stripped = line.lstrip(" ")
    kind, _, detail = stripped.partition(" ")
    _, marker, tail = line.rpartition(" (children ")
    declared = tail[:-1] if marker and tail.endswith(")") else ""
    return _Node(
        len(line) - len(stripped), kind, detail, int(declared) if declared.isdigit() else 0
    )


def _lines(tree: str) -> list[str]:
    """The dump's lines, split on newlines only: the engine escapes a newline in a literal, but
    leaves the other characters Python's `splitlines` would split on (a vertical tab, a form
    feed, U+0085, U+2028...) in the user's literals as they are."""
    return tree.removesuffix("\n").split("\n") if tree else []


def calls(tree: str) -> list[Call]:
    """The functions and table functions named in an `EXPLAIN AST` dump.

    Each line is a node, indented one space per level under its parent."""
    found: list[Call] = []
    parents: list[str] = []
    for node in map(_node, _lines(tree)):
        if not node.kind:
            continue
        del parents[node.depth :]
        if node.kind == "Function":
            table = bool(parents) and parents[-1] in _TABLE_POSITIONS
            # the name ends at its alias or children count: a real function name has no " ("
            found.append(Call(node.detail.split(" (", 1)[0], table))
        parents.append(node.kind)
    return found


def check_dump(tree: str) -> None:
    """Refuse a parse tree dump that is not whole: one root with children, each node a line
    `<Type> ...` with as many lines one level deeper as it declares children. A dump in
    another output format than asked (a FORMAT clause left in the statement) fails here."""
    nodes = [_node(line) for line in _lines(tree)]
    open_nodes: list[list[int]] = []  # [depth, declared children, children seen] of the path
    for n, node in enumerate(nodes):
        if not node.kind[:1].isupper():
            raise _unreadable(tree)
        while open_nodes and open_nodes[-1][0] >= node.depth:
            _close(open_nodes.pop(), tree)
        if (n == 0) != (node.depth == 0) or (open_nodes and open_nodes[-1][0] != node.depth - 1):
            raise _unreadable(tree)
        if open_nodes:
            open_nodes[-1][2] += 1
        open_nodes.append([node.depth, node.children, 0])
    if not nodes or not nodes[0].children:
        raise _unreadable(tree)
    while open_nodes:
        _close(open_nodes.pop(), tree)


def _close(node: list[int], tree: str) -> None:
    if node[1] != node[2]:
        raise _unreadable(tree)


def _unreadable(tree: str) -> ClickHouseError:
    return ClickHouseError(
        ACCESS_DENIED,
        "The statement's parse tree could not be read, so it is refused for read-only users "
        f"(starts with {tree[:80]!r})",
    )


PRIVATE_TABLES = frozenset({"audit_log", "audit_queue", "audit_queue_mv"})
"""Tables of the admin user alone: the audit of who read whose job (migration 0023)."""


def check_private(tree: str) -> None:
    """Refuse a statement naming a private table: as a table, an identifier (`x IN t`,
    `loop(db, t)`) or a string literal (`loop('db', 't')`). The engine has no grants, so a
    read-only user's statement is refused from its parse tree (`merge()`, whose regex could
    reach them, is off the allow-list)."""
    for node in map(_node, _lines(tree)):
        detail = node.detail.split(" (", 1)[0]
        if node.kind in ("TableIdentifier", "Identifier"):
            name = detail.rsplit(".", 1)[-1]
        elif node.kind == "Literal":
            name = detail.strip("'")
        else:
            continue
        if name in PRIVATE_TABLES:
            raise ClickHouseError(
                ACCESS_DENIED, f"Table {name} is for the admin user only, not read-only users"
            )


def check_tree(tree: str) -> None:
    """Refuse a statement that calls a function or table function off the allow-lists, or
    names a private table."""
    check_private(tree)
    for call in calls(tree):
        if call.table and not table_functions().allows(call.name):
            raise ClickHouseError(
                ACCESS_DENIED,
                f"Table function {call.name}() is not allowed for read-only users: it reaches "
                "outside the database, or is not on the allow-list "
                "(stack/clickhouse_server/sql_policy/table_functions.txt)",
            )
        if not call.table and not _function_allowed(call.name):
            raise ClickHouseError(
                ACCESS_DENIED,
                f"Function {call.name}() is not allowed for read-only users: it reaches "
                "outside the database, or is not on the allow-list "
                "(stack/clickhouse_server/sql_policy/functions.txt)",
            )


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def check_settings(requested: Mapping[str, str], profile: Mapping[str, str]) -> None:
    """Refuse a client setting that is neither on the allow-list nor lowers a profile limit."""
    for name, value in requested.items():
        if name in client_settings():
            continue
        if name in LOWERABLE and name in profile:
            wanted, limit = _number(value), _number(profile[name])
            if wanted is not None and limit is not None and 0 < wanted <= limit:
                continue
            raise ClickHouseError(
                ACCESS_DENIED,
                f"Setting {name}={value} is refused: read-only users may only lower it "
                f"(at most {profile[name]}, not 0)",
            )
        raise ClickHouseError(
            UNKNOWN_SETTING if not re.fullmatch(r"\w+", name) else ACCESS_DENIED,
            f"Setting {name} is not allowed for read-only users: only output format and "
            "result size settings are (stack/clickhouse_server/sql_policy/settings.txt)",
        )
