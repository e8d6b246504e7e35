"""Read-only users (reader, superset, api) cannot reach outside the database through the local
server: no function or table function off the allow-lists (decided from the engine's parse
tree), no setting off the settings allow-list, and their profile is on their engine
connection, where no statement text can lift it (stack/clickhouse_server/sql_policy.py)."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from clickhouse_connect.driver.client import Client

from stack import secrets
from stack.clickhouse_server import sql_policy
from stack.clickhouse_server.http_handler import TRANSPORT_PARAMS
from stack.config import StackSettings

READ_ONLY_USERS = ("reader", "superset", "api")
_PASSWORDS = {
    "reader": "JOBSCOPE_CLICKHOUSE_READER_PASSWORD",
    "superset": "JOBSCOPE_CLICKHOUSE_SUPERSET_PASSWORD",
    "api": "JOBSCOPE_CLICKHOUSE_API_PASSWORD",
}


class Listener:
    """A TCP listener on loopback that counts the connections anything makes to it: a URL
    the engine must never fetch."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._sock.close()


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A file the engine's account could read (world-readable), holding a random secret."""
    secret = f"canary-{uuid.uuid4().hex}"
    folder = tmp_path_factory.mktemp("canary")
    folder.chmod(0o755)
    path = folder / "secret.txt"
    path.write_text(secret + "\n")
    path.chmod(0o644)
    yield path, secret


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    found = Listener()
    yield found
    found.close()


def _client(settings: StackSettings, user: str) -> httpx.Client:
    password = secrets.load_or_create(settings.state_dir)[_PASSWORDS[user]]
    return httpx.Client(base_url=settings.clickhouse_url, auth=(user, password), timeout=60)


@pytest.fixture(scope="module")
def users(clickhouse: StackSettings) -> Iterator[dict[str, httpx.Client]]:
    clients = {user: _client(clickhouse, user) for user in READ_ONLY_USERS}
    yield clients
    for client in clients.values():
        client.close()


def _code(answer: httpx.Response) -> int:
    return int(answer.headers.get("X-ClickHouse-Exception-Code", "0"))


def _outside(path: Path, port: int) -> list[str]:
    url = f"http://127.0.0.1:{port}/x"
    return [
        f"SELECT file('{path}')",
        f"SELECT FILE('{path}')",
        f"SELECT * FROM file('{path}', 'LineAsString')",
        f"DESCRIBE file('{path}', 'LineAsString')",
        f"DESCRIBE TABLE (SELECT file('{path}'))",
        f"EXPLAIN SYNTAX SELECT file('{path}')",
        f"EXPLAIN PLAN SELECT * FROM file('{path}', 'LineAsString')",
        f"SELECT * FROM view(SELECT file('{path}'))",
        f"SELECT x FROM (SELECT file('{path}') AS x) WHERE x IN (SELECT file('{path}'))",
        f"WITH file('{path}') AS f SELECT f",
        f"SELECT * FROM url('{url}', 'LineAsString')",
        f"SELECT * FROM remote('127.0.0.1:{port}', system.one)",
        f"SELECT * FROM s3('{url}', 'LineAsString')",
        f"SELECT * FROM postgresql('127.0.0.1:{port}', 'db', 't', 'u', 'p')",
        f"SELECT * FROM mysql('127.0.0.1:{port}', 'db', 't', 'u', 'p')",
        "SELECT * FROM executable('cat /etc/passwd', 'LineAsString', 'x String')",
        "SELECT * FROM input('x String')",
        "SELECT * FROM python(x)",
        "SELECT * FROM dictionary('d')",
        "SELECT dictGet('d', 'x', 1)",
        f"SELECT hasColumnInTable('127.0.0.1:{port}', 'u', 'p', 'db', 't', 'c')",
        "SELECT getServerSetting('path')",
        # A literal that imitates a trailing clause, which once steered the forced settings.
        f"SELECT file('{path}') ORDER BY ' FORMAT TSV SETTINGS x'",
    ]


@pytest.mark.parametrize("user", READ_ONLY_USERS)
def test_read_only_users_cannot_reach_outside_the_database(
    users: dict[str, httpx.Client], user: str, canary: tuple[Path, str], listener: Listener
) -> None:
    """Each function and table function that reads a file or reaches a URL, another server,
    an executable, a dictionary or the request is refused (497) before the engine runs it."""
    path, secret = canary
    for statement in _outside(path, listener.port):
        answer = users[user].post("/", content=statement)
        assert _code(answer) == 497, f"{user}: {statement}: {answer.status_code} {answer.text}"
        assert secret not in answer.text
    assert listener.connections == 0


@pytest.mark.parametrize("user", READ_ONLY_USERS)
def test_settings_cannot_be_lifted(users: dict[str, httpx.Client], user: str) -> None:
    """A setting off the allow-list is refused, naming it, whether given in the URL or by SET
    in a session; in the statement the engine refuses it (readonly=1 on the connection); a
    literal imitating a trailing `FORMAT ... SETTINGS` clause changes nothing."""
    client = users[user]
    url = client.post(
        "/",
        params={"allow_introspection_functions": "1"},
        content="SELECT getSetting('allow_introspection_functions')",
    )
    assert _code(url) == 497 and "allow_introspection_functions" in url.text, url.text
    session = {"session_id": f"s-{uuid.uuid4().hex}"}
    refused = client.post(
        "/", params=session, content="SET function_sleep_max_microseconds_per_block = 0"
    )
    assert _code(refused) == 497 and "function_sleep_max" in refused.text, refused.text
    inline = client.post("/", content="SELECT 1 SETTINGS max_threads = 64")
    assert _code(inline) == 164, inline.text
    steered = client.post(
        "/",
        params={"output_format_json_quote_64bit_integers": "0"},
        content="SELECT getSetting('readonly') AS r ORDER BY ' FORMAT TSV SETTINGS x' FORMAT TSV",
    )
    assert steered.status_code == 200 and steered.text == "1\n", steered.text
    allowed = client.post(
        "/",
        params={"max_result_rows": "1", "result_overflow_mode": "break"},
        content="SELECT number FROM numbers(10) FORMAT TSV",
    )
    assert allowed.status_code == 200, allowed.text


def test_a_literal_shaped_like_the_parse_tree_is_checked_in_linear_time(
    users: dict[str, httpx.Client],
) -> None:
    """The parse tree dump holds the user's literals: one repeating the dump's own markers
    (` (alias x)`, ` (children 1)`) is read in linear time (a backtracking regex took 29 s on
    200 KB), and a statement hiding file() behind it is still refused."""
    bait = " (alias x) (children 1)" * 10_000  # 230 KB, under the engine's max_query_size
    started = time.monotonic()
    answer = users["reader"].post("/", content=f"SELECT length('{bait}')")
    assert answer.status_code == 200 and answer.text == f"{len(bait)}\n", answer.text[:200]
    refused = users["reader"].post("/", content=f"SELECT '{bait}' AS b, file('/etc/hostname')")
    assert _code(refused) == 497, refused.text[:200]
    assert time.monotonic() - started < 3  # the old regex: about 7 s a statement


@pytest.mark.parametrize(
    "separator", ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r"]
)
def test_a_literal_holding_a_line_separator_is_answered_and_still_checked(
    users: dict[str, httpx.Client], separator: str
) -> None:
    """The engine writes a literal's vertical tab, form feed or Unicode line separator into the
    dump as it is: read as a line break (Python's `splitlines`), it made the dump unreadable
    and a read-only user's plain SELECT was refused (found by the API's fuzzing: a job
    list filtered by a project name holding U+000B was a 500). The same characters can
    neither hide a function nor fake one."""
    text = f"a{separator}Function file (children 1)"
    answer = users["reader"].post("/", content=f"SELECT length('{text}')")
    assert answer.status_code == 200, answer.text[:300]
    assert answer.text == f"{len(text.encode())}\n"
    refused = users["reader"].post("/", content=f"SELECT '{text}', file('/etc/hostname')")
    assert _code(refused) == 497, refused.text[:200]


def test_the_api_user_has_a_profile(users: dict[str, httpx.Client]) -> None:
    answer = users["api"].post(
        "/", content="SELECT getSetting('max_execution_time'), getSetting('readonly')"
    )
    assert answer.text == "120\t1\n", answer.text


def test_the_allow_lists_name_what_the_engine_has(admin_client: Client) -> None:
    """Every allowed name exists in the pinned engine, and no name left out is a case
    variant of an allowed one (allowed names also match case-insensitively)."""
    engine_functions = {
        r[0] for r in admin_client.query("SELECT name FROM system.functions").result_rows
    }
    engine_tables = {
        r[0] for r in admin_client.query("SELECT name FROM system.table_functions").result_rows
    }
    engine_settings = {
        r[0] for r in admin_client.query("SELECT name FROM system.settings").result_rows
    }
    assert sql_policy.functions().names - {"lambda"} <= engine_functions
    assert sql_policy.table_functions().names <= engine_tables
    assert sql_policy.client_settings() <= engine_settings
    for allowed, engine in (
        (sql_policy.functions(), engine_functions),
        (sql_policy.table_functions(), engine_tables),
    ):
        left_out = engine - allowed.names
        assert not {n for n in left_out if n.lower() in allowed.lowered}


def test_fuzz_every_engine_name_in_every_position(
    clickhouse: StackSettings,
    admin_client: Client,
    canary: tuple[Path, str],
    listener: Listener,
) -> None:
    """Every function and table function of the engine, called with a file path and with a
    URL in each position a name can take, and every setting of the engine given in the URL:
    as `reader`, none reads the canary file or connects to the listener, and each name off
    the allow-lists is refused with 497."""
    path, secret = canary
    url = f"http://127.0.0.1:{listener.port}/x"
    functions = [r[0] for r in admin_client.query("SELECT name FROM system.functions").result_rows]
    tables = [
        r[0] for r in admin_client.query("SELECT name FROM system.table_functions").result_rows
    ]
    names = sorted(set(functions) | set(tables))
    cases: list[tuple[str, dict[str, str], str]] = []
    for name in names:
        for arg in (f"'{path}'", f"'{url}'"):
            cases.append((name, {}, f"SELECT `{name}`({arg})"))
            cases.append((name, {}, f"SELECT * FROM `{name}`({arg}, 'LineAsString')"))
            cases.append((name, {}, f"DESCRIBE `{name}`({arg}, 'LineAsString', 'x String')"))
    settings = [r[0] for r in admin_client.query("SELECT name FROM system.settings").result_rows]
    for setting in settings:
        cases.append((setting, {setting: str(path)}, "SELECT 1"))
        cases.append((setting, {setting: url}, "SELECT 1"))
    reader = _client(clickhouse, "reader")

    def run(case: tuple[str, dict[str, str], str]) -> tuple[str, str, int, str]:
        name, params, statement = case
        answer = reader.post("/", params=params, content=statement)
        return name, statement, _code(answer), answer.text

    with reader, ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, cases))
    leaks = [(s, text) for _, s, _, text in results if secret in text]
    assert not leaks, leaks[:5]
    assert listener.connections == 0
    refused_names = {name for name, _, code, _ in results if code == 497}
    allowed_somewhere = (
        sql_policy.functions().names
        | sql_policy.table_functions().names
        | sql_policy.client_settings()
        | sql_policy.LOWERABLE
    )
    # `readonly` in the URL is dropped: the connection has readonly=1 whatever it says; the
    # HTTP exchange's own parameters (compression, progress headers) are not query settings.
    off_list = (set(names) | set(settings)) - allowed_somewhere - {"readonly"} - TRANSPORT_PARAMS
    assert off_list - refused_names == set()
    # A floor per kind: an engine list that came back empty would leave nothing to refuse.
    per_kind = {"function": functions, "table function": tables, "setting": settings}
    refused_per_kind = {kind: len(refused_names & set(n)) for kind, n in per_kind.items()}
    assert all(refused_per_kind.values()), refused_per_kind
