"""Users of the local server and how a request proves who it is."""

from __future__ import annotations

import base64
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field

from clickhouse.server.config import ServerSettings
from clickhouse.server.errors import AUTHENTICATION_FAILED, ClickHouseError


@dataclass(frozen=True)
class User:
    name: str
    password: str = field(repr=False)
    readonly: bool
    # Settings forced on every query of this user, after the client's own.
    forced_settings: Mapping[str, str] = field(default_factory=dict)


def users_from_settings(settings: ServerSettings) -> dict[str, User]:
    admin = User(settings.admin_user, settings.admin_password.get_secret_value(), readonly=False)
    reader = User(
        settings.reader_user,
        settings.reader_password.get_secret_value(),
        readonly=True,
        # FINAL hides readings delivered twice. A reading's copies always share a partition
        # (the day of its timestamp, which is in the dedup key), so FINAL need not merge
        # across partitions, and a partition of one part is read without merging at all.
        # readonly=1 comes last so nothing lifts it.
        forced_settings={
            "final": "1",
            "do_not_merge_across_partitions_select_final": "1",
            "readonly": "1",
        },
    )
    return {admin.name: admin, reader.name: reader}


def credentials(headers: Mapping[str, str], params: Mapping[str, str]) -> tuple[str, str]:
    """User and password from ClickHouse's headers, HTTP Basic auth or URL parameters."""
    if "X-ClickHouse-User" in headers:
        return headers["X-ClickHouse-User"], headers.get("X-ClickHouse-Key", "")
    auth = headers.get("Authorization", "")
    if auth.lower().startswith("basic "):
        try:
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            user, password = "", ""
        return user, password
    return params.get("user", "default"), params.get("password", "")


def authenticate(users: Mapping[str, User], name: str, password: str) -> User:
    user = users.get(name)
    if user is None or not hmac.compare_digest(user.password.encode(), password.encode()):
        raise ClickHouseError(
            AUTHENTICATION_FAILED,
            f"{name}: Authentication failed: password is incorrect, or there is no user "
            "with such name",
        )
    return user
