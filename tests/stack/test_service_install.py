"""The service install (`python -m stack install`, stack/install.py).

PID 1 here is not systemd, so no unit can run under systemd: the units are checked with
`systemd-analyze verify`, and their command lines run under this test's supervision as
systemd runs them: in the order of their After= dependencies, each with its
EnvironmentFile= and StandardInput=file:, ExecStartPost= once ExecStart= runs, ExecStop=
before SIGTERM, stopping in the reverse order, within TimeoutStopSec. Not exercised here:
User= (tests never create accounts: every process runs as the test's user) and the sandbox
settings (NoNewPrivileges=, ProtectSystem=, ...), which only systemd applies.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from confluent_kafka import Producer

from clickhouse.migrate import MigrationSettings
from connectors import services as connect_services
from connectors.config import ConnectSettings
from connectors.worker import REST_USER
from kafka import topics
from kafka.message import pack
from kafka.reading import Reading
from kafka.security import KafkaClientSettings
from stack import install, kafka_broker, secrets, service, superset
from stack.config import REPO_ROOT, cache_home
from stack.processes import port_in_use, wait_until
from stack.transient import KAFKA_STARTING, STARTING
from tests import ports
from tests.schedules import assert_unbroken

PERIOD_MS = 200
SHARED_PORTS = "lifecycle"  # the block of 100 is full: the lifecycle test's, never at once
DEVICE = "svc-1"
BURST_DEVICE = "svc-burst"
BURST_MESSAGES = 100
BURST_READINGS = 500
FLUSH_INTERVAL_MS = 10_000
"""The readings table's Kafka engine of these units writes a block this long after its first
message at most: ClickHouse still holds the burst when its stop begins, so the drain waits."""

PRODUCING = {"jobscope-producers.service", "jobscope-api.service"}
"""Not needed by Superset and Connect: their test leaves them out."""

pytestmark = pytest.mark.slow


def install_env(devices: Path | None = None, **extra: str) -> dict[str, str]:
    """The installer's environment: this session's ports, none of the caller's settings."""
    kafka, controller, clickhouse, api, metrics = ports.ports(SHARED_PORTS)
    env = {n: v for n, v in os.environ.items() if not n.startswith("JOBSCOPE_")}
    return {
        **env,
        "JOBSCOPE_KAFKA_PORT": str(kafka),
        "JOBSCOPE_KAFKA_CONTROLLER_PORT": str(controller),
        "JOBSCOPE_KAFKA_HEAP": "512m",
        "JOBSCOPE_CLICKHOUSE_PORT": str(clickhouse),
        "JOBSCOPE_API_PORT": str(api),
        "JOBSCOPE_PRODUCER_METRICS_PORT": str(metrics),
        **({"JOBSCOPE_DEVICES_FILE": str(devices)} if devices else {}),
        **extra,
    }


def run_install(root: Path, env: dict[str, str], command: str = "install", *args: str) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "stack", command, "--root", str(root), *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


def parse_unit(path: Path) -> dict[str, list[str]]:
    """`Section.Key` -> its values in order (a key may repeat, as EnvironmentFile=)."""
    keys: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        keys.setdefault(f"{section}.{key}", []).append(value)
    return keys


def start_order(units: dict[str, dict[str, list[str]]]) -> list[str]:
    """The units in an order that honours every After= between them."""
    after = {
        name: {u for line in unit.get("Unit.After", []) for u in line.split() if u in units}
        for name, unit in units.items()
    }
    order: list[str] = []
    while len(order) < len(units):
        ready = sorted(n for n in units if n not in order and after[n] <= set(order))
        assert ready, f"a cycle among After= of {sorted(set(units) - set(order))}"
        order.append(ready[0])
    return order


class Supervisor:
    """Runs the units' commands as systemd would, keeping each main process' output in a
    file (the journal's stand-in)."""

    def __init__(self, units: dict[str, dict[str, list[str]]], logs: Path) -> None:
        self.units = units
        self.logs = logs
        self.main: dict[str, subprocess.Popen[bytes]] = {}

    def env(self, name: str) -> dict[str, str]:
        base = {n: os.environ[n] for n in ("PATH", "JDK_JAVA_OPTIONS") if n in os.environ}
        for path in self.units[name].get("Service.EnvironmentFile", []):
            base |= install.read_env_file(Path(path.removeprefix("-")))
        return base

    def stdin(self, name: str) -> IO[bytes] | int:
        given = self.units[name].get("Service.StandardInput", ["null"])[0]
        if given.startswith("file:"):
            return open(given.removeprefix("file:"), "rb")  # the caller closes it
        return subprocess.DEVNULL

    def argv(self, line: str) -> list[str]:
        # no prefix (-, +, @, !) and no $VAR or %specifier: the line runs as written
        assert line[0] not in "-+@!:" and "$" not in line and "%" not in line, line
        return shlex.split(line)

    def run(self, name: str, key: str) -> None:
        unit = self.units[name]
        timeout = float(unit.get("Service.TimeoutStartSec", ["90"])[0])
        for line in unit.get(f"Service.{key}", []):
            stdin = self.stdin(name)
            try:
                done = subprocess.run(
                    self.argv(line),
                    env=self.env(name),
                    stdin=stdin,
                    cwd=unit["Service.WorkingDirectory"][0],
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
            finally:
                if not isinstance(stdin, int):
                    stdin.close()
            assert done.returncode == 0, f"{name} {key}={line}:\n{done.stdout}{done.stderr}"

    def start(self, name: str) -> None:
        unit = self.units[name]
        stdin = self.stdin(name)
        with open(self.logs / f"{name}.log", "ab") as log:
            self.main[name] = subprocess.Popen(
                self.argv(unit["Service.ExecStart"][0]),
                env=self.env(name),
                stdin=stdin,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=unit["Service.WorkingDirectory"][0],
                start_new_session=True,
            )
        if not isinstance(stdin, int):
            stdin.close()
        self.run(name, "ExecStartPost")
        assert self.main[name].poll() is None, f"{name} exited: {self.log(name)[-3000:]}"

    def stop(self, name: str, after_exec_stop: Callable[[], None] | None = None) -> None:
        unit = self.units[name]
        proc = self.main[name]  # until it stopped: kill_all kills it after a failed check
        self.run(name, "ExecStop")
        if after_exec_stop:
            after_exec_stop()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(float(unit.get("Service.TimeoutStopSec", ["90"])[0]))
        del self.main[name]
        # systemd's clean exits: 0, death by SIGHUP, SIGINT, SIGTERM or SIGPIPE, and the unit's own
        clean = {0, -signal.SIGHUP, -signal.SIGINT, -signal.SIGTERM, -signal.SIGPIPE}
        ok = clean | {
            int(s) for line in unit.get("Service.SuccessExitStatus", []) for s in line.split()
        }
        assert proc.returncode in ok, f"{name} exited {proc.returncode}: {self.log(name)[-3000:]}"

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def kill_all(self) -> None:
        for proc in self.main.values():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("root")
    devices = root.parent / "devices.yaml"
    devices.write_text(
        f"- {{name: svc_value, device_id: {DEVICE}, url: 'tester://?metrics=1', "
        f"update_every: {PERIOD_MS}}}\n"
    )
    # a component's setting in the file an operator edits (kept by the install)
    config = root / "etc" / "jobscope" / "jobscope.env"
    config.parent.mkdir(parents=True)
    config.write_text(f"JOBSCOPE_KAFKA_FLUSH_INTERVAL_MS={FLUSH_INTERVAL_MS}\n")
    done = run_install(root, install_env(devices))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "would run: useradd" in done.stdout  # not this machine's root: no account made
    return root


def units_of(root: Path) -> dict[str, dict[str, list[str]]]:
    unit_dir = root / "etc" / "systemd" / "system"
    return {p.name: parse_unit(p) for p in sorted(unit_dir.glob("jobscope-*.service"))}


def verify(root: Path, count: int) -> dict[str, dict[str, list[str]]]:
    """`systemd-analyze verify` on the units installed under `root`, and what every unit
    shares: restart on failure, the journal, its own account, part of jobscope.target."""
    unit_dir = root / "etc" / "systemd" / "system"
    files = sorted(map(str, unit_dir.glob("jobscope*")))
    assert len(files) == count, files
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *files],
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{unit_dir}:"},  # ours first, then the system's
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and not done.stdout + done.stderr, done.stdout + done.stderr
    units = units_of(root)
    for name, unit in units.items():
        assert unit["Service.Restart"] == ["on-failure"], name
        assert unit["Service.StandardOutput"] == ["journal"], name
        assert unit["Service.User"][0].startswith("jobscope-"), name
        assert unit["Service.NoNewPrivileges"] == ["yes"], name
        assert unit["Unit.PartOf"] == ["jobscope.target"], name
    accounts = [unit["Service.User"][0] for unit in units.values()]
    assert len(set(accounts)) == len(accounts), accounts
    return units


def test_units_verify(installed: Path) -> None:
    units = verify(installed, 5)
    order = start_order(units)
    assert order.index("jobscope-api.service") > order.index("jobscope-clickhouse.service")
    assert order.index("jobscope-producers.service") > order.index("jobscope-kafka.service")
    assert units["jobscope-clickhouse.service"]["Service.ExecStop"], "ClickHouse is not drained"


def test_each_unit_holds_only_its_secrets(installed: Path) -> None:
    etc = installed / "etc" / "jobscope"
    config = (etc / "jobscope.env").read_text()
    every = secrets.load_or_create(installed / "var" / "lib" / "jobscope")
    assert not [n for n, v in every.items() if v in config], "a secret in jobscope.env"
    units = units_of(installed)
    held: dict[str, set[str]] = {}
    for part in install.PARTS:
        path = etc / "secrets" / f"{part}.env"
        assert path.stat().st_mode & 0o777 == 0o600 and path.stat().st_uid == os.geteuid()
        values = set(install.read_env_file(path).values())
        held[part] = {n for n, v in every.items() if v in values}
        unit = units[install.unit_name(part)]
        if part == "clickhouse":  # on standard input only, never in its environment
            assert unit["Service.StandardInput"] == [f"file:{path}"]
            assert unit["Service.EnvironmentFile"] == [str(etc / "jobscope.env")]
        else:
            assert str(path) in unit["Service.EnvironmentFile"]
    assert held["clickhouse"] == {
        *secrets.OWNERS["clickhouse"],
        "JOBSCOPE_KAFKA_CLICKHOUSE_PASSWORD",
    }
    assert held["api"] == set(secrets.OWNERS["api"])
    assert held["producers"] == set(secrets.OWNERS["producers"])
    assert held["kafka"] == {"JOBSCOPE_KAFKA_ADMIN_PASSWORD"}


def test_bad_setting_refuses_to_install(tmp_path: Path) -> None:
    done = run_install(tmp_path, install_env(JOBSCOPE_RETENTION_DAYS="0"))
    assert done.returncode == 2 and "JOBSCOPE_RETENTION_DAYS" in done.stderr, done.stderr
    assert not (tmp_path / "etc").exists()
    # a component's setting, in the file an operator edits
    config = tmp_path / "etc" / "jobscope" / "jobscope.env"
    config.parent.mkdir(parents=True)
    config.write_text("JOBSCOPE_READ_POLICY=everyone\n")
    done = run_install(tmp_path, install_env())
    assert done.returncode == 2 and "JOBSCOPE_READ_POLICY" in done.stderr, done.stderr
    assert not (tmp_path / "etc" / "systemd").exists()
    assert config.read_text() == "JOBSCOPE_READ_POLICY=everyone\n"
    # Connect's service with `make connect`'s demo OAR database; a part there is no unit of
    config.write_text("")
    done = run_install(tmp_path, install_env(), "install", "--with", "connect")
    assert done.returncode == 2 and "JOBSCOPE_CONNECT_LOCAL_OAR_DB" in done.stderr, done.stderr
    # the site's OAR database, without its password: connectors that could never log in
    config.write_text("JOBSCOPE_CONNECT_LOCAL_OAR_DB=false\n")
    done = run_install(tmp_path, install_env(), "install", "--with", "connect")
    assert done.returncode == 2 and "registers oar-jobs" in done.stderr, done.stderr
    assert "JOBSCOPE_CONNECT_OAR_DB_PASSWORD" in done.stderr, done.stderr
    done = run_install(tmp_path, install_env(), "install", "--with", "grafana")
    assert done.returncode == 2 and "--with grafana" in done.stderr, done.stderr
    assert not (tmp_path / "etc" / "systemd").exists()


def test_missing_secret_refuses_to_install(tmp_path: Path) -> None:
    """A part's secret missing from the state directory's stops the install, naming it; only
    the OAR database's password may be absent (Connect without connectors needs none)."""
    settings = ports.stack_settings(SHARED_PORTS).model_copy(update={"state_dir": tmp_path})
    every = secrets.load_or_create(tmp_path)
    held = install.part_secrets(settings, "connect", every)
    assert install.OAR_DB_PASSWORD not in held
    for part, name in (
        ("api", secrets.OWNERS["api"][0]),
        ("superset", superset.ADMIN_PASSWORD),
        ("connect", secrets.OWNERS["connect"][0]),
    ):
        values = {n: v for n, v in every.items() if n != name}
        with pytest.raises(install.InstallError, match=f"{name} of the {part} part"):
            install.part_secrets(settings, part, values)


def test_target_describes_the_parts_installed() -> None:
    def description(parts: tuple[str, ...]) -> str:
        return install.render_target(parts).split("Description=")[1].splitlines()[0]

    assert "Superset" not in description(install.PARTS), description(install.PARTS)
    every = description((*install.PARTS, *install.OPTIONAL_PARTS))
    assert every.endswith(
        "(Kafka broker, ClickHouse server, producers, REST API, Superset, Kafka Connect)"
    ), every


def test_connect_unit_folder_is_the_workers() -> None:
    """stack/ may not import connectors/ (tests/test_architecture.py): the install's folder
    for the Connect unit (its jars, plugins, properties, secrets) is the worker's own."""
    settings = ports.stack_settings(SHARED_PORTS)
    worker = connect_services.worker(settings, ConnectSettings(), KafkaClientSettings(), "")
    assert worker.home == service.connect_home(settings)
    assert worker.plugin_path == service.connect_home(settings) / "plugins"


def publish_burst(kafka: KafkaClientSettings) -> None:
    """Readings of BURST_DEVICE written straight to the readings topic, as producers'
    messages in flight when the stop began: ClickHouse's ExecStop must wait for them."""
    producer = Producer({**kafka.kafka_client(), "linger.ms": 50})
    start = int(datetime.now(UTC).timestamp() * 1e6) - 10_000_000
    for m in range(BURST_MESSAGES):
        stamp = start + m * BURST_READINGS
        batch = [
            Reading(stamp + i, BURST_DEVICE, "burst_value", float(i)) for i in range(BURST_READINGS)
        ]
        producer.produce(topics.READINGS.name, pack(batch).payload, key=BURST_DEVICE)
    assert producer.flush(30) == 0


def stamps_us(api_url: str, device: str = DEVICE) -> list[int]:
    now = datetime.now(UTC).replace(tzinfo=None)
    window = {"start_time": (now - timedelta(hours=1)).isoformat(), "end_time": now.isoformat()}
    response = httpx.get(f"{api_url}/api/metrics", timeout=60, params={"devices": device, **window})
    assert response.status_code == 200, response.text
    return [
        int(datetime.fromisoformat(r["timestamp"]).replace(tzinfo=UTC).timestamp() * 1e6)
        for r in response.json()
    ]


def healthy(api_url: str) -> bool:
    return httpx.get(f"{api_url}/health", timeout=10).status_code == 200


@pytest.fixture
def supervised(installed: Path, tmp_path: Path) -> Iterator[Supervisor]:
    supervisor = Supervisor(units_of(installed), tmp_path)
    try:
        yield supervisor
    finally:
        supervisor.kill_all()


def test_stop_all_start_all_loses_no_reading(installed: Path, supervised: Supervisor) -> None:
    settings = ports.stack_settings(SHARED_PORTS)
    api_url = settings.api_url
    order = start_order(supervised.units)
    every = secrets.load_or_create(installed / "var" / "lib" / "jobscope")
    admin = KafkaClientSettings(
        kafka_bootstrap=settings.kafka_bootstrap,
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism=kafka_broker.MECHANISM,
        kafka_sasl_username="admin",
        kafka_sasl_password=every["JOBSCOPE_KAFKA_ADMIN_PASSWORD"],
    )
    schema = MigrationSettings.model_fields

    def burst_stored() -> int:
        """The burst's readings in ClickHouse, asked directly (the API stops before it)."""
        response = httpx.post(
            settings.clickhouse_url,
            content=f"SELECT count() FROM metrics FINAL WHERE device_id = '{BURST_DEVICE}'",
            headers={
                "X-ClickHouse-User": schema["clickhouse_admin_user"].default,
                "X-ClickHouse-Key": every["JOBSCOPE_CLICKHOUSE_ADMIN_PASSWORD"],
            },
            timeout=60,
        )
        assert response.status_code == 200, response.text
        return int(response.text)

    expected_burst = 0

    def drained() -> None:
        """Right after ClickHouse's ExecStop, before its SIGTERM: every reading the topic
        held is stored, none left for the next start."""
        lag = topics.consumer_lag(
            settings.kafka_bootstrap,
            schema["consumer_group"].default,
            schema["readings_topic"].default,
            security=admin.kafka_security(),
        )
        assert lag == 0, f"ClickHouse stops with {lag} readings not consumed"
        assert burst_stored() == expected_burst, "ClickHouse stops with readings not stored"

    def start_all() -> None:
        for name in order:
            supervised.start(name)
        wait_until(lambda: healthy(api_url), 60, "the API's /health", transient=STARTING)

    def stop_all() -> float:
        nonlocal expected_burst
        stopped_producing = 0.0
        for name in reversed(order):
            if name == "jobscope-producers.service":
                stopped_producing = datetime.now(UTC).timestamp()
            if name == "jobscope-clickhouse.service":  # something left for the drain to do
                expected_burst = burst_stored() + BURST_MESSAGES * BURST_READINGS
                publish_burst(admin)
                # else the check after the drain would pass without one (FLUSH_INTERVAL_MS)
                assert burst_stored() < expected_burst, "the burst was stored before the stop"
            hook = drained if name == "jobscope-clickhouse.service" else None
            supervised.stop(name, hook)
        return stopped_producing

    start_all()
    before = wait_until(lambda: len(s := stamps_us(api_url)) >= 20 and s, 90, "readings")
    stopped_at = stop_all()
    listening = ports.ports(SHARED_PORTS)
    assert not any(port_in_use(settings.host, p) for p in listening)

    start_all()
    after = wait_until(
        lambda: [s for s in stamps_us(api_url) if s < stopped_at * 1e6 + 1e6] or None,
        60,
        "the readings of the first run",
        transient=KAFKA_STARTING,
    )
    assert set(before) <= set(after)
    producers_log = supervised.log("jobscope-producers.service")
    ticks = assert_unbroken(after, PERIOD_MS * 1000, producers_log, "svc_value")
    # the last readings polled before the stop (in flight then) are there too
    assert ticks[-1] * PERIOD_MS / 1000 >= stopped_at - 2.0, (ticks[-1], stopped_at)
    wait_until(lambda: max(stamps_us(api_url)) > stopped_at * 1e6, 30, "new readings")
    assert len(stamps_us(api_url, BURST_DEVICE)) == BURST_MESSAGES * BURST_READINGS
    stop_all()

    removed = run_install(installed, install_env(), "uninstall")
    assert removed.returncode == 0, removed.stderr
    assert not list((installed / "etc" / "systemd" / "system").glob("jobscope*"))
    assert (installed / "etc" / "jobscope" / "jobscope.env").exists()
    assert (installed / "var" / "lib" / "jobscope" / "clickhouse").exists()


def held_in_environ(supervisor: Supervisor, unit: str, held: Mapping[str, str]) -> set[str]:
    """The names of `held` whose name or value the unit's main process has in its environment
    (the exec'd server's, as a local process of its account reads it)."""
    pid = supervisor.main[unit].pid
    environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    pairs = dict(line.partition("=")[::2] for line in environ if line)
    return {n for n, v in held.items() if n in pairs or v in pairs.values()}


def test_superset_and_connect_units(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """`--with superset,connect`: their units verify, each holds only its own secrets, starts
    after what it needs, and its ExecStart serves (Superset's /health, Connect's REST root)
    once Kafka's and ClickHouse's units run. No OAR database here: no connector is registered
    (tests/connectors/ runs them against a real one)."""
    root = tmp_path_factory.mktemp("root-optional")
    superset_port, connect_port = ports.ports("service-optional")
    config = root / "etc" / "jobscope" / "jobscope.env"
    config.parent.mkdir(parents=True)
    config.write_text(
        f"JOBSCOPE_SUPERSET_PORT={superset_port}\n"
        # the metadata database initialised once per Superset version, as tests/superset/ use
        f"JOBSCOPE_SUPERSET_CACHE_DIR={cache_home()}\n"
        f"JOBSCOPE_CONNECT_REST_PORT={connect_port}\n"
        "JOBSCOPE_CONNECT_CONNECTORS=[]\n"
        "JOBSCOPE_CONNECT_LOCAL_OAR_DB=false\n"
    )
    # the OAR database's password kept for the Connect unit, though no connector uses it here
    oar = install_env(JOBSCOPE_CONNECT_OAR_DB_PASSWORD="oar-db-secret")
    done = run_install(root, oar, "install", "--with", "superset,connect")
    assert done.returncode == 0, done.stdout + done.stderr
    units = verify(root, 7)
    after = {name: " ".join(unit["Unit.After"]) for name, unit in units.items()}
    assert "jobscope-clickhouse.service" in after["jobscope-superset.service"]
    assert "jobscope-kafka.service" in after["jobscope-connect.service"]
    target = parse_unit(root / "etc" / "systemd" / "system" / "jobscope.target")
    assert {"jobscope-superset.service", "jobscope-connect.service"} <= set(
        target["Unit.Wants"][0].split()
    )
    every = secrets.load_or_create(root / "var" / "lib" / "jobscope")
    etc = root / "etc" / "jobscope" / "secrets"
    held = {
        part: {
            n for n, v in every.items() if v in install.read_env_file(etc / f"{part}.env").values()
        }
        for part in install.OPTIONAL_PARTS
    }
    assert held["superset"] == {*secrets.OWNERS["superset"], "JOBSCOPE_SUPERSET_ADMIN_PASSWORD"}
    assert held["connect"] == {"JOBSCOPE_KAFKA_CONNECT_PASSWORD", *secrets.OWNERS["connect"]}
    # installing again without --with keeps them
    assert install.installed_parts(install.Layout(root), ()) == (
        *install.PARTS,
        *install.OPTIONAL_PARTS,
    )

    settings = ports.stack_settings(SHARED_PORTS)
    supervisor = Supervisor(units, tmp_path)
    order = [n for n in start_order(units) if n not in PRODUCING]
    try:
        for name in order:
            supervisor.start(name)
        health = httpx.get(f"http://{settings.host}:{superset_port}/health", timeout=10)
        assert health.status_code == 200 and health.text == "OK", health.text
        # Connect's REST API answers its user only, with the password the unit holds
        connect = install.read_env_file(etc / "connect.env")
        connect_root = f"http://{settings.host}:{connect_port}/"
        assert httpx.get(connect_root, timeout=10).status_code == 401
        auth = (REST_USER, connect[connect_services.REST_PASSWORD])
        rest = httpx.get(connect_root, auth=auth, timeout=10)
        assert rest.status_code == 200 and "version" in rest.json(), rest.text
        # the secrets only the steps before the exec needed are not in the servers' environment
        admin = {superset.ADMIN_PASSWORD: every[superset.ADMIN_PASSWORD]}
        assert not held_in_environ(supervisor, "jobscope-superset.service", admin)
        assert install.OAR_DB_PASSWORD in connect and len(connect) == 3, connect.keys()
        assert not held_in_environ(supervisor, "jobscope-connect.service", connect)
        for name in reversed(order):
            supervisor.stop(name)
    finally:
        supervisor.kill_all()
    assert not any(port_in_use(settings.host, p) for p in (superset_port, connect_port))
