"""Passwords and API tokens of the embedded default: generated once into state/secrets.env
(mode 600 from its first byte, in a private state directory). A file from an older release
gets the names it lacks added.

Each process of the stack gets only the secrets it needs (`OWNERS`); the calling shell's
secrets are never passed on whole (`public_environ`).
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

NAMES = (
    "JOBSCOPE_CLICKHOUSE_ADMIN_PASSWORD",
    "JOBSCOPE_CLICKHOUSE_READER_PASSWORD",
    "JOBSCOPE_CLICKHOUSE_API_PASSWORD",
    # Superset (`make superset`): its read-only ClickHouse user, its user `admin`, its key.
    "JOBSCOPE_CLICKHOUSE_SUPERSET_PASSWORD",
    "JOBSCOPE_SUPERSET_ADMIN_PASSWORD",
    "JOBSCOPE_SUPERSET_SECRET_KEY",
    # API tokens (Authorization: Bearer ...): every role, and the scheduler's (writes jobs).
    "JOBSCOPE_ADMIN_TOKEN",
    "JOBSCOPE_SCHEDULER_TOKEN",
    # The key that signs the users' tokens (api/infra/tokens.py: `POST /api/tokens`).
    "JOBSCOPE_TOKEN_SECRET",
    # The simulated devices of `make up DEVICES=sample` (SNMPv3 user, BMC): their passwords.
    "JOBSCOPE_SNMP_AUTH_PASSWORD",
    "JOBSCOPE_SNMP_PRIV_PASSWORD",
    "JOBSCOPE_IPMI_PASSWORD",
    # The demo OAR database of `make connect` (connectors/oar_postgres.py): its superuser.
    "JOBSCOPE_DEMO_OAR_DB_PASSWORD",
    # Kafka Connect's REST API (HTTP basic, connectors/worker.py): its user's password.
    "JOBSCOPE_CONNECT_REST_PASSWORD",
    # Kafka's SCRAM users when its brokers authenticate (JOBSCOPE_KAFKA_SASL,
    # stack/kafka_broker.py): the stack's tools, the brokers, each component; the controllers.
    "JOBSCOPE_KAFKA_ADMIN_PASSWORD",
    "JOBSCOPE_KAFKA_BROKER_PASSWORD",
    "JOBSCOPE_KAFKA_PRODUCERS_PASSWORD",
    "JOBSCOPE_KAFKA_API_PASSWORD",
    "JOBSCOPE_KAFKA_CLICKHOUSE_PASSWORD",
    "JOBSCOPE_KAFKA_CONNECT_PASSWORD",
    "JOBSCOPE_KAFKA_CONTROLLER_PASSWORD",
    # The local OpenID Connect provider of `make up AUTH=oidc` (stack/oidc_provider.py): its
    # admin, its demo users' password, the client secrets of the services and of Superset.
    "JOBSCOPE_OIDC_ADMIN_PASSWORD",
    "JOBSCOPE_OIDC_DEMO_PASSWORD",
    "JOBSCOPE_OIDC_SERVICE_SECRET",
    "JOBSCOPE_OIDC_SUPERSET_SECRET",
)

# The secrets each process of the stack is started with; no process gets another's.
OWNERS: dict[str, tuple[str, ...]] = {
    # its users' passwords, through a pipe (stack/services.py), not its environment
    "clickhouse": (
        "JOBSCOPE_CLICKHOUSE_ADMIN_PASSWORD",
        "JOBSCOPE_CLICKHOUSE_READER_PASSWORD",
        "JOBSCOPE_CLICKHOUSE_API_PASSWORD",
        "JOBSCOPE_CLICKHOUSE_SUPERSET_PASSWORD",
    ),
    "api": (
        "JOBSCOPE_CLICKHOUSE_API_PASSWORD",
        "JOBSCOPE_ADMIN_TOKEN",
        "JOBSCOPE_SCHEDULER_TOKEN",
        "JOBSCOPE_TOKEN_SECRET",
        "JOBSCOPE_KAFKA_API_PASSWORD",
    ),
    "producers": (
        "JOBSCOPE_SNMP_AUTH_PASSWORD",
        "JOBSCOPE_SNMP_PRIV_PASSWORD",
        "JOBSCOPE_IPMI_PASSWORD",
        "JOBSCOPE_KAFKA_PRODUCERS_PASSWORD",
    ),
    "simulators": (
        "JOBSCOPE_SNMP_AUTH_PASSWORD",
        "JOBSCOPE_SNMP_PRIV_PASSWORD",
        "JOBSCOPE_IPMI_PASSWORD",
    ),
    "superset": (
        "JOBSCOPE_CLICKHOUSE_SUPERSET_PASSWORD",
        "JOBSCOPE_SUPERSET_SECRET_KEY",
        "JOBSCOPE_OIDC_SUPERSET_SECRET",
    ),
    "kafka": (),
    # its REST API's password, written by the worker into its private credentials file
    "connect": ("JOBSCOPE_CONNECT_REST_PASSWORD",),
    "oidc-provider": ("JOBSCOPE_OIDC_ADMIN_PASSWORD",),
}

# A variable of the calling shell with such a name is taken for a secret: it is passed only
# to the producers (a device password named by a devices file's `password_env`).
SECRET_LOOKING = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|_KEY$", re.IGNORECASE)


def private_dir(path: Path, group: int | None = None) -> Path:
    """Create `path` (and missing parents) owned by this account, mode 700; with `group`,
    mode 710 and that group: its members may reach the entries they know the name of (the
    ClickHouse account its own folders), never list or read the others."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if group is None:
        path.chmod(0o700)
    else:
        os.chown(path, -1, group)
        path.chmod(0o710)
    return path


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only, from the first byte: a new file
    replaces the old one (an existing file with a wider mode is never written to)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.replace(tmp, path)


def load_or_create(state_dir: Path) -> dict[str, str]:
    """Values from the environment win; missing ones are read from, or added to, the file."""
    path = state_dir / "secrets.env"
    stored: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep and not name.startswith("#"):
                stored[name.strip()] = value.strip()
    missing = [n for n in NAMES if n not in stored]
    if missing:
        for name in missing:
            stored[name] = secrets.token_urlsafe(12)  # 16 characters: what ipmi_sim accepts
        if "JOBSCOPE_TOKEN_SECRET" in missing:  # an HMAC-SHA256 key: 32 bytes at least
            stored["JOBSCOPE_TOKEN_SECRET"] = secrets.token_urlsafe(32)
        if "JOBSCOPE_SUPERSET_SECRET_KEY" in missing:  # signs Superset's sessions
            stored["JOBSCOPE_SUPERSET_SECRET_KEY"] = secrets.token_urlsafe(42)
        if not state_dir.exists():
            private_dir(state_dir)
        write_private(
            path,
            "# Generated by `make up`; each jobscope process gets its own. Keep private.\n"
            + "".join(f"{n}={stored[n]}\n" for n in NAMES),
        )
    path.chmod(0o600)  # a file of an older release may have been written wider
    return {n: os.environ.get(n) or stored[n] for n in NAMES}


def of(state_dir: Path, part: str) -> dict[str, str]:
    """The secrets of one part of the stack (a name of `OWNERS`)."""
    values = load_or_create(state_dir)
    return {name: values[name] for name in OWNERS[part]}


def public_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The calling shell's environment without anything that is, or looks like, a secret:
    what every process of the stack inherits."""
    environ = os.environ if environ is None else environ
    return {
        name: value
        for name, value in environ.items()
        if name not in NAMES and not SECRET_LOOKING.search(name)
    }


def shell_secrets(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The secret-looking variables of the calling shell that are not the stack's own (device
    passwords an operator exported for the producers' `password_env`)."""
    environ = os.environ if environ is None else environ
    return {
        name: value
        for name, value in environ.items()
        if name not in NAMES and SECRET_LOOKING.search(name)
    }


def pipe(values: Mapping[str, str]) -> int:
    """A pipe holding `NAME=value` lines and then its end; returns its read end (for the
    child's `pass_fds`; the caller closes it once the child started). How the ClickHouse
    server gets its passwords: read at start, never in its environment."""
    text = "".join(f"{name}={value}\n" for name, value in values.items()).encode()
    read_end, write_end = os.pipe()
    try:
        if len(text) > 65536:  # the pipe's buffer: written before the child reads
            raise ValueError("too many secrets for one pipe")
        os.write(write_end, text)
    finally:
        os.close(write_end)
    return read_end
