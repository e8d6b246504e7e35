"""Superset in front of the stack's ClickHouse (`make superset`, `python -m stack superset`).

Superset runs from its own virtual environment (.venv-superset/, pinned by
superset/requirements.txt, installed by the Makefile), never the server's. Starting it:
initialise the metadata database once per Superset version (migrations, the `admin` user,
roles), set the admin password from state/secrets.env, import the dashboards bundle
(superset/bundle/, fixed UUIDs; superset/import_assets.py overwrites by UUID) with the
ClickHouse connection of this stack, with the roles and row-level security of the `jobs` read
policy (superset/jobscope_access.py), then serve with gunicorn on loopback. Given the site's
OpenID Connect provider (`oidc_issuer`; `make superset` after `make up AUTH=oidc` takes the
local one), users log in through it instead of Superset's own passwords. `make down` stops it
with the rest (its PID file is in state/pids like every other process).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
import zipfile
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from api.registry import registry, unit_sql
from stack import oidc_provider, secrets
from stack.config import REPO_ROOT, StackSettings, cache_home
from stack.processes import ManagedProcess
from stack.transient import STARTING

SUPERSET_DIR = REPO_ROOT / "superset"
BUNDLE_DIR = SUPERSET_DIR / "bundle"
UNIT_PLACEHOLDER = "METRIC_UNIT_SQL"
"""Where a dataset's column takes the unit of its metric_id (build_bundle)."""
DATABASE_FILE = "databases/jobscope_clickhouse.yaml"
JOB_DASHBOARD_SLUG = "jobscope-job"
ADMIN_PASSWORD = "JOBSCOPE_SUPERSET_ADMIN_PASSWORD"


class SupersetSettings(BaseSettings):
    """Every value can be set by an environment variable `JOBSCOPE_SUPERSET_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_SUPERSET_", extra="ignore")

    host: str = Field("127.0.0.1", description="Superset binds to this address")
    port: int = Field(8088, description="Superset's port")
    venv: Path = Field(REPO_ROOT / ".venv-superset", description="Superset's own venv")
    database_url: str = Field(
        "", description="Superset's metadata database; empty: SQLite in the state directory"
    )
    admin_user: str = Field(
        "admin", description="Superset's administrator (password in secrets.env)"
    )
    # workers x threads = requests served at once, each running at most one ClickHouse query:
    # 4, what the server lets one SQL user run at once (more would fail with code 202).
    workers: int = Field(2, ge=1, description="gunicorn worker processes")
    threads: int = Field(2, ge=1, description="threads per worker")
    clickhouse_user: str = Field("superset", description="Superset's read-only ClickHouse user")
    cache_dir: Path = Field(
        default_factory=cache_home,
        description="a new SQLite metadata database starts from a copy initialised once per "
        "Superset version and configuration, kept here (default: the user's cache)",
    )
    oidc_issuer: str = Field(
        "",
        description="the site's OpenID Connect provider (its issuer URL): users log in through "
        "it, registered at their first login, their role and projects read from its access "
        "token at each (docs/superset.md); empty: Superset's own passwords",
    )
    oidc_client_id: str = Field(
        oidc_provider.SUPERSET_CLIENT,
        description="Superset's confidential client at the provider (its secret: "
        "JOBSCOPE_OIDC_SUPERSET_SECRET)",
    )
    oidc_audience: str = Field(
        "jobscope", description="the provider's access tokens must name this audience (`aud`)"
    )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name


def home(stack: StackSettings) -> Path:
    """Superset's files in the state directory (SQLite metadata, bundle, uploads)."""
    return stack.state_dir / "superset"


def process(stack: StackSettings, name: str = "superset") -> ManagedProcess:
    return ManagedProcess(name, stack.pid_dir, stack.log_dir)


def superset_env(
    stack: StackSettings, settings: SupersetSettings, values: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of every Superset command (read by superset/superset_config.py);
    the secrets are `values` (the service's own, stack/service.py), else secrets.env's."""
    values = secrets.load_or_create(stack.state_dir) if values is None else values
    metadata = settings.database_url or f"sqlite:///{home(stack) / 'superset.db'}"
    oidc = (
        {
            "JOBSCOPE_SUPERSET_OIDC_ISSUER": settings.oidc_issuer,
            "JOBSCOPE_SUPERSET_OIDC_CLIENT_ID": settings.oidc_client_id,
            "JOBSCOPE_SUPERSET_OIDC_AUDIENCE": settings.oidc_audience,
            "JOBSCOPE_OIDC_SUPERSET_SECRET": values["JOBSCOPE_OIDC_SUPERSET_SECRET"],
        }
        if settings.oidc_issuer
        else {}
    )
    return {
        "SUPERSET_CONFIG_PATH": str(SUPERSET_DIR / "superset_config.py"),
        "SUPERSET_HOME": str(home(stack)),
        "JOBSCOPE_SUPERSET_DATABASE_URL": metadata,
        "JOBSCOPE_SUPERSET_SECRET_KEY": values["JOBSCOPE_SUPERSET_SECRET_KEY"],
        "JOBSCOPE_CLICKHOUSE_SUPERSET_USER": settings.clickhouse_user,
        "JOBSCOPE_CLICKHOUSE_SUPERSET_PASSWORD": values["JOBSCOPE_CLICKHOUSE_SUPERSET_PASSWORD"],
        "PYTHONUNBUFFERED": "1",
        **oidc,
    }


def admin_password(stack: StackSettings) -> str:
    return secrets.load_or_create(stack.state_dir)[ADMIN_PASSWORD]


def check_installed(settings: SupersetSettings) -> None:
    """Fail with what to run when Superset's venv is missing."""
    if not settings.bin("superset").exists():
        raise RuntimeError(
            f"Superset is not installed in {settings.venv}: run `make superset-venv` "
            "(or `make superset`, which installs it)"
        )


def _run(
    stack: StackSettings,
    settings: SupersetSettings,
    *args: str,
    program: str = "superset",
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    values: Mapping[str, str] | None = None,
) -> str:
    """Run a command of Superset's venv (`superset` by default), with `env` added and `stdin`
    as its input (never a password in its arguments); its output goes to the log (the
    service's: its standard output, the journal), a failure raises with it."""
    result = subprocess.run(
        [str(settings.bin(program)), *args],
        env={**secrets.public_environ(), **superset_env(stack, settings, values), **(env or {})},
        cwd=home(stack),
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        start_new_session=True,  # no terminal: a prompt reads `stdin`
    )
    log_file = stack.log_dir / "superset-setup.log"
    output = f"$ {program} {' '.join(args)}\n{result.stdout}{result.stderr}"
    if values is None:
        log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a") as log:
            log.write(output)
    else:
        print(output, flush=True)
    if result.returncode != 0:
        where = log_file if values is None else "the journal (journalctl -u jobscope-superset)"
        raise RuntimeError(
            f"`{program} {args[0]}` failed (exit {result.returncode}); see {where}:\n"
            + (result.stderr or result.stdout)[-2000:]
        )
    return result.stdout


def _version(settings: SupersetSettings) -> str:
    stamp = sorted(settings.venv.glob(".installed-*"))
    return stamp[-1].name if stamp else "unknown"


def _initialised_copy(settings: SupersetSettings) -> Path:
    """The cached metadata database of this Superset version and configuration."""
    config = hashlib.sha256((SUPERSET_DIR / "superset_config.py").read_bytes()).hexdigest()
    version = _version(settings).removeprefix(".installed-")
    return settings.cache_dir / f"superset-metadata-{version}-{config[:12]}.db"


def initialise(
    stack: StackSettings, settings: SupersetSettings, values: Mapping[str, str] | None = None
) -> None:
    """Migrations and roles once per installed Superset version; the admin user created the
    first time, its password set again on later starts (the environment may override it).
    A new SQLite database starts from a copy of one initialised so before (the migrations
    take a minute or more), kept in the user's cache by the first initialisation."""
    home(stack).mkdir(parents=True, exist_ok=True)
    done = home(stack) / f".initialised-{_version(settings)}"
    earlier = list(home(stack).glob(".initialised-*"))
    given = secrets.load_or_create(stack.state_dir) if values is None else values
    password = given[ADMIN_PASSWORD]
    database = home(stack) / "superset.db"
    fresh = not earlier and not settings.database_url
    copy = _initialised_copy(settings)
    if fresh and copy.exists():
        shutil.copyfile(copy, database)
        done.touch()
        earlier = [done]
    if not done.exists():
        _run(stack, settings, "db", "upgrade", values=values)
    # The password reaches `superset fab ...` by Flask's FLASK_<COMMAND>_<OPTION> variables
    # (and on its standard input, should it prompt), never in its arguments.
    if not earlier:
        _run(
            stack,
            settings,
            "fab",
            "create-admin",
            "--username",
            settings.admin_user,
            "--firstname",
            "jobscope",
            "--lastname",
            "admin",
            "--email",
            "admin@localhost",
            env={"FLASK_FAB_CREATE_ADMIN_PASSWORD": password},
            stdin=f"{password}\n{password}\n",
            values=values,
        )
    else:
        _run(
            stack,
            settings,
            *("fab", "reset-password", "--username", settings.admin_user),
            env={"FLASK_FAB_RESET_PASSWORD_PASSWORD": password},
            stdin=f"{password}\n{password}\n",
            values=values,
        )
    if not done.exists():
        _run(stack, settings, "init", values=values)
        for old in earlier:
            old.unlink()
        done.touch()
        if fresh:
            _keep_copy(database, copy)


def _keep_copy(database: Path, copy: Path) -> None:
    """Copy the database (private, as the state directory) and put it in place at once."""
    copy.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = copy.with_suffix(f".{os.getpid()}.partial")
    shutil.copyfile(database, partial)
    partial.chmod(0o600)
    partial.replace(copy)


def clickhouse_uri(stack: StackSettings, settings: SupersetSettings) -> str:
    """The bundle's connection, without its password (superset_config.py supplies it)."""
    return f"clickhousedb://{settings.clickhouse_user}@{stack.host}:{stack.clickhouse_port}/default"


def build_bundle(stack: StackSettings, settings: SupersetSettings) -> bytes:
    """superset/bundle/ as the ZIP Superset's importers take, with this stack's
    ClickHouse address in the database file and the metric registry's units in the
    datasets' `unit` columns (a ClickHouse expression of metric_id: api/registry.py)."""
    units = json.dumps(unit_sql(registry()))  # a YAML double-quoted scalar of the SQL
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted(BUNDLE_DIR.rglob("*.yaml")):
            relative = path.relative_to(BUNDLE_DIR).as_posix()
            text = path.read_text()
            if relative == DATABASE_FILE:
                database = yaml.safe_load(text)
                database["sqlalchemy_uri"] = clickhouse_uri(stack, settings)
                text = yaml.safe_dump(database, sort_keys=False)
            text = text.replace(UNIT_PLACEHOLDER, units)
            bundle.writestr(f"jobscope/{relative}", text)
    return buffer.getvalue()


def import_bundle(
    stack: StackSettings, settings: SupersetSettings, values: Mapping[str, str] | None = None
) -> Path:
    """Import the bundle (the database, datasets, charts, dashboards), overwriting by UUID."""
    path = home(stack) / "bundle.zip"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(build_bundle(stack, settings))
    importer = str(SUPERSET_DIR / "import_assets.py")
    argv = (importer, str(path), settings.admin_user)
    _run(stack, settings, *argv, program="python", values=values)
    return path


def gunicorn_argv(settings: SupersetSettings) -> list[str]:
    """Superset served by gunicorn on `settings`' address."""
    return [
        str(settings.bin("gunicorn")),
        "-w",
        str(settings.workers),
        "-k",
        "gthread",
        "--threads",
        str(settings.threads),
        "--timeout",
        "120",
        "-b",
        f"{settings.host}:{settings.port}",
        "superset.app:create_app()",
    ]


def healthy(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
        return response.status == 200


def serve(
    stack: StackSettings,
    settings: SupersetSettings,
    timeout: float = 120.0,
    name: str = "superset",
) -> None:
    """Serve with gunicorn; `name` names its process (PID file, log): a second one may serve
    the same metadata with other settings."""
    proc = process(stack, name)
    proc.start(
        gunicorn_argv(settings),
        env=superset_env(stack, settings),
        cwd=home(stack),
        ports=[(settings.host, settings.port)],
    )
    proc.wait_ready(
        lambda: healthy(settings.url), timeout, f"Superset on {settings.url}", 0.5, STARTING
    )


def start(stack: StackSettings, settings: SupersetSettings) -> None:
    """Initialise, import and serve; when already serving, import again (cheap, idempotent)."""
    check_installed(settings)
    initialise(stack, settings)
    import_bundle(stack, settings)
    serve(stack, settings)


def stop(stack: StackSettings, name: str = "superset") -> None:
    process(stack, name).stop()


def check_clickhouse(stack: StackSettings, settings: SupersetSettings) -> None:
    """Superset reads the running stack: its ClickHouse must answer as Superset's user."""
    request = urllib.request.Request(
        f"{stack.clickhouse_url}/?query=SELECT%201",
        headers={
            "X-ClickHouse-User": settings.clickhouse_user,
            "X-ClickHouse-Key": secrets.load_or_create(stack.state_dir)[
                "JOBSCOPE_CLICKHOUSE_SUPERSET_PASSWORD"
            ],
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        raise RuntimeError(
            f"ClickHouse at {stack.clickhouse_url} refuses the user {settings.clickhouse_user} "
            f"({exc.code}): a stack started by an older release lacks it; restart it "
            "(make down && make up)"
        ) from exc
    except OSError as exc:
        raise RuntimeError(
            f"no ClickHouse at {stack.clickhouse_url} ({exc}): start the stack first (make up)"
        ) from exc


def up(stack: StackSettings) -> None:
    """`make superset`: serve Superset against the running stack and say where."""
    settings = SupersetSettings()
    if not settings.oidc_issuer and (
        stack.auth == "oidc" or oidc_provider.process(stack).is_running()
    ):
        settings.oidc_issuer = oidc_provider.OidcProviderSettings().issuer
    check_installed(settings)
    check_clickhouse(stack, settings)
    start(stack, settings)
    print(
        f"Superset: {settings.url}/superset/dashboard/{JOB_DASHBOARD_SLUG}/ (Job), "
        f"{settings.url}/superset/dashboard/jobscope-devices/ (Devices), "
        f"{settings.url}/sqllab/ (SQL Lab)\n"
        f"User {settings.admin_user}, password JOBSCOPE_SUPERSET_ADMIN_PASSWORD in "
        f"{stack.state_dir / 'secrets.env'}\nLogs: {process(stack).log_file}    Stop: make down"
    )
    if settings.oidc_issuer:
        print(
            f"Users log in through {settings.oidc_issuer} (the admin's password only works "
            "on Superset's REST API); each sees the rows of their own jobs (docs/access.md)"
        )
