"""`python -m stack up|down|status|superset|backup|restore|install|uninstall`: the embedded
default on one machine, and its service install (systemd units: stack/install.py)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from stack import backup, install, kafka_broker, oidc_provider, services, superset
from stack.config import StackSettings


def _start_oidc_provider(settings: StackSettings) -> None:
    oidc_provider.start(settings, oidc_provider.OidcProviderSettings())


def up(settings: StackSettings) -> None:
    began = time.monotonic()
    oidc = settings.auth == "oidc"
    steps = (
        ("Kafka broker", services.start_kafka),
        ("ClickHouse server + schema", services.start_clickhouse),
        *((("simulated devices", services.start_simulators),) if settings.simulators else ()),
        ("producers", services.start_producers),
        *((("OpenID Connect provider (Keycloak)", _start_oidc_provider),) if oidc else ()),
        ("API", services.start_api),
    )
    for label, start in steps:
        print(f"starting {label} ...", flush=True)
        start(settings)
    print(f"\njobscope is up ({time.monotonic() - began:.0f} s). State: {settings.state_dir}\n")
    status(settings)
    api = settings.api_url
    read = (
        f"curl -H \"Authorization: Bearer $TOKEN\" '{api}/api/jobs'"
        if oidc
        else f"curl '{api}/api/metrics?devices=node-1&metrics=tester_value_00'"
    )
    print(
        f"\nTry: {read}"
        f"\nJobs: POST {api}/api/jobs with the token JOBSCOPE_ADMIN_TOKEN (docs/jobs.md)"
        f"\nDocs: {settings.api_url}/docs    Stop: make down    Passwords and tokens: "
        f"{settings.state_dir / 'secrets.env'}"
    )
    if oidc:
        print(
            f"Log in: jobscope --api {settings.api_url} login   (as alice, bob, pia or sam: "
            "password JOBSCOPE_OIDC_DEMO_PASSWORD in secrets.env; docs/access.md)"
        )


def status(settings: StackSettings) -> bool:
    provider = oidc_provider.OidcProviderSettings()
    where = {
        "kafka": f"kafka://{settings.kafka_bootstrap} (topics readings, jobs, ondemand"
        + (f", {settings.json_topic}" if settings.json_topic else "")
        + ")"
        + (
            "; SASL/SCRAM, user admin: JOBSCOPE_KAFKA_ADMIN_PASSWORD"
            if kafka_broker.sasl(settings)
            else ""
        ),
        "clickhouse": f"{settings.clickhouse_url} (HTTP interface; users jobscope, reader: "
        "under the jobs read policy, only with JOBSCOPE_CLICKHOUSE_SQL_USERS=true)",
        "producers": f"polling {settings.devices_file.name} -> topic readings; "
        f"http://{settings.host}:{settings.producer_metrics_port}/metrics",
        "simulators": "snmpsim 127.0.0.1:11161, snmpd (v3) :11162, ipmi_sim :9001 (udp); "
        "node_exporter :11100, wattmetres :12001-12002, dcgm-exporter :11400 (tcp); "
        "Prometheus :11090 remote-writing node-3's GPU metrics to the API",
        "api": f"{settings.api_url} (REST; /docs, /health)",
        "superset": f"{superset.SupersetSettings().url} (dashboards, SQL Lab; make superset)",
        "oidc-provider": f"{provider.issuer} (OpenID Connect; "
        f"admin console {provider.url}/admin, user admin: "
        "JOBSCOPE_OIDC_ADMIN_PASSWORD)",
    }
    all_running = True
    names = list(reversed(services.STOP_ORDER))
    for node in kafka_broker.nodes(settings)[1:]:  # JOBSCOPE_KAFKA_BROKERS > 1
        where[node.name] = f"kafka://{settings.host}:{node.port} (KRaft node {node.node_id})"
        names.insert(names.index("clickhouse"), node.name)
    if settings.simulators or services.process(settings, "simulators").is_running():
        names.insert(names.index("producers"), "simulators")  # an extra process of the stack
    if settings.auth == "oidc" or oidc_provider.process(settings).is_running():
        names.insert(names.index("api"), "oidc-provider")
    if superset.process(settings).is_running():
        names.append("superset")
    for name in names:
        proc = services.process(settings, name)
        pid = proc.pid()
        all_running &= pid is not None
        state = f"pid {pid}" if pid else "stopped"
        print(f"  {name:<13} {state:<11} {where[name]}\n  {'':<13} {'':<11} log: {proc.log_file}")
    return all_running


def _backup_or_restore(
    settings: StackSettings, command: str, folder: Path, base: Path | None
) -> int:
    try:
        if command == "backup":
            manifest = backup.backup(settings, folder, base)
            print(
                f"backup in {folder} (schema {manifest['schema_migrations'][-1]}, "
                f"{'incremental over ' + str(base) if base else 'full'})"
            )
        else:
            for line in backup.restore(settings, folder):
                print(line)
            print(f"restored from {folder} into {settings.state_dir}: start it with make up")
    except Exception as exc:
        print(f"\n{command} failed: {exc}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m stack", description=__doc__)
    parser.add_argument(
        "command",
        choices=("up", "down", "status", "superset", "backup", "restore", "install", "uninstall"),
    )
    parser.add_argument("dir", nargs="?", type=Path, help="backup, restore: the backup's folder")
    parser.add_argument(
        "--incremental-from",
        type=Path,
        metavar="PREV",
        help="backup: only what changed since the backup in PREV (kept: a restore needs it)",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        help="install, uninstall: the file system root to write into (stack/install.py)",
    )
    parser.add_argument(
        "--with",
        dest="optional",
        type=lambda text: [part for part in text.split(",") if part],
        default=[],
        metavar="PARTS",
        help=f"install: also these units, comma-separated ({','.join(install.OPTIONAL_PARTS)})",
    )
    args = parser.parse_args()
    command = args.command
    if command in ("install", "uninstall"):
        return install.command(command, args.root, args.optional)
    if command in ("backup", "restore") and args.dir is None:
        parser.error(f"{command} needs the backup's folder")
    os.umask(0o077)  # what it writes in the state directory is private (docs/security.md)
    settings = StackSettings()
    if command == "up":
        try:
            up(settings)
        except Exception as exc:
            print(f"\nmake up failed: {exc}\nLogs are in {settings.log_dir}", file=sys.stderr)
            return 1
    elif command == "superset":
        try:
            superset.up(settings)
        except Exception as exc:
            print(f"\nmake superset failed: {exc}", file=sys.stderr)
            return 1
    elif command in ("backup", "restore"):
        return _backup_or_restore(settings, command, args.dir, args.incremental_from)
    elif command == "down":
        stopped = services.stop_all(settings)
        print(
            f"stopped: {', '.join(stopped) or 'nothing was running'} (data kept in "
            f"{settings.state_dir})"
        )
    else:
        return 0 if status(settings) else 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
