"""`python -m connectors.service <step>`: what the service install's Connect unit runs
(jobscope-connect.service, written by stack/install.py with `--with connect`), as
stack/service.py's steps for the other units: in the part's environment, from the settings
file and the unit's own secrets (its Kafka password; its REST API's; the OAR database's).

Steps: `check` (the install validates the unit's settings with it), `jars` (the install
copies the worker's classpath and its plugins into its folder, which its account reads),
`connect` (the worker, in the foreground: the unit's main process), `connect-ready`
(ExecStartPost: its REST API answers, then the configured connectors are registered).
"""

from __future__ import annotations

import os
import shutil
import sys

from pydantic import ValidationError

from connectors import maven
from connectors import services as connect_services
from connectors.config import ConnectSettings
from connectors.worker import CONNECTORS_DIR, JAR_CACHE, PLUGINS, Worker
from kafka.security import KafkaClientSettings
from stack import install, service
from stack.config import StackSettings
from stack.processes import wait_until
from stack.transient import STARTING

UNIT_SECRETS = (
    install.OAR_DB_PASSWORD,
    "JOBSCOPE_KAFKA_SASL_PASSWORD",
    connect_services.REST_PASSWORD,
)
"""The unit's secrets (its EnvironmentFile): the worker reads them from secrets.properties
(Worker.store_secrets) and its REST credentials file, written before the exec, so its JVM's
environment holds none."""


def connect_worker(settings: StackSettings, connect: ConnectSettings) -> Worker:
    """The stack's worker (connectors/services.py), its Kafka and REST passwords the unit's."""
    kafka = KafkaClientSettings(**service.kafka_client_values(settings, os.environ))
    rest_password = os.environ[connect_services.REST_PASSWORD]
    return connect_services.worker(settings, connect, kafka, rest_password)


def check(settings: StackSettings) -> None:
    """Exit 2, saying what to set, when the unit's settings are not a service's: its
    connectors read the site's OAR database, never `make connect`'s demo one."""
    try:
        connect = ConnectSettings()
    except ValidationError as exc:
        print(f"its settings: {exc}", file=sys.stderr)
        sys.exit(2)
    if connect.connectors and connect.local_oar_db:
        print(
            "Connect's service reads the site's OAR database, not `make connect`'s demo one: "
            "set JOBSCOPE_CONNECT_LOCAL_OAR_DB=false and JOBSCOPE_CONNECT_OAR_DB_HOST (and "
            "_PORT, _NAME, _USER) in the settings file, and give its password as "
            "JOBSCOPE_CONNECT_OAR_DB_PASSWORD to the installer",
            file=sys.stderr,
        )
        sys.exit(2)
    if connect.connectors and not connect.oar_db_password.get_secret_value():
        print(
            f"Connect's service registers {', '.join(connect.connectors)}, which read the site's "
            "OAR database: give the password of JOBSCOPE_CONNECT_OAR_DB_USER as "
            "JOBSCOPE_CONNECT_OAR_DB_PASSWORD to the installer (or set "
            "JOBSCOPE_CONNECT_CONNECTORS=[] for a worker without connectors)",
            file=sys.stderr,
        )
        sys.exit(2)


def copy_jars(settings: StackSettings) -> None:
    """The worker's classpath and its plugins' jars (Connect's plugin path, Worker.plugin_path),
    from the Maven cache into its folder: its account reads nothing of the installer's."""
    lib = service.connect_jars(settings)
    plugins = service.connect_home(settings) / "plugins"
    for folder in (lib, plugins):
        shutil.rmtree(folder, ignore_errors=True)  # a release's jars replace the last one's
        folder.mkdir(mode=0o700, parents=True)
    for jar in maven.classpath(CONNECTORS_DIR / "pom.xml", JAR_CACHE).split(os.pathsep):
        shutil.copy2(jar, lib)
    for plugin in PLUGINS:
        jars = maven.copy_jars(CONNECTORS_DIR / "plugins" / plugin / "pom.xml", JAR_CACHE)
        shutil.copytree(jars, plugins / plugin)


def run_connect(settings: StackSettings) -> None:
    """The worker on the jars the install copied: its properties rendered, then exec."""
    worker = connect_worker(settings, ConnectSettings())
    config = worker.render_config()
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java is not on the PATH (Debian package default-jre-headless)")
    argv = worker.command(java, f"{service.connect_jars(settings)}/*", config)
    service.exec_step(argv, {}, drop=UNIT_SECRETS)


def connect_ready(settings: StackSettings) -> None:
    """Wait for the worker's REST API, then register the configured connectors (their
    secrets from the unit's, kept in the worker's secrets file) and wait until they run."""
    connect = ConnectSettings()
    worker = connect_worker(settings, connect)
    wait_until(worker.is_ready, service.READY_TIMEOUT_S, f"Kafka Connect {worker.url}", 1, STARTING)
    connect_services.register_all(worker, connect)


STEPS = {
    "check": ("connect", check),
    "jars": ("connect", copy_jars),
    "connect": ("connect", run_connect),
    "connect-ready": ("connect", connect_ready),
}


if __name__ == "__main__":
    sys.exit(service.main(STEPS, "python -m connectors.service"))
