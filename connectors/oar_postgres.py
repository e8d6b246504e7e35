"""A local PostgreSQL 15 (Debian's package) holding OAR's tables, with logical replication
on: the scheduler database of the demo (`make connect`) and of the tests. A site points the
connector at its own OAR database instead (JOBSCOPE_CONNECT_OAR_DB_*).

Its superuser `postgres` has a password (JOBSCOPE_DEMO_OAR_DB_PASSWORD of state/secrets.env,
SCRAM, on the TCP port and the socket alike): no local account gets in without it. Its files
are private: in the state directory, or, when root runs it as the postgres user (who cannot
enter the private state directory), in a folder made by mkdtemp (a name nobody can guess or
hold in advance, mode 700) whose path the state directory keeps.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from stack import secrets
from stack.processes import ManagedProcess, is_alive, wait_until

PG_BIN = Path("/usr/lib/postgresql/15/bin")
SCHEMA = Path(__file__).resolve().parent / "oar" / "schema.sql"
DATABASE = "oar"


def _as_postgres(*argv: str) -> list[str]:
    """initdb and the server refuse to run as root: run them as the postgres user."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)


@dataclass(frozen=True)
class OarDatabase:
    """The server of `state_dir/<name>` on 127.0.0.1:`port`, user postgres, `password`."""

    state_dir: Path
    port: int
    password: str = field(repr=False)
    name: str = "oar-postgres"

    @property
    def home(self) -> Path:
        """Where the server's files are (see the module's docstring); made on first use."""
        own = secrets.private_dir(self.state_dir / self.name)
        if os.geteuid() != 0:
            return own
        pointer = own / "home"
        if pointer.exists() and _private_to_postgres(home := Path(pointer.read_text().strip())):
            return home
        home = Path(tempfile.mkdtemp(prefix="jobscope-oar-postgres-"))  # root's, mode 700
        (home / "run").mkdir(mode=0o700)
        for path in (home / "run", home):
            shutil.chown(path, "postgres", "postgres")
        secrets.write_private(pointer, f"{home}\n")
        return home

    @property
    def pgdata(self) -> Path:
        return self.home / "data"

    def _init(self) -> None:
        if (self.pgdata / "PG_VERSION").exists():
            return
        if not (PG_BIN / "postgres").exists():
            raise RuntimeError("postgresql-15 is not installed: run `make system-deps`")
        home = self.home
        (home / "run").mkdir(mode=0o700, exist_ok=True)
        password_file = home / "initdb-password"
        secrets.write_private(password_file, self.password + "\n")
        if os.geteuid() == 0:
            shutil.chown(password_file, "postgres", "postgres")
        try:
            subprocess.run(
                _as_postgres(
                    str(PG_BIN / "initdb"),
                    *("-D", str(self.pgdata), "-U", "postgres", "-E", "UTF8"),
                    *("-A", "scram-sha-256", f"--pwfile={password_file}"),
                    *("--locale=C", "--no-sync"),
                ),
                check=True,
                stdout=subprocess.DEVNULL,
                timeout=120,
            )
        finally:
            password_file.unlink(missing_ok=True)

    def process(self) -> ManagedProcess:
        return ManagedProcess(self.name, self.state_dir / "pids", self.state_dir / "logs")

    def _postmaster(self) -> int | None:
        """The PID in the server's lock file, if there is one."""
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None

    def _drop_stale_locks(self) -> None:
        """Remove the lock files (data directory's and socket's) of a crashed server whose
        postmaster is gone or a zombie not yet reaped: PostgreSQL takes a zombie for a running
        postmaster and would not start."""
        pid = self._postmaster()
        if pid is not None and not is_alive(pid):
            for lock in (
                self.pgdata / "postmaster.pid",
                *(self.home / "run").glob(".s.PGSQL.*.lock"),
            ):
                lock.unlink(missing_ok=True)

    def start(self) -> None:
        """Initialise once, start, and create the OAR database and tables if missing."""
        self._init()
        if not self.process().is_running():
            self._drop_stale_locks()
        self.process().start(
            _as_postgres(
                str(PG_BIN / "postgres"),
                *("-D", str(self.pgdata), "-c", f"port={self.port}"),
                *("-c", "listen_addresses=127.0.0.1"),
                *("-c", f"unix_socket_directories={self.home / 'run'}"),
                *("-c", "wal_level=logical", "-c", "max_replication_slots=4"),
                *("-c", "max_wal_senders=4"),
            ),
            ports=[("127.0.0.1", self.port)],
        )
        proc = self.process()
        proc.wait_ready(
            self._accepts,
            60,
            f"PostgreSQL on 127.0.0.1:{self.port}",
            transient=(psycopg.OperationalError,),  # refused, or "the database system is starting"
        )
        with self.connect("postgres") as conn:
            query = "SELECT 1 FROM pg_database WHERE datname = %s"
            if conn.execute(query, (DATABASE,)).fetchone() is None:
                conn.execute(f"CREATE DATABASE {DATABASE}")
        with self.connect() as conn:
            conn.execute(SCHEMA.read_text())

    def _accepts(self) -> bool:
        with self.connect("postgres"):
            return True

    def stop(self) -> None:
        """A fast shutdown (SIGINT: sessions end, a checkpoint is written)."""
        self.process().stop(timeout=60, sig=signal.SIGINT)

    def kill(self) -> None:
        """kill -9 of every server process, as a crash would: the next start recovers from
        the write-ahead log. Returns once the postmaster itself is gone (it is not the
        process started, which runs it as the postgres user)."""
        postmaster = self._postmaster()
        self.process().kill()
        if postmaster is not None:
            wait_until(lambda: not is_alive(postmaster), 30, "the killed postmaster to exit")

    def connect(self, dbname: str = DATABASE) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            password=self.password,
            dbname=dbname,
            autocommit=True,
        )


def _private_to_postgres(home: Path) -> bool:
    """Whether `home` is a folder (not a link) of the postgres user's, closed to others."""
    try:
        st = home.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == pwd.getpwnam("postgres").pw_uid
        and not st.st_mode & 0o077
    )
