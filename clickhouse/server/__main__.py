"""`python -m clickhouse.server`: run the local ClickHouse server until SIGTERM."""

from __future__ import annotations

import logging
import signal
import sys
import threading

from clickhouse.server import engine_config
from clickhouse.server.config import ServerSettings
from clickhouse.server.engine import Engine
from clickhouse.server.http_handler import ClickHouseHTTPServer


def main() -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
    )
    settings = ServerSettings()  # type: ignore[call-arg]  (required values come from the env)
    engine = Engine(
        settings.data_dir,
        engine_config.connection_string(settings),
        settings.pool_size,
        settings.max_session_connections,
        settings.sql_connections,
    )
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
    try:
        server.serve_forever()
    finally:
        server.server_close()
        engine.close()
        logging.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
