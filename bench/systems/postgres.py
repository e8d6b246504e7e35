"""PostgreSQL 15 (Debian package) with Kwollect's schema, loaded by parallel binary COPY workers.

The schema is Kwollect 1.3.1's own (bench/kwollect_schema.py, which says where it comes from
and what of TimescaleDB, not packaged by Debian, it reproduces in plain PostgreSQL).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psycopg

from bench import kwollect_schema, payloads
from bench.dataset import Dataset, utc
from bench.systems.base import Ingest, Selection, System, dpkg_version, run_parallel
from stack.processes import free_port, shared_dir

PG_BIN = Path("/usr/lib/postgresql/15/bin")
SETTINGS = {  # everything else is PostgreSQL's default
    "shared_buffers": "512MB",
    "max_wal_size": "4GB",  # no checkpoint storm in the middle of the bulk load
}
TIMEOUT = 600.0


class Postgres(System):
    name = "peer_postgres"
    label = "PostgreSQL 15"
    workers = 2
    query_layer = "COPY (SELECT ...) TO STDOUT (text) over one connection kept open"
    ingest_input = f"COPY ... FROM STDIN (FORMAT binary), {workers} parallel connections"

    def __init__(self, workdir: Path) -> None:
        super().__init__(shared_dir(workdir))  # the postgres user must reach it
        self.pgdata = self.workdir / "pgdata"
        self.socket_dir = self.workdir / "run"
        self.port = 0
        self.started = False
        self.tables: list[str] = []
        self.query_conn: psycopg.Connection | None = None

    def version(self) -> str:
        return dpkg_version("postgresql-15")

    def _as_postgres(self, *argv: str) -> list[str]:
        """initdb and the server refuse to run as root: run them as the postgres user."""
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)

    def start(self) -> None:
        if not (PG_BIN / "postgres").exists():
            raise RuntimeError("postgresql-15 is not installed: run bench/install-peers.sh")
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.socket_dir.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.workdir, "postgres", "postgres")
            shutil.chown(self.socket_dir, "postgres", "postgres")
        _run(
            self._as_postgres(
                str(PG_BIN / "initdb"),
                "-D",
                str(self.pgdata),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ),
            timeout=120,
        )
        self.port = free_port()
        options = " ".join(
            [
                f"-c port={self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.socket_dir}",
                *(f"-c {k}={v}" for k, v in SETTINGS.items()),
            ]
        )
        self.started = True
        _run(
            self._as_postgres(
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(self.pgdata),
                "-l",
                str(self.workdir / "server.log"),
                "-o",
                options,
                "-w",
                "-t",
                "120",
                "start",
            ),
            timeout=150,
        )

    def server_pids(self) -> list[int]:
        """The postmaster, whose children are the backends that ingest."""
        pid_file = self.pgdata / "postmaster.pid"
        return [int(pid_file.read_text().split()[0])] if pid_file.exists() else []

    def _connect(self) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        )

    def _create_table(self, table: str, data: Dataset) -> None:
        """Kwollect's tables, `table` as its `metrics`, with partitions covering the data."""
        with self._connect() as conn:
            kwollect_schema.create(conn, table, data.spec.start_us, data.spec.end_us)
        self.tables.append(table)

    def _copy(self, table: str, data: Dataset) -> float:
        """Load `data` with parallel COPY workers, each its pre-built part in COPY's binary
        format (untimed); return the seconds until committed."""
        parts = payloads.postgres_binary(data, self.workers)

        def copy(_worker: int, path: Path) -> None:
            with (
                self._connect() as conn,
                conn.cursor() as cur,
                cur.copy(
                    f"COPY {table} (timestamp, device_id, metric_id, value, labels) "
                    "FROM STDIN (FORMAT binary)"
                ) as copy,
                open(path, "rb") as f,
            ):
                while block := f.read(1 << 20):
                    copy.write(block)

        start = time.monotonic()
        run_parallel(copy, parts, TIMEOUT)
        return time.monotonic() - start

    def load(self, data: Dataset) -> Ingest:
        """Timed until every COPY has committed: committed rows are queryable."""
        self._create_table("metrics", data)
        seconds = self._copy("metrics", data)
        return Ingest(data.spec.readings, seconds, {"settings": SETTINGS})

    def stored(self, data: Dataset) -> int:
        with self._connect() as conn:
            (stored,) = conn.execute("SELECT count(*) FROM metrics").fetchone()  # type: ignore[misc]
        return int(stored)

    def compact(self) -> None:
        """VACUUM ANALYZE: visibility map, free space and the planner's statistics."""
        with self._connect() as conn:
            conn.execute("VACUUM ANALYZE metrics")

    def _size(self, table: str) -> int:
        with self._connect() as conn:
            row = conn.execute(
                "SELECT sum(pg_total_relation_size(relid))::bigint "
                "FROM pg_partition_tree(%s) WHERE isleaf",
                (table,),
            ).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def storage_by_table(self) -> dict[str, int]:
        """Every table of the database (a partitioned one with its partitions), indexes and
        TOAST included."""
        with self._connect() as conn:
            rows = conn.execute(  # pg_partition_tree has no row for a plain table
                "SELECT c.relname, coalesce((SELECT sum(pg_total_relation_size(t.relid)) "
                "FROM pg_partition_tree(c.oid) t WHERE t.isleaf), "
                "pg_total_relation_size(c.oid))::bigint FROM pg_class c "
                "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition "
                "AND c.relnamespace = 'public'::regnamespace"
            ).fetchall()
        return {str(name): int(size) for name, size in rows}

    def storage_bytes(self) -> int:
        return sum(self.storage_by_table().values())

    def storage_bytes_of(self, data: Dataset) -> int:
        table = "metrics_" + ("int" if data.spec.integer else "float") + f"_{len(self.tables)}"
        self._create_table(table, data)
        self._copy(table, data)
        with self._connect() as conn:
            conn.execute(f"VACUUM ANALYZE {table}")
        return self._size(table)

    def _query_connection(self) -> psycopg.Connection:
        """The querying client's one connection (a pool of one), opened at its first fetch and
        kept: no backend started, no catalog cache filled, per fetch."""
        if self.query_conn is None or self.query_conn.closed:
            self.query_conn = self._connect()
        return self.query_conn

    def fetch(self, data: Dataset, selection: Selection) -> bytes:
        out = bytearray()
        with (
            self._query_connection().cursor() as cur,
            cur.copy(
                "COPY (SELECT timestamp, device_id, metric_id, value, labels FROM metrics "
                "WHERE device_id = ANY(%s) AND timestamp >= %s AND timestamp < %s) TO STDOUT",
                (selection.device_names(data), utc(selection.start_us), utc(selection.end_us)),
            ) as copy,
        ):
            for block in copy:
                out += block
        return bytes(out)

    def count(self, fetched: bytes) -> int:
        return fetched.count(b"\n")

    def stop(self) -> None:
        if self.query_conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.query_conn.close()
            self.query_conn = None
        if not self.started:
            return
        self.started = False
        result = subprocess.run(
            self._as_postgres(
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(self.pgdata),
                "-m",
                "fast",
                "-w",
                "-t",
                "60",
                "stop",
            ),
            capture_output=True,
            timeout=90,
            check=False,
        )
        if result.returncode != 0 and (pid_file := self.pgdata / "postmaster.pid").exists():
            pid = int(pid_file.read_text().split()[0])  # the postmaster we started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _run(argv: list[str], timeout: float) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{result.stdout}{result.stderr}")
