"""The logins `jobscope login` stores (jobscope/credentials.py): a private folder, a file
private from its first byte, written atomically, not through a planted file or link. No
provider needed: tests/identity/test_login.py logs in for real."""

from __future__ import annotations

import os
import resource
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobscope import credentials
from jobscope.credentials import Login
from jobscope.errors import ApiError

_events: list[tuple[str, tuple[Any, ...]]] | None = None


def _record(event: str, args: tuple[Any, ...]) -> None:
    """Python's audit events of file opening, renaming and mode changes, while recording."""
    if _events is None or event not in ("open", "os.rename", "os.chmod"):
        return
    if event == "os.rename":  # the hook runs before the rename: the file as it is then
        args = (*args, stat.S_IMODE(os.stat(args[0]).st_mode))
    _events.append((event, args))


sys.addaudithook(_record)


def login(token: str = "a.b.c") -> Login:
    return Login(
        access_token=token,
        refresh_token="r",
        expires_at=1.0,
        refresh_expires_at=0,
        issuer="http://127.0.0.1:1/realms/x",
        client_id="jobscope-cli",
        token_endpoint="http://127.0.0.1:1/token",
    )


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty XDG_CONFIG_HOME, under no umask: the modes are the code's alone."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    umask = os.umask(0)
    try:
        yield tmp_path / "config" / "jobscope"
    finally:
        os.umask(umask)


def modes(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_file_is_private_from_its_first_byte(home: Path) -> None:
    """Created 0600 (exclusively, not through a link), complete before it takes the name,
    and no mode changed after: no moment where another user may open it."""
    global _events
    _events = []
    try:
        with credentials.edit() as logins:
            logins["http://api"] = login()
    finally:
        events, _events = _events, None
    path = home / credentials.FILE
    assert modes(home) == 0o700
    assert modes(path) == 0o600
    assert credentials.lookup("http://api/") == login()
    assert not [args for event, args in events if event == "os.chmod"]
    opened = [a for e, a in events if e == "open" and isinstance(a[0], str | Path)]
    (created,) = [a for a in opened if Path(a[0]).name.startswith(".")]
    assert created[2] & os.O_CREAT and created[2] & os.O_EXCL and created[2] & os.O_NOFOLLOW
    (renamed,) = [a for e, a in events if e == "os.rename"]
    assert (Path(renamed[0]), Path(renamed[1]), renamed[-1]) == (Path(created[0]), path, 0o600)


def test_a_loose_folder_is_made_private(home: Path) -> None:
    home.mkdir(parents=True, mode=0o755)
    with credentials.edit() as logins:
        logins["http://api"] = login()
    assert modes(home) == 0o700


@pytest.mark.parametrize("planted", ["readable file", "link"])
def test_a_planted_file_or_link_is_replaced_not_written_through(
    home: Path, tmp_path: Path, planted: str
) -> None:
    """Another user's link at the file's name (to a file they read), or an old readable
    file: the login goes to a new private file, the link's target keeps its bytes."""
    home.mkdir(parents=True, mode=0o700)
    path = home / credentials.FILE
    target = tmp_path / "theirs"
    target.write_text('{"logins": {}}')
    target.chmod(0o644)
    if planted == "link":
        path.symlink_to(target)
    else:
        path.write_text('{"logins": {}}')
        path.chmod(0o644)
    with credentials.edit() as logins:
        logins["http://api"] = login()
    assert not path.is_symlink()
    assert modes(path) == 0o600
    assert target.read_text() == '{"logins": {}}'
    assert credentials.lookup("http://api") == login()


def test_a_write_that_fails_midway_leaves_the_old_file(home: Path) -> None:
    """The file system refuses the write past a size (RLIMIT_FSIZE; Python ignores SIGXFSZ):
    the old logins stay whole, and no partial file is left beside them."""
    with credentials.edit() as logins:
        logins["http://api"] = login()
    path = home / credentials.FILE
    before = path.read_bytes()
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 64, limits[1]))
    try:
        with pytest.raises(OSError), credentials.edit() as logins:
            logins["http://api"] = login("x" * 4096)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    assert path.read_bytes() == before
    assert sorted(p.name for p in home.iterdir()) == ["credentials.json", "credentials.lock"]


def test_unchanged_logins_are_not_rewritten(home: Path) -> None:
    with credentials.edit() as logins:
        logins["http://api"] = login()
    inode = (home / credentials.FILE).stat().st_ino
    with credentials.edit() as logins:
        logins["http://api"] = login()
    assert (home / credentials.FILE).stat().st_ino == inode


def test_an_unreadable_file_is_named(home: Path) -> None:
    home.mkdir(parents=True, mode=0o700)
    (home / credentials.FILE).write_text("not json")
    with pytest.raises(ApiError, match=r"credentials\.json: not a jobscope"):
        credentials.lookup("http://api")
