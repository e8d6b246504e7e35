"""`python -m stack install|uninstall [--root DIR] [--with superset,connect]` (`make install
[WITH=superset,connect]`): jobscope as systemd services on one machine, run from this checkout
and its venvs.

It writes, under DIR (default `/`; the paths written into the files are DIR's, so a tree
installed elsewhere runs in place, as the tests run it):
- `etc/jobscope/jobscope.env`: the settings (StackSettings, the variables `make up` reads;
  any other component setting of docs/configuration.md may be added), validated through
  the components' own settings classes before anything is written;
- `etc/jobscope/secrets/<part>.env`: each part's own secrets (root's, mode 600: systemd
  reads them and hands each service its own; the service's account cannot read or change
  the file);
- `var/lib/jobscope/`: the state, one folder per part owned by that part's account, and the
  generated secrets (`secrets.env`, root's);
- `etc/systemd/system/jobscope-{kafka,clickhouse,producers,api}.service` and
  `jobscope.target`; with `--with`, `jobscope-superset.service` (after ClickHouse) and
  `jobscope-connect.service` (after Kafka; it reads the site's OAR database, whose password
  the installer takes from JOBSCOPE_CONNECT_OAR_DB_PASSWORD), kept by later installs.
Accounts (`useradd --system`), ownership, `systemctl enable` happen only for DIR `/` as root;
otherwise what would be run is printed. Installing again keeps the secrets, the data and
the settings file's values (the variables given override them): run it after editing the
file, as Kafka's configuration is rendered from it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings

from stack import kafka_broker, secrets, service, superset
from stack.config import REPO_ROOT, StackSettings
from stack.services import USERADD_OPTIONS, let_account_reach

PARTS = ("kafka", "clickhouse", "producers", "api")
"""In start order; each part is one unit and one account."""
OPTIONAL_PARTS = ("superset", "connect")
"""Installed when asked for (`--with`), or when an earlier install did."""
PREFIX = "JOBSCOPE_"
DESCRIPTIONS = {
    "kafka": "jobscope Kafka broker (KRaft)",
    "clickhouse": "jobscope ClickHouse server (embedded engine)",
    "producers": "jobscope producers (polling devices into Kafka)",
    "api": "jobscope REST API",
    "superset": "jobscope Superset (dashboards, SQL Lab)",
    "connect": "jobscope Kafka Connect (OAR jobs by change data capture)",
}
OAR_DB_PASSWORD = "JOBSCOPE_CONNECT_OAR_DB_PASSWORD"
"""The site's OAR database password: the installer's environment, else the last install's."""


T = TypeVar("T", bound=BaseModel)


class InstallError(Exception):
    """A refusal to install, with what to fix."""


@dataclass(frozen=True)
class Layout:
    """Where the install writes, under `root`."""

    root: Path

    @property
    def etc(self) -> Path:
        return self.root / "etc" / "jobscope"

    @property
    def config_file(self) -> Path:
        return self.etc / "jobscope.env"

    @property
    def secrets_dir(self) -> Path:
        return self.etc / "secrets"

    @property
    def unit_dir(self) -> Path:
        return self.root / "etc" / "systemd" / "system"

    @property
    def state_dir(self) -> Path:
        return self.root / "var" / "lib" / "jobscope"

    @property
    def real(self) -> bool:
        """Installing onto this machine: accounts, ownership and systemd are touched."""
        return self.root.resolve() == Path("/") and os.geteuid() == 0

    def secrets_file(self, part: str) -> Path:
        return self.secrets_dir / f"{part}.env"

    def unit_file(self, name: str) -> Path:
        return self.unit_dir / name


def unit_name(part: str) -> str:
    return f"jobscope-{part}.service"


def account(settings: StackSettings, part: str) -> str:
    if part == "clickhouse":
        return settings.clickhouse_account or "jobscope-clickhouse"
    return f"jobscope-{part}"


def read_env_file(path: Path) -> dict[str, str]:
    """`NAME=value` lines (comments and blank lines skipped); empty if there is no file."""
    if not path.exists():
        return {}
    pairs = (line.partition("=") for line in path.read_text().splitlines())
    return {n.strip(): v.strip() for n, sep, v in pairs if sep and not n.lstrip().startswith("#")}


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ is `env` alone meanwhile: the settings classes read it as a unit would."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _validated(cls: type[T], env: Mapping[str, str], where: str) -> T:
    try:
        with _environment(env):
            return cls()
    except ValidationError as exc:
        problems = "; ".join(
            f"{PREFIX}{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors()
        )
        raise InstallError(f"refusing to install: {where}: {problems}") from None


def settings_values(layout: Layout, environ: Mapping[str, str]) -> dict[str, str]:
    """The settings file's values: those of an earlier install, overridden by the
    StackSettings variables in `environ`, with the service install's own defaults."""
    values = {
        f"{PREFIX}STATE_DIR": str(layout.state_dir),
        f"{PREFIX}DEVICES_FILE": str(layout.etc / "devices.yaml"),
        f"{PREFIX}KAFKA_SASL": "true",
        **read_env_file(layout.config_file),
    }
    fields = {f"{PREFIX}{name.upper()}" for name in StackSettings.model_fields}
    values |= {name: value for name, value in environ.items() if name in fields}
    leaked = sorted(name for name in values if secrets.SECRET_LOOKING.search(name))
    if leaked:
        raise InstallError(
            f"refusing to install: {layout.config_file} must hold no secret ({', '.join(leaked)}"
            f"): secrets are generated into {layout.state_dir / 'secrets.env'}"
        )
    return values


def render_settings(settings: StackSettings, values: Mapping[str, str]) -> str:
    """The settings file: every StackSettings value as validated, then any other setting
    (of a component) the file held."""
    lines = [
        "# jobscope's settings, read by every jobscope unit (python -m stack install wrote it;",
        "# edit, then run it again: it validates them and renders Kafka's configuration).",
        "# Names and meanings: docs/configuration.md. Secrets are not here: secrets/<part>.env.",
    ]
    own = set()
    for name, field in StackSettings.model_fields.items():
        value = getattr(settings, name)
        variable = f"{PREFIX}{name.upper()}"
        own.add(variable)
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        lines += [f"# {field.description}", f"{variable}={text}"]
    lines += [f"{n}={v}" for n, v in sorted(values.items()) if n not in own]
    return "\n".join(lines) + "\n"


def part_secrets(settings: StackSettings, part: str, values: Mapping[str, str]) -> dict[str, str]:
    """The secrets of `part` (stack.secrets.OWNERS; Superset's unit also sets its admin's
    password, Connect's holds the OAR database's when given), its Kafka password under the
    name its Kafka client reads. Any other secret missing stops the install: a unit without
    it would fail at its start, far from the cause."""
    kafka_passwords = set(kafka_broker.SCRAM_USERS.values())
    names = {
        "superset": service.SUPERSET_SECRETS,
        "connect": (*secrets.OWNERS["connect"], OAR_DB_PASSWORD),
    }
    wanted = names.get(part) or secrets.OWNERS[part]
    missing = [n for n in wanted if n not in values and n != OAR_DB_PASSWORD]
    if missing:
        raise InstallError(
            f"refusing to install: {', '.join(missing)} of the {part} part missing from the "
            f"secrets of {settings.state_dir} (secrets.env)"
        )
    own = {n: values[n] for n in wanted if n in values and n not in kafka_passwords}
    if kafka_broker.sasl(settings) and part in service.KAFKA_USERS:
        user = service.KAFKA_USERS[part]
        own["JOBSCOPE_KAFKA_SASL_PASSWORD"] = values[kafka_broker.SCRAM_USERS[user]]
    return own


def validate_parts(
    settings: StackSettings,
    values: Mapping[str, str],
    passwords: Mapping[str, str],
    parts: Sequence[str],
) -> None:
    """Each component's settings, from the environment its unit gives it."""
    from api.infra.config import ApiSettings
    from producers.config import ProducerSettings
    from stack.clickhouse_server.config import ServerSettings
    from stack.superset import SupersetSettings

    classes: dict[str, type[BaseSettings]] = {
        "clickhouse": ServerSettings,
        "producers": ProducerSettings,
        "api": ApiSettings,
        "superset": SupersetSettings,
    }
    for part in parts:
        env = {
            **values,
            **service.part_env(settings, part),
            **part_secrets(settings, part, passwords),
        }
        if part in classes:
            _validated(classes[part], env, f"the {part}' settings")
        if part == "connect":  # connectors/ imports stack/, not the reverse: its own check
            done = connect_step("check", env)
            if done.returncode != 0:
                raise InstallError(f"refusing to install Connect: {done.stderr.strip()}")


def connect_step(step: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m connectors.service <step>` (the Connect unit's) in the environment `env`."""
    return subprocess.run(
        [sys.executable, "-m", "connectors.service", step],
        env={**secrets.public_environ(), **env},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def render_unit(settings: StackSettings, layout: Layout, part: str) -> str:
    """The systemd unit of `part`."""
    python = sys.executable
    state = settings.state_dir
    # Connect's steps are in connectors/ (which imports stack/, not the reverse)
    step = f"{python} -m {'connectors' if part == 'connect' else 'stack'}.service"
    after = {
        "kafka": ["network.target"],
        "clickhouse": ["network.target", unit_name("kafka")],
        "producers": ["network.target", unit_name("kafka"), unit_name("clickhouse")],
        "api": ["network.target", unit_name("kafka"), unit_name("clickhouse")],
        "superset": ["network.target", unit_name("clickhouse")],
        "connect": ["network.target", unit_name("kafka")],
    }[part]
    requires = [u for u in after if u != "network.target"]
    writable = {
        "kafka": [state / "kafka"],
        "clickhouse": [
            state / "clickhouse",
            state / "clickhouse-tmp",
            state / "clickhouse-engine.xml",
            service.clickhouse_log_dir(settings),
        ],
        "producers": [state / "producer-spool", service.ipmi_cache_dir(settings)],
        "api": [],
        "superset": [superset.home(settings)],
        "connect": [service.connect_home(settings)],
    }[part]
    unit = [
        "# Written by `python -m stack install` (stack/install.py); install again to change it.",
        "[Unit]",
        f"Description={DESCRIPTIONS[part]}",
        f"Documentation=file://{REPO_ROOT / 'docs' / 'operations.md'}",
        f"After={' '.join(after)}",
        *([f"Requires={' '.join(requires)}"] if requires else []),
        "PartOf=jobscope.target",
        "",
        "[Service]",
        "Type=simple",
        f"User={account(settings, part)}",
        f"Group={account(settings, part)}",
        f"EnvironmentFile={layout.config_file}",
    ]
    if part == "clickhouse":  # its passwords on standard input, never in its environment
        unit.append(f"StandardInput=file:{layout.secrets_file(part)}")
    else:
        unit.append(f"EnvironmentFile={layout.secrets_file(part)}")
    unit += [f"WorkingDirectory={REPO_ROOT}", f"ExecStart={step} {part}"]
    if part in ("kafka", "connect"):  # a JVM stopped by SIGTERM exits 143
        unit += [f"ExecStartPost={step} {part}-ready", "SuccessExitStatus=143"]
    if part == "superset":
        unit.append(f"ExecStartPost={step} superset-ready")
    if part == "clickhouse":
        unit += [
            f"ExecStartPost={step} clickhouse-schema",
            f"ExecStop={step} clickhouse-drain",
            f"TimeoutStopSec={int(service.DRAIN_TIMEOUT_S) + 60}",
        ]
    unit += [
        f"TimeoutStartSec={int(service.READY_TIMEOUT_S) + 60}",
        "Restart=on-failure",
        "RestartSec=5",
        "StandardOutput=journal",
        "StandardError=journal",
        f"SyslogIdentifier=jobscope-{part}",
        "UMask=0077",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",  # the checkout may live in a home folder: read, never write
        *([f"ReadWritePaths={' '.join(map(str, writable))}"] if writable else []),
        "",
        "[Install]",
        "WantedBy=jobscope.target",
    ]
    return "\n".join(unit) + "\n"


def render_target(parts: Sequence[str]) -> str:
    """The target of every installed part: its description names them (optional ones too)."""
    names = ", ".join(DESCRIPTIONS[p].removeprefix("jobscope ").split(" (")[0] for p in parts)
    return (
        "# Written by `python -m stack install` (stack/install.py).\n"
        "[Unit]\n"
        f"Description=jobscope: job-scoped metrics ({names})\n"
        f"Wants={' '.join(unit_name(p) for p in parts)}\n"
        "\n[Install]\nWantedBy=multi-user.target\n"
    )


def _write(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    secrets.write_private(path, text)
    path.chmod(mode)


def owned_paths(settings: StackSettings) -> dict[str, list[tuple[Path, bool]]]:
    """What each part's account owns in the state directory: (path, is a folder)."""
    state = settings.state_dir
    return {
        "kafka": [(state / "kafka", True)],
        "clickhouse": [
            (state / "clickhouse", True),
            (state / "clickhouse-tmp", True),
            (service.clickhouse_log_dir(settings), True),
            (state / "clickhouse-engine.xml", False),
        ],
        "producers": [(state / "producer-spool", True), (service.ipmi_cache_dir(settings), True)],
        "api": [],
        "superset": [(superset.home(settings), True)],
        "connect": [(service.connect_home(settings), True)],
    }


def prepare_state(settings: StackSettings, parts: Sequence[str]) -> None:
    """The state folders and Kafka: configuration rendered, storage formatted once (with
    the SCRAM users), the broker's jars copied from the Maven cache; Connect's jars too."""
    secrets.private_dir(settings.state_dir).chmod(0o711)  # the accounts reach their own
    for part in parts:
        for path, folder in owned_paths(settings)[part]:
            if folder:
                path.mkdir(mode=0o700, exist_ok=True)
            else:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
    config = kafka_broker.render_config(settings)
    kafka_broker.format_storage(settings, config)
    jars = service.kafka_jars(settings)
    shutil.rmtree(jars, ignore_errors=True)  # a release's jars replace the last one's
    jars.mkdir(mode=0o700)
    for jar in kafka_broker.classpath(settings).split(os.pathsep):
        shutil.copy2(jar, jars)
    if "connect" in parts:  # its classpath and plugins, from the installer's Maven cache
        done = connect_step("jars", {f"{PREFIX}STATE_DIR": str(settings.state_dir)})
        if done.returncode != 0:
            raise InstallError(f"Connect's jars not copied: {done.stdout}{done.stderr}")


def _run_or_say(layout: Layout, argv: list[str]) -> None:
    if layout.real:
        subprocess.run(argv, check=True)
    else:
        print(f"  would run: {' '.join(argv)}")


def give_to_accounts(settings: StackSettings, layout: Layout, parts: Sequence[str]) -> None:
    """Create each part's account and give it its folders (on this machine, as root)."""
    for part in parts:
        name = account(settings, part)
        try:
            pwd.getpwnam(name)
        except KeyError:
            _run_or_say(layout, ["useradd", *USERADD_OPTIONS, name])
        for path, _folder in owned_paths(settings)[part]:
            _run_or_say(layout, ["chown", "-R", f"{name}:{name}", str(path)])
        if layout.real:
            entry = pwd.getpwnam(name)
            let_account_reach(REPO_ROOT, entry.pw_uid, entry.pw_gid, listed=True)


def installed_parts(layout: Layout, optional: Sequence[str]) -> tuple[str, ...]:
    """PARTS, then the optional parts asked for or installed before (their unit is there)."""
    unknown = sorted(set(optional) - set(OPTIONAL_PARTS))
    if unknown:
        raise InstallError(
            f"refusing to install: --with {','.join(unknown)}: only {', '.join(OPTIONAL_PARTS)}"
        )
    return PARTS + tuple(
        p for p in OPTIONAL_PARTS if p in optional or layout.unit_file(unit_name(p)).exists()
    )


def install(
    layout: Layout, environ: Mapping[str, str], optional: Sequence[str] = ()
) -> tuple[StackSettings, tuple[str, ...]]:
    """Validate, then write everything; return the settings and the parts installed."""
    parts = installed_parts(layout, optional)
    values = settings_values(layout, environ)
    settings = _validated(StackSettings, values, str(layout.config_file))
    secrets.private_dir(settings.state_dir)
    passwords = dict(secrets.load_or_create(settings.state_dir))
    oar = environ.get(OAR_DB_PASSWORD) or read_env_file(layout.secrets_file("connect")).get(
        OAR_DB_PASSWORD
    )
    if oar:
        passwords[OAR_DB_PASSWORD] = oar
    validate_parts(settings, values, passwords, parts)
    if not settings.devices_file.exists():
        demo = REPO_ROOT / "producers" / "config" / "demo.yaml"
        _write(settings.devices_file, demo.read_text(), 0o644)
    _write(layout.config_file, render_settings(settings, values), 0o644)
    layout.etc.chmod(0o755)
    for part in parts:
        own = part_secrets(settings, part, passwords)
        _write(layout.secrets_file(part), "".join(f"{n}={v}\n" for n, v in own.items()), 0o600)
    layout.secrets_dir.chmod(0o700)
    prepare_state(settings, parts)
    for part in parts:
        _write(layout.unit_file(unit_name(part)), render_unit(settings, layout, part), 0o644)
    _write(layout.unit_file("jobscope.target"), render_target(parts), 0o644)
    give_to_accounts(settings, layout, parts)
    for argv in (
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", "jobscope.target"],
    ):
        if Path("/run/systemd/system").exists() or not layout.real:
            _run_or_say(layout, argv)
    return settings, parts


def uninstall(layout: Layout) -> list[Path]:
    """Stop and remove the units; the settings, secrets and state stay (data is never
    deleted by this command). Returns the files removed."""
    if Path("/run/systemd/system").exists() or not layout.real:
        _run_or_say(layout, ["systemctl", "disable", "--now", "jobscope.target"])
    removed = []
    for name in (*map(unit_name, PARTS + OPTIONAL_PARTS), "jobscope.target"):
        path = layout.unit_file(name)
        if path.exists():
            path.unlink()
            removed.append(path)
    if removed:
        _run_or_say(layout, ["systemctl", "daemon-reload"])
    return removed


def command(name: str, root: Path, optional: Sequence[str] = ()) -> int:
    """`python -m stack install|uninstall --root DIR [--with superset,connect]`."""
    layout = Layout(root.resolve())
    if name == "uninstall":
        removed = uninstall(layout)
        print(
            f"removed: {', '.join(p.name for p in removed) or 'no unit was installed'}; kept: "
            f"{layout.etc} (settings, secrets) and the state (data)"
        )
        return 0
    os.umask(0o077)
    try:
        settings, parts = install(layout, os.environ, optional)
    except InstallError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(
        f"installed: {', '.join(unit_name(p) for p in parts)} and jobscope.target in "
        f"{layout.unit_dir}\nsettings: {layout.config_file}\nsecrets: {layout.secrets_dir}, "
        f"{settings.state_dir / 'secrets.env'}\nstate: {settings.state_dir}\n"
        "start: systemctl enable --now jobscope.target    logs: journalctl -u 'jobscope-*'"
    )
    return 0
