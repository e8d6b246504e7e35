"""`python -m producers [--devices FILE] [--shard i/N]`: poll the devices of FILE (those of
shard i of N) and publish their readings.

Settings come from `JOBSCOPE_*` environment variables (see producers/README.md); logs go to
stdout. Exit status: 0 after a clean shutdown (messages not delivered by then are kept in
the disk spool for the next start), 1 if messages found no room in the spool or the Kafka
client failed for good, 2 for invalid settings, an invalid devices file or an unusable spool.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from producers.config import ConfigError, ProducerSettings, load_devices
from producers.plugins.base import validation_message
from producers.runtime import run_producers
from producers.spool import SpoolError

log = logging.getLogger("producers")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m producers", description=__doc__)
    parser.add_argument(
        "--devices",
        type=Path,
        metavar="FILE",
        help="YAML list of device entries (default: $JOBSCOPE_DEVICES_FILE)",
    )
    parser.add_argument(
        "--shard",
        metavar="i/N",
        help="poll only the devices shard i of N owns (default: $JOBSCOPE_SHARD or 0/1)",
    )
    args = parser.parse_args(argv)
    given = {"devices_file": args.devices, "shard": args.shard}
    try:
        settings = ProducerSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        print(f"invalid settings: {validation_message(exc)}", file=sys.stderr)
        return 2
    logging.basicConfig(
        stream=sys.stdout,
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        entries = load_devices(settings.devices_file)
    except (ConfigError, OSError) as exc:
        log.error("cannot use the devices file:\n%s", exc)
        return 2
    try:
        return asyncio.run(run_producers(settings, entries))
    except SpoolError as exc:
        log.error("cannot use the spool: %s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
