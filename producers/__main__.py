"""`python -m producers [--devices FILE]`: poll the devices of FILE and publish their readings.

Settings come from `JOBSCOPE_*` environment variables (see producers/README.md); logs go to
stdout. Exit status: 0 after a clean shutdown, 1 if messages were left undelivered or the
Kafka client failed for good, 2 for invalid settings or an invalid devices file.
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

log = logging.getLogger("producers")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m producers", description=__doc__)
    parser.add_argument(
        "--devices",
        type=Path,
        metavar="FILE",
        help="YAML list of device entries (default: $JOBSCOPE_DEVICES_FILE)",
    )
    args = parser.parse_args(argv)
    try:
        settings = ProducerSettings()
    except ValidationError as exc:
        print(f"invalid JOBSCOPE_* settings: {validation_message(exc)}", file=sys.stderr)
        return 2
    if args.devices is not None:
        settings = settings.model_copy(update={"devices_file": args.devices})
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
    return asyncio.run(run_producers(settings, entries))


if __name__ == "__main__":
    sys.exit(main())
