"""`python -m stack.clickhouse_server`: run the local ClickHouse server until SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from stack.clickhouse_server import engine_config
from stack.clickhouse_server.config import ServerSettings
from stack.clickhouse_server.engine import Engine
from stack.clickhouse_server.http_handler import ClickHouseHTTPServer
from stack.clickhouse_server.monitoring import HealthRecorder
from stack.clickhouse_server.users import profiles

SECRETS_FD_VAR = "JOBSCOPE_CLICKHOUSE_SECRETS_FD"


def load_settings() -> ServerSettings:
    """The settings from the environment, passwords included: when SECRETS_FD_VAR names a
    file descriptor (a pipe `python -m stack` writes `NAME=value` lines to), they are read
    from it, closed, and dropped again once read, so that they are never in this process's
    environment block (/proc/<pid>/environ) nor in that of anything it starts."""
    fd = os.environ.pop(SECRETS_FD_VAR, None)
    if fd is None:
        return ServerSettings()  # type: ignore[call-arg]  (required values come from the env)
    with os.fdopen(int(fd)) as pipe:
        lines = pipe.read().splitlines()
    given = dict(line.partition("=")[::2] for line in lines if "=" in line)
    os.environ.update(given)
    try:
        return ServerSettings()  # type: ignore[call-arg]
    finally:
        for name in given:
            os.environ.pop(name, None)


def main() -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
    )
    settings = load_settings()
    engine = Engine(
        settings.data_dir,
        engine_config.connection_string(settings),
        settings.pool_size,
        settings.max_session_connections,
        profiles(settings),
    )
    engine_config.redact(settings)  # the engine holds the Kafka password now; the disk not
    server = ClickHouseHTTPServer(settings, engine)

    def shutdown(signum: int, _frame: object) -> None:
        logging.info("signal %s: shutting down", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    logging.info(
        "ClickHouse engine %s on data %s; HTTP on %s:%s (%d connections)",
        "26.1",
        settings.data_dir,
        settings.host,
        settings.port,
        settings.pool_size,
    )
    recorder = HealthRecorder(server.metrics, engine, settings.health_record_interval_s)
    recorder.start()
    try:
        server.serve_forever()
    finally:
        recorder.stop()
        server.server_close()
        engine.close()
        logging.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
