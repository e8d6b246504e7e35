"""Each jobscope process of the embedded default: how it starts and when it is healthy."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from clickhouse.migrate import MigrationSettings, apply_migrations, connect
from kafka import topics
from stack import kafka_broker, oidc_provider, secrets
from stack.config import REPO_ROOT, StackSettings
from stack.processes import ManagedProcess, free_port, wait_until
from stack.transient import KAFKA_STARTING, STARTING

log = logging.getLogger("jobscope.stack")


def fresh_stack(state_dir: Path) -> StackSettings:
    """Settings of a new stack in `state_dir` (emptied) on free loopback ports, stopped
    first if an earlier run left it running: the benchmarks' stacks."""
    settings = StackSettings(
        state_dir=state_dir,
        kafka_port=free_port(),
        kafka_controller_port=free_port(),
        kafka_heap="512m",
        clickhouse_port=free_port(),
        api_port=free_port(),
        producer_metrics_port=free_port(),
    )
    stop_all(settings)
    shutil.rmtree(state_dir, ignore_errors=True)
    return settings


def component_env(settings: StackSettings, part: str | None = None) -> dict[str, str]:
    """The environment every component reads its settings from (docs/configuring.md), with the
    secrets of `part` (a name of stack.secrets.OWNERS), or with every secret when None: for
    a test or a tool that starts a part by hand."""
    prepare_state_dir(settings)
    values = secrets.load_or_create(settings.state_dir)
    own = values if part is None else {name: values[name] for name in secrets.OWNERS[part]}
    return {**own, **settings_env(settings)}


def settings_env(settings: StackSettings) -> dict[str, str]:
    """The non-secret settings every component reads from its environment (the service
    install's units derive them from /etc/jobscope/jobscope.env: stack/service.py)."""
    return {
        "JOBSCOPE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "JOBSCOPE_CLICKHOUSE_HOST": settings.host,
        "JOBSCOPE_CLICKHOUSE_PORT": str(settings.clickhouse_port),
        "JOBSCOPE_CLICKHOUSE_DATA_DIR": str(settings.state_dir / "clickhouse"),
        "JOBSCOPE_CLICKHOUSE_ENGINE_LOG_FILE": str(engine_log_file(settings)),
        "JOBSCOPE_API_HOST": settings.host,
        "JOBSCOPE_API_PORT": str(settings.api_port),
        "JOBSCOPE_METRICS_PORT": str(settings.producer_metrics_port),
        "JOBSCOPE_SPOOL_ROOT": str(settings.state_dir / "producer-spool"),
        "JOBSCOPE_RETENTION_DAYS": str(settings.retention_days),
        "JOBSCOPE_JSON_TOPIC": settings.json_topic,
        **_oidc_env(settings),
        "PYTHONUNBUFFERED": "1",
    }


def _oidc_env(settings: StackSettings) -> dict[str, str]:
    """With AUTH=oidc, the API trusts the local provider (stack/oidc_provider.py)."""
    if settings.auth != "oidc":
        return {}
    return {"JOBSCOPE_OIDC_ISSUER": oidc_provider.OidcProviderSettings().issuer}


def engine_log_file(settings: StackSettings) -> Path:
    return settings.log_dir / "clickhouse-engine.log"


# A system account with its own group, no home and no login shell.
USERADD_OPTIONS = (
    *("--system", "--user-group", "--no-create-home"),
    *("--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"),
)


def clickhouse_account(settings: StackSettings) -> tuple[int, int] | None:
    """(uid, gid) of the account the ClickHouse server runs as when the stack starts as
    root, created (a system account, no home, no shell) the first time; None otherwise."""
    name = settings.clickhouse_account
    if os.geteuid() != 0 or not name:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        created = subprocess.run(
            ["useradd", *USERADD_OPTIONS, name], check=False, capture_output=True, text=True
        )
        if created.returncode not in (0, 9):  # 9: created meanwhile by another start
            raise RuntimeError(
                f"cannot create the account {name}: {created.stderr.strip()}"
            ) from None
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


def prepare_state_dir(settings: StackSettings) -> None:
    """The state directory, its logs and PIDs, private to this account (mode 700; what it
    holds is closed to others: `python -m stack` runs with umask 077, and entries an older
    release or another tool left open are closed here); when the ClickHouse server runs as
    an account of its own, state/ and logs/ let that account's group reach (not list) its
    own entries: mode 710."""
    account = clickhouse_account(settings)
    group = account[1] if account else None
    secrets.private_dir(settings.state_dir, group)
    secrets.private_dir(settings.log_dir, group)
    secrets.private_dir(settings.pid_dir)
    for path in (*settings.state_dir.iterdir(), *settings.log_dir.iterdir()):
        mode = path.lstat().st_mode
        if mode & 0o077 and not stat.S_ISLNK(mode) and path != settings.log_dir:
            path.chmod(stat.S_IMODE(mode) & 0o700)  # left open by an older release
    if account:
        let_account_reach(settings.state_dir, *account)


def _closed(path: Path, uid: int, gid: int, wanted: int) -> bool:
    """Whether the mode bits of `path` keep the account (uid, gid) from `wanted` (r=4, x=1)."""
    st = path.stat()
    if st.st_uid == uid:
        return (st.st_mode >> 6) & wanted != wanted
    if st.st_gid == gid:
        return (st.st_mode >> 3) & wanted != wanted
    return st.st_mode & wanted != wanted


def let_account_reach(path: Path, uid: int, gid: int, listed: bool = False) -> None:
    """Let the account reach `path` (and list it when `listed`: a folder Python imports
    from): each folder above it closed to the account (a checkout made by `mktemp -d`, or
    under /root) gets an ACL entry granting that account alone the right to pass through
    (x; rx on a folder it must list); everyone else stays kept out."""
    path = path.resolve()
    # The checkout is listed by Python's imports whichever path brings it here: never x alone.
    grants = [
        (p, "rx" if p == REPO_ROOT else "x")
        for p in reversed(path.parents)
        if _closed(p, uid, gid, 1)
    ]
    if listed and _closed(path, uid, gid, 5):
        grants.append((path, "rx"))
    for closed, rights in grants:
        try:
            done = subprocess.run(
                ["setfacl", "-m", f"u:{uid}:{rights}", str(closed)],
                check=False,
                capture_output=True,
                text=True,
            )
        except FileNotFoundError:
            done = None
        if done is None or done.returncode != 0:
            why = done.stderr.strip() if done else "setfacl is missing (Debian package acl)"
            raise RuntimeError(
                f"the ClickHouse account cannot reach {path}: {closed} is closed to it and "
                f"cannot be opened to it alone ({why}); move it (for the state: "
                "JOBSCOPE_STATE_DIR) or set JOBSCOPE_CLICKHOUSE_ACCOUNT='' to run the server as "
                "root"
            )


def _server_command(account: tuple[int, int] | None) -> tuple[list[str], dict[str, str]]:
    """How to run `python -m stack.clickhouse_server` (and its environment) as `account`: with this
    interpreter, or, when it lies where the account cannot reach (a Python built in root's
    home), with the system's Python of the same version and this venv's packages on its
    path (the venv and the repository must be readable by everyone, as they are by default)."""
    argv = ["-m", "stack.clickhouse_server"]
    if account is None:
        return [sys.executable, *argv], {}
    let_account_reach(REPO_ROOT, *account, listed=True)
    if not any(_closed(p, *account, 1) for p in Path(sys.executable).resolve().parents):
        return [sys.executable, *argv], {}
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path=os.defpath + ":/usr/bin:/usr/local/bin")
    if system is None or any(_closed(p, *account, 1) for p in Path(system).resolve().parents):
        raise RuntimeError(
            f"the ClickHouse account cannot run {sys.executable} and finds no {version} of its "
            "own: install one, or set JOBSCOPE_CLICKHOUSE_ACCOUNT='' to run the server as root"
        )
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], str(REPO_ROOT)]
    for path in paths:
        let_account_reach(Path(path), *account, listed=True)
    return [system, "-s", *argv], {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def give_to(account: tuple[int, int], path: Path, directory: bool) -> None:
    """Make `path` (a folder, with what it holds, or a file) the ClickHouse account's."""
    uid, gid = account
    if directory:
        path.mkdir(mode=0o700, exist_ok=True)
    else:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
    if path.lstat().st_uid == uid:
        return
    os.chown(path, uid, gid, follow_symlinks=False)
    if directory:  # a data directory of an older release, or of a stack run as root
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


# The local server's users and the variable holding each one's password.
PASSWORD_VARS = {
    "jobscope": "JOBSCOPE_CLICKHOUSE_ADMIN_PASSWORD",
    "reader": "JOBSCOPE_CLICKHOUSE_READER_PASSWORD",
    "api": "JOBSCOPE_CLICKHOUSE_API_PASSWORD",
}


def clickhouse_password(settings: StackSettings, user: str) -> str:
    return component_env(settings)[PASSWORD_VARS[user]]


def clickhouse_client(settings: StackSettings, user: str, **kwargs: object) -> Client:
    """A clickhouse-connect client to this stack's ClickHouse server as `user`."""
    return clickhouse_connect.get_client(
        host=settings.host,
        port=settings.clickhouse_port,
        username=user,
        password=clickhouse_password(settings, user),
        **kwargs,
    )


def migration_settings(settings: StackSettings, **overrides: object) -> MigrationSettings:
    """The schema settings of this stack (`overrides`: e.g. another database or topic)."""
    values: dict[str, object] = {
        "clickhouse_host": settings.host,
        "clickhouse_port": settings.clickhouse_port,
        "clickhouse_admin_password": clickhouse_password(settings, "jobscope"),
        "kafka_bootstrap": settings.kafka_bootstrap,
        "retention_days": settings.retention_days,
    }
    return MigrationSettings(**{**values, **overrides})


def process(settings: StackSettings, name: str) -> ManagedProcess:
    return ManagedProcess(name, settings.pid_dir, settings.log_dir)


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200


def start_kafka(settings: StackSettings) -> None:
    kafka_broker.start(settings)
    ensure_topics(settings, kafka_broker.client_settings(settings).kafka_security())


def ensure_topics(settings: StackSettings, security: dict[str, str]) -> None:
    """The stack's topics (the JSON copy's too, where configured), created if missing."""
    optional = (topics.json_readings(settings.json_topic),) if settings.json_topic else ()
    topics.ensure_topics(
        settings.kafka_bootstrap,
        (*topics.ALL_TOPICS, *optional),
        replication_factor=settings.kafka_replication_factor,
        min_insync_replicas=settings.kafka_min_insync_replicas,
        security=security,
    )


def start_clickhouse(settings: StackSettings, timeout: float = 60.0, schema: bool = True) -> None:
    """Start the local ClickHouse server and apply the schema (unless not `schema`: a restore
    brings the schema of its backup first, stack/backup.py). Its users' passwords reach it
    through a pipe it reads at start (JOBSCOPE_CLICKHOUSE_SECRETS_FD), never its environment;
    started as root, it runs as its own account (`clickhouse_account`), owner of its data,
    spool, configuration and log files and of nothing else."""
    env = component_env(settings, "clickhouse")
    passwords = {name: env.pop(name) for name in secrets.OWNERS["clickhouse"]}
    kafka = kafka_broker.client_env(settings, "clickhouse")  # its Kafka password: piped too
    passwords.update({n: kafka.pop(n) for n in list(kafka) if n.endswith("_PASSWORD")})
    env.update(kafka)
    account = clickhouse_account(settings)
    data_dir = settings.state_dir / "clickhouse"
    if account:
        for path, directory in (
            (data_dir, True),
            (data_dir.with_name(data_dir.name + "-tmp"), True),
            (data_dir.with_name(data_dir.name + "-engine.xml"), False),
            (engine_log_file(settings), False),
        ):
            give_to(account, path, directory)
    argv, python_env = _server_command(account)
    read_end = secrets.pipe(passwords)
    try:
        process(settings, "clickhouse").start(
            argv,
            env={
                **env,
                **python_env,
                "JOBSCOPE_CLICKHOUSE_SECRETS_FD": str(read_end),
                "HOME": str(data_dir),
                # a restore's server: no health row may land in server_health while RESTORE
                # fills it (monitoring.py HealthRecorder)
                **({} if schema else {"JOBSCOPE_CLICKHOUSE_HEALTH_RECORD_INTERVAL_S": "0"}),
            },
            cwd=REPO_ROOT,
            ports=[(settings.host, settings.clickhouse_port)],
            account=account,
            pass_fds=(read_end,),
        )
    finally:
        os.close(read_end)
    wait_until(
        lambda: http_ok(f"{settings.clickhouse_url}/ping"),
        timeout,
        f"ClickHouse on {settings.clickhouse_url}",
        transient=STARTING,
    )
    if schema:
        apply_schema(settings)


def apply_schema(settings: StackSettings) -> None:
    migration = migration_settings(settings)
    apply_migrations(connect(migration), migration)


def start_producers(
    settings: StackSettings, devices_file: Path | None = None, name: str = "producers"
) -> ManagedProcess:
    proc = process(settings, name)
    proc.start(
        [
            sys.executable,
            "-m",
            "producers",
            "--devices",
            str(devices_file or settings.devices_file),
        ],
        env={
            **secrets.shell_secrets(),
            **component_env(settings, "producers"),
            **kafka_broker.client_env(settings, "producers"),
        },
        cwd=REPO_ROOT,
    )
    return proc


def start_simulators(settings: StackSettings, timeout: float = 300.0) -> None:
    """The simulated devices (stack/simulators), when `settings.simulators` asks for them.
    The first start builds snmpsim's own venv (cached for later starts)."""
    if not settings.simulators:
        return
    ready = simulators_ready_file(settings)
    ready.unlink(missing_ok=True)
    proc = process(settings, "simulators")
    proc.start(
        [sys.executable, "-m", "stack.simulators"],
        env=component_env(settings, "simulators"),
        cwd=REPO_ROOT,
    )
    proc.wait_ready(ready.exists, timeout, "the simulated devices to be ready", 0.5)


def simulators_ready_file(settings: StackSettings) -> Path:
    """Exists while every simulated device answers (written by stack.simulators)."""
    return settings.state_dir / "simulators" / "ready"


def start_api(
    settings: StackSettings,
    timeout: float = 60.0,
    name: str = "api",
    port: int | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Start the API (or, with `name` and `port`, another one beside it, `env` overriding its
    settings, e.g. a read policy) and return its URL once it answers."""
    port = settings.api_port if port is None else port
    url = f"http://{settings.host}:{port}"
    proc = process(settings, name)
    proc.start(
        [sys.executable, "-m", "api"],
        env={
            **component_env(settings, "api"),
            **kafka_broker.client_env(settings, "api"),
            "JOBSCOPE_API_PORT": str(port),
            **(env or {}),
        },
        cwd=REPO_ROOT,
        ports=[(settings.host, port)],
    )
    proc.wait_ready(
        lambda: http_ok(f"{url}/health"), timeout, f"the API on {url}", transient=STARTING
    )
    return url


# Stop order: readers and writers first, the broker last.
STOP_ORDER = ("api", "producers", "clickhouse", "kafka")


def stop_all(settings: StackSettings, drain_timeout: float = 15.0) -> list[str]:
    """Stop every process this state directory started (extra ones, e.g. a second producer,
    before ClickHouse and Kafka); return the names stopped. Once nothing produces, ClickHouse
    gets up to `drain_timeout` to consume what is left in the readings topic, so that a
    stopped stack holds every reading (and an upgrade that changes the message layout finds
    none of the old one in flight)."""
    known = {p.stem for p in settings.pid_dir.glob("*.pid")} if settings.pid_dir.exists() else set()
    brokers = sorted(name for name in known if name.startswith("kafka-"))  # nodes 2..N
    extra = sorted(known - set(STOP_ORDER) - set(brokers))
    stopped = []
    for name in ("api", *extra, "producers", "clickhouse"):
        proc = process(settings, name)
        if name == "clickhouse" and proc.is_running() and process(settings, "kafka").is_running():
            _drain_readings(settings, drain_timeout)
        if proc.is_running():
            proc.stop(timeout=30)
            stopped.append(name)
    # Kafka nodes together: the last one stopping alone would wait for a lost quorum.
    nodes = [name for name in ("kafka", *brokers) if process(settings, name).is_running()]
    with ThreadPoolExecutor(max(1, len(nodes))) as pool:
        list(pool.map(lambda name: process(settings, name).stop(timeout=30), nodes))
    return stopped + nodes


def _drain_readings(settings: StackSettings, timeout: float) -> None:
    migration = migration_settings(settings)

    def consumed() -> bool:
        lag = topics.consumer_lag(
            settings.kafka_bootstrap,
            migration.consumer_group,
            migration.readings_topic,
            security=kafka_broker.client_settings(settings).kafka_security(),
        )
        return lag == 0

    try:
        wait_until(
            consumed, timeout, "ClickHouse to consume the readings topic", transient=KAFKA_STARTING
        )
    except TimeoutError:
        log.warning(
            "stopping with readings not yet consumed after %.0f s: they stay in Kafka and are "
            "consumed at the next start",
            timeout,
        )
