"""What a request asks the engine to do, and the one statement actually executed for it.

The engine (clickhouse-local underneath) would run several `;`-separated statements and
knows no users, so every statement is first parsed by ClickHouse's own parser
(`formatQuerySingleLine`, which refuses multi-statements), classified by its first
keyword, checked against the user's rights, and rewritten into a canonical statement:
the read-write user's query settings go into a trailing `SETTINGS` clause, and insert data
is read from a spooled file. Read-only users' statements are also checked against
sql_policy.py; their settings are applied to their engine connection, never to the text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from stack.clickhouse_server.errors import (
    ACCESS_DENIED,
    NOT_IMPLEMENTED,
    READONLY,
    SYNTAX_ERROR,
    UNKNOWN_SETTING,
    ClickHouseError,
)

OUTPUT_KINDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN"})
STREAMING_KINDS = frozenset({"SELECT", "WITH"})
# Output formats whose chunks can be concatenated (row streams and Native blocks). Others
# (Arrow, Parquet, JSON with its header and totals, ...) are produced whole: chdb would emit
# one complete file or document per chunk.
STREAMABLE_FORMATS = frozenset(
    f.lower()
    for f in (
        "Native",
        "RowBinary",
        "TabSeparated",
        "TSV",
        "TabSeparatedRaw",
        "TSVRaw",
        "CSV",
        "JSONEachRow",
        "JSONLines",
        "NDJSON",
        "JSONCompactEachRow",
        "JSONStringsEachRow",
        "Values",
        "LineAsString",
        "Null",
    )
)
SESSION_KINDS = frozenset({"SET", "USE"})
DEFAULT_FORMAT = "TabSeparated"

_SETTING_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LEADING_NOISE = re.compile(rb"^(?:\s+|--[^\n]*(?:\n|$)|#[^\n]*(?:\n|$)|/\*.*?\*/)*", re.S)
_INSERT = re.compile(rb"INSERT\b", re.I)
_WITH = re.compile(rb"WITH\b", re.I)
_INSERT_WORD = re.compile(rb"\bINSERT\b", re.I)
_FORMAT_OR_VALUES = re.compile(rb"\b(?:FORMAT\s+([A-Za-z0-9_]+)|(VALUES)\b)", re.I)
# Tokens of a canonical statement: quoted literals and identifiers whole (no keyword is ever
# found inside one), words, whitespace, any other character. Each alternative starts
# differently and has no nested repetition: linear time.
_TOKEN = re.compile(
    r"'(?:[^'\\]|\\.|'')*'|`(?:[^`\\]|\\.|``)*`|\"(?:[^\"\\]|\\.|\"\")*\"|\s+|\w+|.",
    re.S,
)
_INSERT_PARTS = re.compile(r"^(INSERT INTO .+?)(?: SETTINGS (.+?))? FORMAT (\w+)$", re.S)
_SYNC_DROP = re.compile(r"^(?:DROP|DETACH)\b.*\bSYNC$", re.S)
_FILE_ACCESS = re.compile(r"\bINTO OUTFILE\b|\bFROM INFILE\b", re.I)
# Statements whose grammar takes no FORMAT or SETTINGS clause (access entities): the engine
# is given their format apart, and settings do not apply to them.
_NO_CLAUSES = re.compile(
    r"^SHOW (?:(?:ROW )?POLICIES|QUOTAS?|USERS|ROLES|(?:SETTINGS )?PROFILES|ACCESS|ENABLED ROLES"
    r"|CURRENT ROLES|CREATE (?:USER|ROLE|QUOTA|(?:ROW )?POLICY|(?:SETTINGS )?PROFILE))\b"
)
_CREATE_TEMPORARY = re.compile(
    r"^(?:/\*.*?\*/ )?CREATE TEMPORARY TABLE (?:IF NOT EXISTS )?(`(?:[^`\\]|\\.)*`|\w+)", re.S
)


@dataclass(frozen=True)
class InsertSplit:
    """An INSERT whose data follows the statement: `head` is the statement text."""

    head: str
    data_offset: int
    guessed: bool = False
    """Found after a `WITH`: it may be a query mentioning the word (see `split_insert`)."""


def split_insert(prefix: bytes) -> InsertSplit | None:
    """Find where the data of `INSERT ... FORMAT X <data>` (or `VALUES <data>`) begins.

    As in ClickHouse, the data starts after the first newline following the format name,
    or after the whitespace when there is no newline. A statement opening with `WITH` is
    taken for an insert if the word INSERT follows: only a guess (the word may be in a
    string), which the caller checks by parsing the head.
    """
    start = _LEADING_NOISE.match(prefix).end()  # type: ignore[union-attr]
    guessed = bool(_WITH.match(prefix, start))
    if guessed:  # `WITH ... INSERT ...`
        found = _INSERT_WORD.search(prefix, start)
        if found is None:
            return None
        start = found.start()
    elif not _INSERT.match(prefix, start):
        return None
    match = _FORMAT_OR_VALUES.search(prefix, start)
    if match is None:
        return None  # INSERT ... SELECT: no inline data
    pos = match.end()
    while pos < len(prefix) and prefix[pos : pos + 1] in (b" ", b"\t", b"\r"):
        pos += 1
    if prefix[pos : pos + 1] == b"\n":
        pos += 1
    head = prefix[: match.start()].decode("utf-8", "surrogateescape")
    head += f"FORMAT {match.group(1).decode()}" if match.group(1) else "FORMAT Values"
    return InsertSplit(head=head, data_offset=pos, guessed=guessed)


def escape_param(value: str) -> str:
    """A string in the escaped text form ClickHouse expects for query parameters."""
    return (
        value.replace("\\", "\\\\")
        .replace("\n", "\\n")
        .replace("\t", "\\t")
        .replace("\r", "\\r")
        .replace("\0", "\\0")
    )


def kind_of(canonical: str) -> str:
    return canonical.split(None, 1)[0].upper() if canonical.strip() else ""


def check_allowed(kind: str, canonical: str, readonly_user: bool, is_get: bool) -> None:
    """Refuse what this user (or an HTTP GET, which ClickHouse treats as read-only) may not run."""
    if _FILE_ACCESS.search(canonical):
        raise ClickHouseError(
            ACCESS_DENIED, "INTO OUTFILE and FROM INFILE are not allowed over HTTP"
        )
    if kind in OUTPUT_KINDS or kind in SESSION_KINDS:
        return
    if readonly_user:
        raise ClickHouseError(
            READONLY, f"Cannot execute query in readonly mode: {kind} is not a read"
        )
    if is_get:
        raise ClickHouseError(READONLY, "Cannot execute query in readonly mode: use POST to write")
    if _SYNC_DROP.match(canonical):
        raise ClickHouseError(
            NOT_IMPLEMENTED,
            "DROP/DETACH ... SYNC never returns in the embedded engine (chdb 4.1.7) and would "
            "hold an engine connection forever: run it without SYNC",
        )


def temporary_table(canonical: str) -> str | None:
    """The (quoted) name of the temporary table a canonical `CREATE TEMPORARY TABLE` makes."""
    match = _CREATE_TEMPORARY.match(canonical)
    return match.group(1) if match else None


def input_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """The settings that say how input data is read (for a request's external tables)."""
    return {
        name: value
        for name, value in settings.items()
        if name.startswith(("input_format_", "format_", "date_time_input_format"))
    }


def string_literal(value: str) -> str:
    """A ClickHouse string literal of `value`."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def settings_list(settings: Mapping[str, str]) -> str:
    """`name = 'value', ...`: names validated, values bound as string literals."""
    parts = []
    for name, value in settings.items():
        if not _SETTING_NAME.match(name):
            raise ClickHouseError(UNKNOWN_SETTING, f"Invalid setting name: {name!r}")
        parts.append(f"{name} = {string_literal(value)}")
    return ", ".join(parts)


@dataclass(frozen=True)
class TrailingFormat:
    """A statement's own `FORMAT x [SETTINGS ...]` clause, found outside any literal."""

    start: int
    """Where the clause (the whitespace before FORMAT) starts."""
    format: str
    settings: str | None
    """The text of its SETTINGS list, if it has one."""


def trailing_format(sql: str) -> TrailingFormat | None:
    """The trailing `FORMAT x [SETTINGS ...]` of a canonical statement, found by tokens, so a
    string literal that imitates one (`'... FORMAT TSV SETTINGS x'`) is never taken for it."""
    tokens = [(m.start(), m.group()) for m in _TOKEN.finditer(sql)]
    words = [(i, pos, text) for i, (pos, text) in enumerate(tokens) if not text.isspace()]
    found: TrailingFormat | None = None
    for n, (i, _pos, text) in enumerate(words):
        if text != "FORMAT" or n + 1 >= len(words) or not i or not tokens[i - 1][1].isspace():
            continue
        name = words[n + 1][2]
        rest = words[n + 2 :]
        if name.startswith("`"):  # the parser quotes a format that is a keyword: `Null`
            name = name[1:-1]
        if not re.fullmatch(r"\w+", name):
            continue
        if not rest:
            found = TrailingFormat(tokens[i - 1][0], name, None)
        elif rest[0][2] == "SETTINGS" and len(rest) > 1:
            found = TrailingFormat(tokens[i - 1][0], name, sql[rest[1][1] :])
    return found


def output_query(
    canonical: str, default_format: str, settings: Mapping[str, str]
) -> tuple[str, str]:
    """A query with output and the request's settings in its trailing clause; returns it and
    its output format (the query's own, else `default_format`, which the engine is given
    apart). A FORMAT is written only before settings (a query may have a SETTINGS clause of
    its own, and a second one must follow a FORMAT). Statements about access entities (SHOW
    POLICIES, SHOW USERS...) take no clause at all: they get neither."""
    sql = canonical.rstrip().rstrip(";")
    if _NO_CLAUSES.match(sql):
        return sql, default_format
    clause = trailing_format(sql)
    fmt = clause.format if clause else default_format
    if clause is None and settings:
        sql += f" FORMAT {default_format}"
    if settings:
        joiner = ", " if clause is not None and clause.settings else " SETTINGS "
        sql += joiner + settings_list(settings)
    return sql, fmt


def insert_from_file(canonical_head: str, path: str, settings: Mapping[str, str]) -> str:
    """`INSERT INTO t (cols) FROM INFILE '<spool>' SETTINGS ... FORMAT X` for a canonical head."""
    match = _INSERT_PARTS.match(canonical_head.strip())
    if match is None:
        raise ClickHouseError(SYNTAX_ERROR, f"Cannot find the data of INSERT: {canonical_head}")
    target, inline_settings, fmt = match.groups()
    clause = ", ".join(
        s for s in (inline_settings, settings_list(settings) if settings else "") if s
    )
    quoted = path.replace("\\", "\\\\").replace("'", "\\'")
    return (
        f"{target} FROM INFILE '{quoted}'"
        + (f" SETTINGS {clause}" if clause else "")
        + f" FORMAT {fmt}"
    )
