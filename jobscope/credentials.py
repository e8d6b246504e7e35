"""The logins `jobscope login` stored: one per API URL, in
`$XDG_CONFIG_HOME/jobscope/credentials.json` (else `~/.config/jobscope/`).

The folder is private (0700) and the file is created private (0600) from its first byte,
written whole to a new file then renamed over the old one: a reader sees the old file or the
new, never half of one; a file or link planted at its name is replaced, not written through.
Changes are made under a lock (`credentials.lock`), so that two commands refreshing at once
do not lose each other's login.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path

from jobscope.errors import ApiError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one jobscope at a time
    fcntl = None  # type: ignore[assignment]

FILE = "credentials.json"


@dataclass(frozen=True)
class Login:
    """A login at the site's provider for one API: its tokens and where to refresh them.
    Times are Unix seconds; `refresh_expires_at` 0 when the provider gave no limit."""

    access_token: str
    refresh_token: str
    expires_at: float
    refresh_expires_at: float
    issuer: str
    client_id: str
    token_endpoint: str
    revocation_endpoint: str = ""


def folder() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "jobscope"


def key(api: str) -> str:
    """An API's URL as logins are filed under it."""
    return api.rstrip("/")


def read(path: Path | None = None) -> dict[str, Login]:
    """The stored logins by API URL ({} without a file)."""
    path = path or folder() / FILE
    try:
        body = json.loads(path.read_bytes())
        return {api: Login(**login) for api, login in body["logins"].items()}
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ApiError(f"{path}: not a jobscope credentials file ({exc}): remove it") from None


def lookup(api: str) -> Login | None:
    return read().get(key(api))


@contextmanager
def edit(path: Path | None = None) -> Iterator[dict[str, Login]]:
    """The stored logins, to change in place; locked against other jobscope processes until
    written back (when changed)."""
    path = path or folder() / FILE
    _private_folder(path.parent)
    lock = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        logins = read(path)
        before = dict(logins)
        yield logins
        if logins != before:
            write(path, {"logins": {api: asdict(login) for api, login in logins.items()}})
    finally:
        os.close(lock)


def write(path: Path, content: object) -> None:
    """`content` as JSON in `path`, atomically, in a file private from its creation."""
    data = json.dumps(content, indent=1).encode()
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with suppress(FileNotFoundError):
            temporary.unlink()
        raise


def _private_folder(path: Path) -> None:
    """`path` as a folder only its owner may enter (created so, or made so)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            path.chmod(0o700)
