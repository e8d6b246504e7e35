"""The demo OAR database (connectors/oar_postgres.py) lets in only who has its password,
and keeps its files in a private folder nobody could name in advance."""

from __future__ import annotations

import os
import pwd
import stat

import psycopg
import pytest

from connectors.oar_postgres import OarDatabase


def test_a_local_account_without_the_password_is_refused(oar_db: OarDatabase) -> None:
    for host in ("127.0.0.1", str(oar_db.home / "run")):  # TCP and the server's socket
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(host=host, port=oar_db.port, user="postgres", dbname="oar")
    with oar_db.connect() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_its_files_are_private(oar_db: OarDatabase) -> None:
    home = oar_db.home.lstat()
    assert stat.S_ISDIR(home.st_mode) and not home.st_mode & 0o077
    owner = pwd.getpwnam("postgres").pw_uid if os.geteuid() == 0 else os.geteuid()
    assert home.st_uid == owner
    if os.geteuid() == 0:  # outside the private state directory: a name drawn by mkdtemp
        assert oar_db.home != oar_db.state_dir / oar_db.name
        assert str(oar_db.home) in (oar_db.state_dir / oar_db.name / "home").read_text()
    else:
        assert oar_db.home == oar_db.state_dir / oar_db.name
